"""The one-launch greedy tail (argmax + greedy verification packing) vs torch, interpreted on CPU."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import importlib

import pytest
import torch

pytest.importorskip("triton")

from specserve.layers import triton_argmax as tam  # noqa: E402
from specserve.spec.rejection import greedy_verify  # noqa: E402

if type(tam._greedy_tail_kernel).__name__ != "InterpretedFunction":
    tam = importlib.reload(tam)


@pytest.mark.parametrize("programs", ["", "1"])  # default: one program per 4096-entry chunk; 1: one per row
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("v", [7, 4096, 9000])  # below one chunk, exactly one, a ragged last chunk
def test_argmax_rows_matches_torch(dtype: torch.dtype, v: int, programs: str, monkeypatch) -> None:
    monkeypatch.setenv(tam.PROGRAMS_ENV, programs)
    g = torch.Generator().manual_seed(v)
    x = torch.randn(5, v, generator=g).to(dtype)
    x[1] = -3.0
    x[1, v // 2] = x[1, v - 1] = 2.0  # a tie: the first index wins
    x[2, :] = float("-inf")  # nothing finite: index 0
    x[3, v - 1] = float("nan")  # NaN wins, as in torch
    x[3, 0] = float("inf")
    x[4, v - 1] = 50.0  # the maximum in the last (ragged) chunk
    got = tam.argmax_rows(x)
    assert got.dtype == torch.int64
    assert got.tolist() == x.argmax(-1).tolist()


def test_argmax_rows_programs_split_the_vocabulary(monkeypatch) -> None:
    """Two programs a row taking every other 4096-entry chunk: a tie between program 1's chunk (index 5000) and a
    later chunk of program 0 (index 9000) goes to the first index; NaN and -inf rows as torch; counters reset."""
    monkeypatch.setenv(tam.PROGRAMS_ENV, "2")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 20000, generator=g)
    x[0, 5000] = x[0, 9000] = 9.0
    x[1, 19999] = 9.0  # the last, ragged chunk (program 0's)
    x[2, :] = float("-inf")
    x[3, 12000] = float("nan")
    assert tam._programs(20000, 4096) == 2
    for _ in range(2):
        assert tam.argmax_rows(x).tolist() == x.argmax(-1).tolist() == [5000, 19999, 0, 12000]
        assert torch.count_nonzero(tam._merge_counters(x.device, 4)) == 0
    monkeypatch.setenv(tam.PROGRAMS_ENV, "0")
    with pytest.raises(ValueError, match=tam.PROGRAMS_ENV):
        tam.argmax_rows(x)
    monkeypatch.delenv(tam.PROGRAMS_ENV)
    assert tam._programs(151936, 4096) == 38 and tam._programs(10**6, 4096) == 64 and tam._programs(7, 8) == 1


def test_argmax_rows_strided_rows_and_bad_input() -> None:
    x = torch.randn(3, 2 * 600)
    view = x[:, :600]  # rows strided by 1200
    assert tam.argmax_rows(view).tolist() == view.argmax(-1).tolist()
    with pytest.raises(ValueError, match="contiguous"):
        tam.argmax_rows(x.t())


@pytest.mark.parametrize("programs", ["", "1"])  # 5000 entries: two programs a row by default, or one
@pytest.mark.parametrize("q", [1, 2, 5, 16])
def test_greedy_verify_matches_torch_and_resets_counters(q: int, programs: str, monkeypatch) -> None:
    """Drafts that match the target's argmax for a random prefix length per request (0 .. q-1, all), with
    logits in bf16 (what the graphs pass): packed == greedy_verify's, and the arrival counters are back at 0."""
    monkeypatch.setenv(tam.PROGRAMS_ENV, programs)
    g = torch.Generator().manual_seed(q)
    b, v = 4, 5000
    logits = torch.randn(b * q, v, generator=g).to(torch.bfloat16)
    am = logits.argmax(-1).view(b, q)
    ids = torch.randint(0, v, (b, q), generator=g)
    for j in range(b):
        keep = (j * 7 + q) % q  # leading drafts equal to the previous row's argmax
        if j == b - 1:
            keep = q - 1  # every draft accepted
        ids[j, 1 : 1 + keep] = am[j, :keep]
        if 1 + keep < q:
            ids[j, 1 + keep] = (am[j, keep] + 1) % v  # then a miss
    ids = ids.flatten()
    for _ in range(2):  # the second launch reuses the counters
        got = tam.greedy_verify_triton(logits, ids, b, q)
        assert got.tolist() == greedy_verify(logits, ids, b, q).tolist()
        assert torch.count_nonzero(tam._merge_counters(logits.device, b)) == 0


def test_greedy_verify_rejects_bad_shapes() -> None:
    logits = torch.randn(6, 10)
    with pytest.raises(ValueError, match="expected 6"):
        tam.greedy_verify_triton(logits, torch.zeros(5, dtype=torch.int64), 2, 3)
    with pytest.raises(ValueError, match="expected 8"):
        tam.greedy_verify_triton(logits, torch.zeros(8, dtype=torch.int64), 2, 4)


def test_engine_greedy_tail_triton_equals_torch(monkeypatch, often_qwen3_dir, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The engine with the graphs' greedy verification and drafter argmaxes on the Triton kernel (interpreted)
    emits what the torch path does: plain padded decoding and the fused DFlash step (verify packing, the drafter's
    argmax), with the same acceptance."""
    from drafters import make_dflash

    from specserve import LLM, SamplingParams
    from specserve.layers import sampler

    dflash = make_dflash(tmp_path / "dflash", 64, 4, 49152, layer_ids=[0, 2])
    prompts = ["1 2 3 4 5 6 7 8 9 10 1 2 3 4 5", "Hello there, how are you"]
    sps = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (12, 9)]
    calls = {"n": 0, "argmax": 0}
    real, real_rows = tam.greedy_verify_triton, tam.argmax_rows

    def counted(*args):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return real(*args)

    def counted_rows(*args):  # type: ignore[no-untyped-def]
        calls["argmax"] += 1
        return real_rows(*args)

    monkeypatch.setattr(tam, "greedy_verify_triton", counted)
    monkeypatch.setattr(tam, "argmax_rows", counted_rows)
    results = {}
    for mode in ("torch", "triton"):
        monkeypatch.setenv(sampler.GREEDY_TAIL_ENV, mode)
        for spec in (None, {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}):
            llm = LLM(often_qwen3_dir, dtype="float32", device="cpu", max_num_seqs=4, speculative_config=spec,
                      padded_decode=True)  # fmt: skip
            outs = llm.generate(prompts, sps, use_tqdm=False)
            m = llm.engine.get_metrics()
            results[mode, spec is None] = (
                [o.outputs[0].token_ids for o in outs],
                (m["spec_decode_num_accepted_tokens"], m["spec_decode_num_drafts"]),
            )
        if mode == "torch":
            assert calls == {"n": 0, "argmax": 0}
    assert calls["n"] > 0 and calls["argmax"] > 0  # the Triton kernels ran (verify packing, drafter argmax)
    accepted, drafts = results["torch", False][1]
    assert drafts > 0 and accepted > 0  # the DFlash runs verified drafts and accepted some
    assert results["triton", True] == results["torch", True]
    assert results["triton", False] == results["torch", False]
    monkeypatch.setenv(sampler.GREEDY_TAIL_ENV, "bogus")
    with pytest.raises(ValueError, match=sampler.GREEDY_TAIL_ENV):
        sampler.greedy_tail_on(torch.device("cpu"))


_HOPPER_COMPILE_SCRIPT = r"""
import specserve.layers.triton_argmax as tam
from sm90 import compile_sm90

ptrs = dict(logits_ptr="bf16", ids_ptr="i64", packed_ptr="i64", counter_ptr="i32", part_v_ptr="fp32",
            part_i_ptr="i32")
for q, pack, p in [(1, True, 1), (8, True, 1), (16, True, 1), (1, False, 1), (1, True, 38), (16, True, 38),
                   (1, False, 12)]:
    const = dict(Q=q, Q_PAD=max(2, q), PACK=pack, CHUNK=4096, P=p, P_PAD=max(2, 1 << (p - 1).bit_length()), PDL=True)
    k, reg, stack = compile_sm90(tam._greedy_tail_kernel, ptrs, const, 8, 3, not_divisible=("V",))
    print(q, pack, p, f"REG:{reg} STACK:{stack}")
    assert stack == 0, f"register spills: {const}"
    ptx = k.asm["ptx"]
    assert "griddepcontrol.wait" in ptx
    # the arrivals: a request's rows (verify packing), a row's programs (the vocabulary split)
    assert ("atom.global.gpu.acq_rel.add" in ptx) == ((pack and q > 1) or p > 1)
print("OK")
"""


def test_greedy_tail_compiles_for_hopper_without_spills() -> None:
    """The interpreter accepts code the compiler rejects: compile the kernel for sm_90 (no GPU needed), as the
    engine launches it (8 warps, 4096-entry chunks), and check that it does not spill and keeps its PDL wait and,
    for verify blocks, its gpu-scope arrival."""
    from sm90 import run_script

    run_script(_HOPPER_COMPILE_SCRIPT)
