"""The skinny GEMM with fused prologues (specserve.layers.triton_gemv, interpreted on CPU) vs the
nine-kernel fused path it replaces: the same GEMM inputs bit for bit (add+RMSNorm, SiLU-mul), products within
the GEMM's rounding, and the same greedy tokens through the whole model."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import importlib

import pytest
import torch

triton = pytest.importorskip("triton")

from specserve.layers import triton_fused as tf  # noqa: E402
from specserve.layers import triton_gemv as tg  # noqa: E402

if type(tf._rms_norm_kernel).__name__ != "InterpretedFunction":
    tf = importlib.reload(tf)
if type(tg._gemv_kernel).__name__ != "InterpretedFunction":
    tg = importlib.reload(tg)


def _ref_gemm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (a.double() @ w.double().T).to(a.dtype)


def _close(y: torch.Tensor, ref: torch.Tensor) -> None:
    if y.dtype == torch.float32:
        torch.testing.assert_close(y, ref, atol=1e-5, rtol=1e-5)
    else:  # fp32 accumulation, then one rounding to the model dtype: within one ulp of the exact product
        torch.testing.assert_close(y.float(), ref.float(), atol=1e-3, rtol=1 / 128)


@pytest.mark.parametrize(
    "cfg",
    [
        None,
        "16,64,4,2,fma",
        "16,256,4,3",
        "8,256,4,1,fma,1pass",
        "16,256,4,1,1pass",
        "4,256,4,2,fma,1pass,p1",  # persistent: 2 programs (the interpreter's "SMs") over 10 tiles, one pass
        "8,64,4,2,fma,p1",  # persistent, statistics loop + K loop per tile
        "16,64,4,2,p3",  # persistent tl.dot tiles, more programs than tiles: the grid is capped at 3 tiles
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_prologues_match_the_fused_kernels(dtype, m, cfg, monkeypatch):
    if cfg:  # None: the default (CUDA-core tile sized by the row count); "fma": CUDA cores; else tl.dot
        monkeypatch.setenv("SPECSERVE_GEMV_CFG", cfg)
    else:
        monkeypatch.delenv("SPECSERVE_GEMV_CFG", raising=False)
    g = torch.Generator().manual_seed(m)
    n, k = 40, 200  # neither a multiple of the blocks
    x = torch.randn(m, k, generator=g).to(dtype)
    res = torch.randn(m, k, generator=g).to(dtype)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(dtype)
    w = (0.05 * torch.randn(n, k, generator=g)).to(dtype)
    # plain
    y, r = tg.gemv(x, w)
    assert r is None
    _close(y, _ref_gemm(x, w))
    # RMSNorm prologue (no residual): the residual stream is x itself
    y, r = tg.gemv(x, w, norm_weight=nw, eps=1e-5)
    normed = tf.rms_norm(x, nw, 1e-5)
    assert r is x
    _close(y, _ref_gemm(normed, w))
    # add + RMSNorm prologue: the new residual is h = residual + x exactly as fused_add_rms_norm gives it
    y, r = tg.gemv(x, w, residual=res, norm_weight=nw, eps=1e-5)
    normed, h = tf.fused_add_rms_norm(x, res, nw, 1e-5)
    assert r is not None and torch.equal(r, h)
    _close(y, _ref_gemm(normed, w))
    # SiLU-mul prologue over [gate | up]
    gu = torch.randn(m, 2 * k, generator=g).to(dtype)
    y, r = tg.gemv(gu, w, silu_mul=True)
    assert r is None
    _close(y, _ref_gemm(tf.silu_mul(gu, k), w))


def test_rows_do_not_depend_on_the_batch():
    """Each row's product is computed the same way whatever the number of rows (one 16-row tile)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 96, generator=g).to(torch.bfloat16)
    w = (0.05 * torch.randn(48, 96, generator=g)).to(torch.bfloat16)
    full, _ = tg.gemv(x, w)
    for i in (0, 5, 15):
        one, _ = tg.gemv(x[i : i + 1].contiguous(), w)
        assert torch.equal(one[0], full[i])


def test_bad_shapes_raise():
    x = torch.zeros(17, 8)
    with pytest.raises(ValueError, match="at most 16 rows"):
        tg.gemv(x, torch.zeros(4, 8))
    with pytest.raises(ValueError, match="columns"):
        tg.gemv(torch.zeros(2, 8), torch.zeros(4, 8), silu_mul=True)
    y, r = tg.gemv(torch.zeros(0, 8), torch.zeros(4, 8))
    assert y.shape == (0, 4) and r is None


@pytest.mark.parametrize("qwen3,attn", [(True, "triton"), (False, "triton"), (True, "torch")])
def test_six_kernel_layers_match_the_fused_path(qwen3, attn, monkeypatch):
    """The model with SPECSERVE_TRITON_GEMV=1 (GEMMs with prologues) vs the nine-kernel fused path and the torch
    path: hidden states, taps, logits, argmax and KV caches, over a prefill, a padded decode and a verify-like
    step; more than 16 rows take the nine-kernel path."""
    from test_fused_kernels import Batch, build_model, fused_backend, model_config

    from specserve.layers.attention import TorchAttentionBackend

    calls = []
    real = tg.gemv

    def counting(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(tg, "gemv", counting)
    cfg = model_config(qwen3, num_hidden_layers=2)  # two layers: the interpreter's time grows with each
    taps = [2, 0, 1]  # unsorted: the stack's output, the embeddings, the residual stream between the layers
    ref = build_model(cfg, torch.float32, TorchAttentionBackend(), taps)
    nine = build_model(cfg, torch.float32, fused_backend(attn), taps)
    six = build_model(cfg, torch.float32, fused_backend(attn), taps)
    batch = Batch()
    steps = [
        batch.step([p.tolist() for p in batch.prompts], [0, 0]),
        batch.step([[7], [11]], [9, 5], pad=True),
        batch.step([[1, 2, 3], [4]], [10, 6]),
    ]
    for ids, pos, meta in steps:
        monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "0")
        h_ref, aux_ref = ref(ids, pos, meta)
        h9, aux9 = nine(ids, pos, meta)
        n0 = len(calls)
        monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "1")
        h6, aux6 = six(ids, pos, meta)
        assert len(calls) - n0 == 4 * cfg.num_hidden_layers  # qkv, o, gate_up, down per layer
        rows = meta.slot_mapping >= 0
        for a, b in ((h6, h9), (aux6, aux9), (h6, h_ref), (aux6, aux_ref)):
            torch.testing.assert_close(a[rows], b[rows], atol=1e-4, rtol=1e-4)
        assert torch.equal(aux6[:, 48:96], aux9[:, 48:96])  # the embeddings tap
        assert torch.equal(
            six.compute_logits(h6[rows]).argmax(-1), ref.compute_logits(h_ref[rows]).argmax(-1)
        )
    for (k6, v6), (k9, v9) in zip(six.kv_caches, nine.kv_caches):
        torch.testing.assert_close(k6, k9, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(v6, v9, atol=1e-4, rtol=1e-4)
    # 17+ rows: the nine-kernel path
    n0 = len(calls)
    big = Batch()
    prompts = [list(range(1, 10)), list(range(20, 29))]
    ids, pos, meta = big.step(prompts, [0, 0])
    assert ids.shape[0] > tg.MAX_ROWS
    six(ids, pos, meta)
    assert len(calls) == n0


def test_llm_greedy_and_dflash_lossless_with_gemv(tiny2_qwen3_dir, tmp_path, monkeypatch):
    """End to end through the engine on the Triton backend: plain greedy tokens equal the nine-kernel path's,
    and DFlash K=4 (5-row verify steps through the same kernel) emits exactly the plain tokens."""
    from drafters import make_dflash

    from specserve import LLM, SamplingParams

    monkeypatch.delenv("SPECSERVE_FUSED_KERNELS", raising=False)
    prompts = ["The capital of France is", "1 2 3 4 5 6"]
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    kw = dict(dtype="float32", device="cpu", attention_backend="triton", num_gpu_blocks=24)
    outs = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("SPECSERVE_TRITON_GEMV", flag)
        outs[flag] = [o.outputs[0].token_ids for o in LLM(tiny2_qwen3_dir, **kw).generate(prompts, sp)]
    assert outs["1"] == outs["0"]
    dflash = make_dflash(tmp_path / "d", 64, 2, 49152, layer_ids=[0, 1])
    spec = {"method": "dflash", "model": dflash, "num_speculative_tokens": 4}
    llm = LLM(tiny2_qwen3_dir, speculative_config=spec, **kw)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, sp)] == outs["1"]
    assert llm.get_metrics()["spec_decode_num_drafts"] > 0


def test_projection_biases_keep_the_nine_kernel_path(monkeypatch):
    """Qwen2-style q/k/v biases: the GEMM prologue kernel has no bias, so such models stay on the fused path."""
    from test_fused_kernels import Batch, build_model, fused_backend, model_config

    calls = []
    real = tg.gemv
    monkeypatch.setattr(tg, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "1")
    model = build_model(model_config(False, attention_bias=True), torch.float32, fused_backend("torch"), [])
    assert model.layers[0].self_attn.qkv_proj.bias is not None
    ids, pos, meta = Batch().step([[1, 2, 3], [4]], [0, 0])
    h, _ = model(ids, pos, meta)
    assert calls == [] and torch.isfinite(h).all()


def test_where_the_six_kernel_layer_runs_and_its_default_tiles(monkeypatch):
    """``auto`` (default): CUDA, small hidden sizes, <= 4 rows; ``1``: <= 16 rows anywhere; ``0``: never; anything
    else is an error. The default tile keeps next_pow2(rows) x BLOCK_N x BLOCK_K at 8192 products (no spills at 16
    rows, where the b1 tile 8 x 1024 would hold 131072) with one pass over K up to 1024."""
    cpu = torch.zeros(1)
    monkeypatch.delenv("SPECSERVE_TRITON_GEMV", raising=False)
    assert tg.max_rows(cpu, 576) == 0  # auto is CUDA-only
    meta = torch.zeros(1, device="meta")  # is_cuda False as well: auto stays off off-GPU
    assert tg.max_rows(meta, 576) == 0
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "1")
    assert tg.max_rows(cpu, 4096) == tg.MAX_ROWS == 16
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "0")
    assert tg.max_rows(cpu, 576) == 0
    monkeypatch.setenv("SPECSERVE_TRITON_GEMV", "yes")
    with pytest.raises(ValueError, match="auto, 1 or 0"):
        tg.max_rows(cpu, 576)
    monkeypatch.delenv("SPECSERVE_GEMV_CFG", raising=False)
    assert tg._config(1, 576) == (
        8,
        1024,
        4,
        1,
        False,
        True,
        0,
    )  # the best of the session-8/9 sweeps on SmolLM2
    assert tg._config(1, 1536)[:2] == (8, 1024)
    for m in range(1, 17):
        bn, bk, _, _, use_dot, one_pass, per_sm = tg._config(m, 576)
        assert (
            not use_dot
            and one_pass
            and not per_sm
            and bn >= 1
            and bn * bk * triton.next_power_of_2(m) <= 8192
        )
    assert tg._config(16, 576)[:2] == (1, 512) and tg._config(2, 64)[:2] == (16, 64)
    monkeypatch.setenv("SPECSERVE_GEMV_CFG", "16,256,4,3")
    assert tg._config(1, 576) == (16, 256, 4, 3, True, False, 0)
    monkeypatch.setenv("SPECSERVE_GEMV_CFG", "8,1024,4,1,fma,1pass")
    assert tg._config(1, 576) == (8, 1024, 4, 1, False, True, 0)
    monkeypatch.setenv("SPECSERVE_GEMV_CFG", "2,4096,4,3,fma,1pass,p4")
    assert tg._config(1, 4096) == (2, 4096, 4, 3, False, True, 4)
    monkeypatch.setenv(
        "SPECSERVE_GEMV_CFG", "16,1024,8,1,1pass;16,256,4,2"
    )  # by K: one tile or the second config
    assert tg._config(16, 576) == (16, 1024, 8, 1, True, True, 0)
    assert tg._config(16, 1536) == (16, 256, 4, 2, True, False, 0)
    for bad, msg in (
        ("8,1024,4,1,fast", "unknown flags"),
        ("8,1024,4,1,p0", "unknown flags"),
        ("8,1024,4,1,p2,p4", "unknown flags"),
        ("8,1024", "expected"),
        ("1,2,3,4;1,2,3,4;1,2,3,4", "two"),
    ):
        monkeypatch.setenv("SPECSERVE_GEMV_CFG", bad)
        with pytest.raises(ValueError, match=msg):
            tg._config(1, 576)


@pytest.mark.parametrize("m", [1, 3])
def test_one_pass_gives_the_two_pass_values_bit_for_bit(m, monkeypatch):
    """``1pass`` (K within one tile: the norm statistics from the GEMM's own input tile, one round of loads) computes
    exactly what the statistics loop + main loop compute over the same single tile, for every prologue."""
    g = torch.Generator().manual_seed(7 + m)
    n, k = 24, 200
    x = torch.randn(m, 2 * k, generator=g).to(torch.bfloat16)
    res = torch.randn(m, k, generator=g).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(k, generator=g)).to(torch.bfloat16)
    w = (0.05 * torch.randn(n, k, generator=g)).to(torch.bfloat16)
    xk = x[:, :k].contiguous()
    cases = [
        dict(x=xk),
        dict(x=xk, norm_weight=nw, eps=1e-5),
        dict(x=xk, residual=res, norm_weight=nw, eps=1e-5),
        dict(x=x, silu_mul=True),
    ]
    for fma in (",fma", ""):
        outs = {}
        for flag in ("", ",1pass"):
            monkeypatch.setenv("SPECSERVE_GEMV_CFG", f"8,256,4,1{fma}{flag}")
            outs[flag] = [tg.gemv(kw.pop("x"), w, **kw) for kw in [dict(c) for c in cases]]
        for (y2, r2), (y1, r1) in zip(outs[""], outs[",1pass"]):
            assert torch.equal(y1, y2)
            assert (r1 is None) == (r2 is None) and (r1 is None or torch.equal(r1, r2))


_HOPPER_GEMV_SCRIPT = r"""
import triton
import specserve.layers.triton_gemv as tg
from specserve.layers.triton_fused import _BF16
from sm90 import compile_sm90

ptrs = {n: "bf16" for n in ("x_ptr", "r_ptr", "nw_ptr", "w_ptr", "y_ptr", "res_out_ptr")}


def stack_bytes(m, k, pro, cfg):
    bn, bk, nw, ns, use_dot, one_pass, per_sm = cfg
    const = dict(PRO=pro, MODE=_BF16, BLOCK_M=tg.MAX_ROWS if use_dot else triton.next_power_of_2(m), BLOCK_N=bn,
                 BLOCK_K=bk, NUM_STAGES=ns, EXACT_DOT=False, USE_DOT=use_dot, ONE_PASS=one_pass and k <= bk,
                 PERSIST=per_sm > 0, PDL=True)
    return compile_sm90(tg._gemv_kernel, ptrs, const, nw, ns, floats=("eps",), divisible_ints=False)[2]


# the default tile for each row count the layer takes, on SmolLM2's GEMMs (add+norm prologue at K=576, SiLU-mul at
# K=1536): no spills
for m, k, pro in [(1, 576, 2), (1, 1536, 3), (4, 576, 2), (16, 576, 2), (16, 1536, 3)]:
    assert stack_bytes(m, k, pro, tg._config(m, k)) == 0, (m, k, pro, tg._config(m, k))
# the persistent form (a tuning option) compiles too: one-pass tiles with the next tile prefetched, and the K loop
assert stack_bytes(1, 4096, 2, tg._parse_config("2,4096,4,1,fma,1pass,p4", "")) == 0
assert stack_bytes(1, 12288, 3, tg._parse_config("8,512,4,1,fma,p8", "")) == 0
# the check can fail: the one-row tile at 16 rows is what made DFlash's 16-row steps crawl on the H200
assert stack_bytes(16, 576, 2, (8, 1024, 4, 1, False, False, 0)) > 0
print("OK")
"""


def test_default_gemv_tiles_compile_for_hopper_without_spills() -> None:
    """The default launch configs compile for sm_90 (no GPU needed) without register spills; the old one-size tile
    at 16 rows did spill (on the H200 DFlash ran 4.7x slower with it)."""
    from sm90 import run_script

    run_script(_HOPPER_GEMV_SCRIPT)
