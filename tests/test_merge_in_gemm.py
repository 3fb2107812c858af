"""The attention's split-KV merge done by the one-row o_proj GEMM as it loads its input (``SPECSERVE_ATTN_MERGE=gemm``,
issue #6): ``splitk_add(..., merge=SplitPartials)`` against the merge kernel + the plain GEMM, the fallbacks, the
engine's greedy tokens with it, and an sm_90 compile of the variant (interpreted on CPU)."""

from __future__ import annotations

import pytest
import torch

TILES = "o@1=16:16:2:4,o@16=16:16:2:4"
# every projection's tiles at both row classes and layouts (what the engine's fit check asks), 32 columns wide
ENGINE_TILES = ",".join(
    f"{n}@{r}{lay}=32:16:2:4" for n in ("qkv", "o", "gate_up", "down") for r in (1, 16) for lay in ("", "nk")
)


def _partials(s: int, t: int, h: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    part = torch.randn(s, 16, h, d, generator=g)
    lse = torch.randn(s, 16, h, generator=g) * 3
    lse[s - 2 :, :t] = float("-inf")  # empty splits (a short context): lse -inf, zeros
    part[s - 2 :, :t] = 0
    lse[:, :t, 1] = float("-inf")  # a head with no visible key at all: output 0
    part[:, :t, 1] = 0
    return part, lse


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("splits", "skip"), [(1, "0"), (4, "0"), (4, "1")])
def test_splitk_add_merge_equals_merge_kernel_then_gemm(dtype, splits, skip, monkeypatch):
    import specserve.layers.triton_attention as ta
    import specserve.layers.triton_splitk as ts

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TILES)
    monkeypatch.setenv("SPECSERVE_ATTN_MERGE_SKIP_EMPTY", skip)
    h, d, n = 4, 32, 48
    part, lse = _partials(6, 1, h, d, seed=splits)
    if skip == "1":  # garbage (NaN) in the empty splits' partials: read, it would poison the sums
        part[4:, 0] = float("nan")
        part[:, 0, 1] = float("nan")
    w = (torch.randn(h * d, n) / 8).to(dtype)
    r = torch.randn(1, n).to(dtype)
    launches: list[int] = []
    real = ta._merge_splits_kernel
    monkeypatch.setattr(ta, "_merge_splits_kernel", _Counting(real, launches))
    out = torch.full((1, h, d), float("nan"), dtype=dtype)
    got = ts.splitk_add(out.view(1, -1), w, splits, "o", r, merge=ta.SplitPartials(out, part, lse))
    assert launches == []  # no merge kernel: the GEMM merged
    assert torch.isnan(out).all()  # and the merged row never went through memory
    ref_in = ta.merge_split_partials(
        ta.SplitPartials(torch.empty(1, h, d, dtype=dtype), part.nan_to_num(), lse)
    )
    assert launches == [1]
    assert torch.equal(ref_in[0, 1], torch.zeros(d, dtype=dtype)) and ref_in.abs().sum() > 0
    ref = ts.splitk_add(ref_in.view(1, -1), w, splits, "o", r)
    # the same arithmetic as the merge kernel, chunk by chunk: bit for bit under the interpreter
    assert torch.equal(got.h, ref.h) and torch.equal(got.ssq, ref.ssq)
    assert not ta._merge_counters(r.device, 1)[:8].any()


class _Counting:
    """A Triton kernel whose launches (``kernel[grid](...)``) are counted."""

    def __init__(self, kernel, launches: list[int]) -> None:  # type: ignore[no-untyped-def]
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):  # type: ignore[no-untyped-def]
        self.launches.append(1)
        return self.kernel[grid]


@pytest.mark.parametrize("case", ["rows", "block_k", "pre"])
def test_splitk_add_merge_falls_back_to_the_merge_kernel(case, monkeypatch):
    """More than one row, a BLOCK_K that does not divide the head dim, or a ``pre`` tile: the merge kernel fills
    ``out`` first and the GEMM reads it; the result is the same."""
    import specserve.layers.triton_attention as ta
    import specserve.layers.triton_splitk as ts

    tiles = {"rows": TILES, "block_k": "o@1=16:64:2:4", "pre": "o@1=16:16:2:4:16"}[case]
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", tiles)
    t = 3 if case == "rows" else 1
    h, d, n = 4, 32, 48
    part, lse = _partials(5, t, h, d, seed=7)
    w = torch.randn(h * d, n) / 8
    r = torch.randn(t, n)
    launches: list[int] = []
    monkeypatch.setattr(ta, "_merge_splits_kernel", _Counting(ta._merge_splits_kernel, launches))
    out = torch.full((t, h, d), float("nan"))
    got = ts.splitk_add(out.view(t, -1), w, 2, "o", r, merge=ta.SplitPartials(out, part, lse))
    assert launches == [1] and not torch.isnan(out).any()
    ref_in = ta.merge_split_partials(ta.SplitPartials(torch.empty(t, h, d), part, lse))
    assert torch.equal(out, ref_in)
    assert torch.equal(got.h, ts.splitk_add(ref_in.view(t, -1), w, 2, "o", r).h)


def test_splitk_add_merge_rejects_mismatched_partials(monkeypatch):
    import specserve.layers.triton_attention as ta
    import specserve.layers.triton_splitk as ts

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TILES)
    part, lse = _partials(5, 1, 4, 32, seed=1)
    out = torch.empty(1, 4, 32)
    with pytest.raises(ValueError, match="do not match the GEMM's K=96"):
        ts.splitk_add(out.view(1, -1)[:, :96], torch.randn(96, 48), 2, "o", torch.randn(1, 48),
                      merge=ta.SplitPartials(out, part, lse))  # fmt: skip
    with pytest.raises(ValueError, match="contiguous"):
        ts.splitk_add(out.view(1, -1), torch.randn(128, 48), 2, "o", torch.randn(1, 48),
                      merge=ta.SplitPartials(out, part.transpose(2, 3).contiguous().transpose(2, 3), lse))  # fmt: skip
    monkeypatch.setenv("SPECSERVE_ATTN_MERGE_SKIP_EMPTY", "yes")
    with pytest.raises(ValueError, match="SPECSERVE_ATTN_MERGE_SKIP_EMPTY must be 0 or 1"):
        ts.splitk_add(out.view(1, -1), torch.randn(128, 48), 2, "o", torch.randn(1, 48),
                      merge=ta.SplitPartials(out, part, lse))  # fmt: skip
    monkeypatch.setenv("SPECSERVE_ATTN_MERGE", "gem")
    with pytest.raises(ValueError, match="SPECSERVE_ATTN_MERGE must be one of"):
        ta.merge_in_gemm()


def test_engine_tokens_unchanged_with_merge_in_gemm(tiny2_qwen3_dir, monkeypatch):
    """Greedy tokens (float32) of one-row decoding through the split-K layer with the attention split 4 ways (forced:
    on CPU the heuristic never splits) are the same whether the merge kernel or o_proj merges, and with ``gemm``
    every decode step's o_proj merged (no merge kernel at one row); steps of more rows keep the kernel."""
    import specserve.layers.triton_attention as ta
    import specserve.layers.triton_splitk as ts
    from specserve import LLM, SamplingParams

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM", "1")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=2,down=4")
    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", "kn")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", ENGINE_TILES)
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "0")
    monkeypatch.setenv("SPECSERVE_FUSED_NORM", "1")
    monkeypatch.setattr(ta, "_pick_num_splits", lambda dev, progs, bn, msl, mql: 4 if mql == 1 else 1)
    merged: list[int] = []
    real_add = ts.splitk_add
    monkeypatch.setattr(
        ts, "splitk_add", lambda x, *a, merge=None, **k: merged.append(merge is not None) or real_add(x, *a, merge=merge, **k)
    )  # fmt: skip
    launches: list[int] = []
    monkeypatch.setattr(ta, "_merge_splits_kernel", _Counting(ta._merge_splits_kernel, launches))
    sp = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=64, attention_backend="triton")
    outs, counts = {}, {}
    for mode in ("kernel", "gemm"):
        monkeypatch.setenv("SPECSERVE_ATTN_MERGE", mode)
        llm = LLM(tiny2_qwen3_dir, **kw)
        merged.clear()
        launches.clear()
        outs[mode] = llm.generate(["The capital of France is"], sp)[0].outputs[0].token_ids
        counts[mode] = (sum(merged), len(launches))
    assert outs["gemm"] == outs["kernel"]
    assert counts["kernel"][0] == 0 and counts["kernel"][1] == 2 * 4  # 4 decode steps x 2 layers
    assert counts["gemm"] == (2 * 4, 0)


_HOPPER_SCRIPT = r"""
import specserve.layers.triton_splitk as ts
from specserve.layers.triton_fused import _BF16
from sm90 import compile_sm90

ptrs = dict(x_ptr="bf16", w_ptr="bf16", out_ptr="fp32", res_ptr="bf16", res_out_ptr="bf16", ssq_out_ptr="fp32",
            counter_ptr="i32", mo_ptr="fp32", ml_ptr="fp32")
# the Qwen3-8B o_proj at one row with the residual-add epilogue, merging 16 split-KV partials of 128-wide heads
t = ts.tile_for("o", 1, "kn")
const = dict(N=4096, K_SPLIT=512, BLOCK_M=1, BLOCK_N=t.block_n, BLOCK_K=t.block_k, PRE_K=0, NUM_STAGES=t.stages,
             USE_DOT=False, PRECISION="tf32", UPCAST=False, GATE_UP=False, MODE=_BF16, PDL=True, EPI_ADD=True,
             SPLITS=8, MERGE_IN=True, MSPL=16, MSPL_PAD=16, HEAD_D=128, stride_wn=1)
for skip in (False, True):
    kernel, reg, stack = compile_sm90(ts._splitk_gemm_kernel, ptrs, dict(const, SKIP_EMPTY=skip), t.warps, t.stages)
    print(f"skip {skip} REG:{reg} STACK:{stack}")
    assert stack == 0
    ptx = kernel.asm["ptx"]
    assert "griddepcontrol.wait" in ptx and "ex2.approx" in ptx and "atom" in ptx
print("OK")
"""


def test_merge_in_gemm_compiles_for_hopper_without_spills() -> None:
    from sm90 import run_script

    run_script(_HOPPER_SCRIPT)
