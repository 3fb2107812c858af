"""The add + RMSNorms folded into the Triton split-K GEMMs (``SPECSERVE_FUSED_NORM``, issue #6): the residual-add
epilogue (``splitk_add``: the last program of each output block sums the partials, adds the residual, writes the
block's sums of squares) and the RMSNorm prologue (``NormIn``) against the separate kernels they replace, the
engine's greedy tokens with and without them, and an sm_90 compile of the new variants (interpreted on CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TINY_TILES = ",".join(
    f"{n}@{r}{lay}=16:16:2:4" for n in ("qkv", "o", "gate_up", "down") for r in (1, 16) for lay in ("", "nk")
)

# the engine test's tiles: 32 columns (half the interpreted programs of TINY_TILES; still two N blocks of the 64-wide
# residual stream, so the norm prologue sums two blocks' sums of squares), K loops of 2-4 steps of 16
ENGINE_TILES = TINY_TILES.replace("=16:", "=32:")


def _weight(k: int, n: int, layout: str, dtype: torch.dtype) -> torch.Tensor:
    w = torch.randn(k, n) / 8
    return (w if layout == "kn" else w.t().contiguous().t()).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 5, 16])
@pytest.mark.parametrize("layout", ["kn", "nk"])
@pytest.mark.parametrize("splits", [1, 4])
def test_add_epilogue_and_norm_prologue_match_the_kernels_they_replace(
    dtype, rows, layout, splits, monkeypatch
):
    import specserve.layers.triton_attention as ta
    import specserve.layers.triton_splitk as ts
    from specserve.layers.triton_fused import fused_add_rms_norm_partials, rms_norm

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES)
    torch.manual_seed(rows * 10 + splits)
    k, n, inter = 64, 48, 32
    x, r = torch.randn(rows, k).to(dtype), torch.randn(rows, n).to(dtype)
    w = _weight(k, n, layout, dtype)
    out = ts.splitk_add(x, w, splits, "o", r)
    assert out.h.shape == (rows, n) and out.h.dtype == dtype and out.ssq.shape == (rows, n // 16)
    # h: what the add + RMSNorm kernel computes from the same partials, bit for bit
    nw = (torch.rand(n) + 0.5).to(dtype)
    normed, h_ref = fused_add_rms_norm_partials(ts.splitk_partials(x, w, splits, "o"), r, nw, 1e-6)
    assert torch.equal(out.h, h_ref)
    hf = out.h.float()
    torch.testing.assert_close(out.ssq, (hf * hf).view(rows, n // 16, 16).sum(-1), rtol=1e-5, atol=1e-5)
    # every arrival counter is back at 0 for the next launch / graph replay
    assert not ta._merge_counters(x.device, 1)[:8].any()
    # the RMSNorm prologue (from the epilogue's sums) == rms_norm, then the GEMM
    nin = ts.NormIn(out.ssq, nw, 1e-6)
    assert torch.equal(rms_norm(out.h, nw, 1e-6), normed)
    w2 = _weight(n, 2 * inter, layout, dtype)
    tol = 1e-5 if dtype == torch.float32 else 0.0  # fp32: the sums of squares add in another order
    torch.testing.assert_close(
        ts.gate_up_silu(out.h, w2, inter, nin), ts.gate_up_silu(normed, w2, inter), rtol=tol, atol=tol
    )
    torch.testing.assert_close(
        ts.splitk_partials(out.h, w2, 3, "qkv", nin),
        ts.splitk_partials(normed, w2, 3, "qkv"),
        rtol=tol,
        atol=tol,
    )


def test_fused_norm_rejects_bad_inputs(monkeypatch):
    import specserve.layers.triton_splitk as ts
    import specserve.models.llama as llama

    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", TINY_TILES)
    x, w = torch.randn(2, 64), torch.randn(64, 48)
    with pytest.raises(ValueError, match="residual must be"):
        ts.splitk_add(x, w, 4, "o", torch.randn(3, 48))
    with pytest.raises(ValueError, match="weight must be"):
        ts.splitk_partials(x, w, 4, "o", ts.NormIn(torch.zeros(2, 4), torch.ones(32), 1e-6))
    with pytest.raises(ValueError, match="ssq must be"):
        ts.splitk_partials(x, w, 4, "o", ts.NormIn(torch.zeros(3, 4), torch.ones(64), 1e-6))
    monkeypatch.setenv("SPECSERVE_FUSED_NORM", "yes")
    with pytest.raises(ValueError, match="SPECSERVE_FUSED_NORM must be 0, 1, 2 or auto"):
        llama.fused_norm_mode(1)
    monkeypatch.delenv("SPECSERVE_FUSED_NORM")  # auto: the add epilogues for one-row steps only
    assert [llama.fused_norm_mode(r) for r in (1, 2, 16)] == [1, 0, 0]
    monkeypatch.setenv("SPECSERVE_FUSED_NORM", "2")
    assert [llama.fused_norm_mode(r) for r in (1, 16)] == [2, 2]


# mode 1 (the default's, at one row): the add epilogues with rms_norm kernels, with DFlash; 2: and the norm prologues
@pytest.mark.parametrize(("layout", "mode"), [("kn", "1"), ("nk", "2")])
def test_engine_tokens_unchanged_with_fused_norm(tiny2_qwen3_dir, tmp_path, layout, mode, monkeypatch):
    """Greedy tokens (float32) of plain decoding at 1 and 2 rows and of DFlash K=4 (5-row verify steps, the drafter's
    block on the same path) equal those without the fused norms, and the fused path ran (two residual-add GEMMs a
    layer, the ``rms_norm`` launches each mode leaves)."""
    from drafters import make_dflash

    import specserve.layers.triton_fused as tf
    import specserve.layers.triton_splitk as ts
    from specserve import LLM, SamplingParams

    monkeypatch.setenv("SPECSERVE_WEIGHT_LAYOUT", layout)
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM", "1")
    monkeypatch.setenv("SPECSERVE_SPLIT_GEMM", "qkv=2,o=2,down=4")
    monkeypatch.setenv("SPECSERVE_TRITON_GEMM_TILES", ENGINE_TILES)
    # small models' one-row six-kernel layer off: their one-row steps take the split path too
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "0")
    prompts = ["The capital of France is", "def f(x):"]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", num_gpu_blocks=64, attention_backend="triton")
    adds: list[int] = []
    norms: list[int] = []
    real_add, real_norm = ts.splitk_add, tf._launch_rms_norm
    monkeypatch.setattr(ts, "splitk_add", lambda x, *a, **k: adds.append(x.shape[0]) or real_add(x, *a, **k))
    monkeypatch.setattr(tf, "_launch_rms_norm", lambda x, *a, **k: norms.append(1) or real_norm(x, *a, **k))
    mc = json.loads((Path(tiny2_qwen3_dir) / "config.json").read_text())
    n = mc["num_hidden_layers"]
    dflash = make_dflash(tmp_path / "d", mc["hidden_size"], n, mc["vocab_size"], layer_ids=[0, 1])
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    outs = {}
    for flag in ("0", mode):
        monkeypatch.setenv("SPECSERVE_FUSED_NORM", flag)
        llm = LLM(tiny2_qwen3_dir, **kw)
        adds.clear()
        outs[flag] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        if mode == "1":  # one-row steps through the whole run (the default's case)
            outs[flag + "b1"] = llm.generate(prompts[:1], sp)[0].outputs[0].token_ids
        assert bool(adds) == (flag != "0") and (flag == "0" or 2 in adds)
        if flag != "0":  # a prefill of a few rows + one decode step of one request
            adds.clear()
            norms.clear()
            llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
            assert adds.count(1) == 2 * n  # the decode step: two residual-add GEMMs a layer
            # rms_norm launches: mode 1 two a layer + the final norm in each forward; mode 2 the first layer's and
            # the final norm, and at the one-row step the cuBLAS gate_up's input norm a layer
            assert len(norms) == (2 * (2 * n + 1) if flag == "1" else 2 + (n + 2))
        if mode == "1" and flag == "1":  # (one speculative run keeps the suite short)
            llm = LLM(tiny2_qwen3_dir, speculative_config=spec, **kw)
            adds.clear()
            outs[flag + "spec"] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
            assert llm.get_metrics()["spec_decode_num_drafts"] > 0
            assert any(a > 2 for a in adds)  # verify / drafter blocks of 5 rows a request
    assert outs[mode] == outs["0"]
    if mode == "1":
        assert outs["1b1"] == outs["0b1"] and outs["1spec"] == outs["0"]


_HOPPER_SCRIPT = r"""
import specserve.layers.triton_splitk as ts
from specserve.layers.triton_fused import _BF16
from sm90 import compile_sm90

ptrs = dict(x_ptr="bf16", w_ptr="bf16", out_ptr="fp32", scratch_ptr="bf16", ssq_ptr="fp32", norm_ptr="bf16",
            res_ptr="bf16", res_out_ptr="bf16", ssq_out_ptr="fp32", counter_ptr="i32")
# the Qwen3-8B shapes of the fused-norm layer: qkv with the norm prologue, o / down with the add epilogue, gate_up +
# SiLU-mul with the norm prologue (the tensor-core tile at every row count)
for name, cls, n, k, s, norm, add in [
    ("qkv", 1, 6144, 4096, 8, True, False), ("qkv", 16, 6144, 4096, 8, True, False),
    ("o", 1, 4096, 4096, 8, False, True), ("o", 16, 4096, 4096, 8, False, True),
    ("down", 1, 4096, 12288, 8, False, True), ("down", 16, 4096, 12288, 8, False, True),
    ("gate_up", 16, 12288, 4096, 1, True, False),
]:
    t = ts.tile_for(name, cls, "kn")
    gate_up = name == "gate_up"
    const = dict(N=n, K_SPLIT=k // s, BLOCK_M=1 if cls == 1 else 16, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
                 PRE_K=t.pre, NUM_STAGES=t.stages, USE_DOT=cls > 1, PRECISION="tf32", UPCAST=False, GATE_UP=gate_up,
                 MODE=_BF16, PDL=True, NORM_IN=norm, K_TOTAL=k, NB_IN=32, NB_IN_BLOCK=32, EPI_ADD=add, SPLITS=s,
                 PRO_K=ts._prologue_chunk(k // s, 4096 if cls == 1 else 256),
                 stride_wn=1)
    p = dict(ptrs, out_ptr="bf16") if gate_up else ptrs
    kernel, reg, stack = compile_sm90(ts._splitk_gemm_kernel, p, const, t.warps, t.stages)
    print(name, cls, f"REG:{reg} STACK:{stack}")
    assert stack == 0, (name, cls)
    ptx = kernel.asm["ptx"]
    assert "griddepcontrol.wait" in ptx
    assert ("atom" in ptx) == (add and s > 1), name  # the arrival counter
    assert ("bar.sync" in ptx) or not (norm or add)
print("OK")
"""


def test_fused_norm_variants_compile_for_hopper_without_spills() -> None:
    from sm90 import run_script

    run_script(_HOPPER_SCRIPT)
