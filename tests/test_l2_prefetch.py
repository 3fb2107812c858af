"""The L2 prefetcher's parts that run without a GPU (layers/l2_prefetch.py): its setting's parser, the attention
kernel's trigger store (interpreted), the compiled prefetch kernel (sm_90 PTX), and that the engine leaves it out of
CPU and eager steps. Whether it makes a step faster is a GPU measurement (benchmarks/decode_env_sweep.py)."""

from __future__ import annotations

import pytest
import torch
from sm90 import run_script
from test_triton_attention import _fused_rope_inputs, make_batch

import specserve.layers.triton_attention as ta
from specserve.layers import l2_prefetch as l2


def test_parse_config() -> None:
    assert l2.parse_config("") is None and l2.parse_config("0") is None
    cfg = l2.parse_config("o=1,gate_up=0.05@7.5, ctas=32,policy=last,timeout_us=500")
    assert cfg == l2.PrefetchConfig((("o", 1.0, 0), ("gate_up", 0.05, 7500)), 32, True, 500)
    assert l2.parse_config("down=0.25") == l2.PrefetchConfig((("down", 0.25, 0),))
    assert l2.parse_config("o=1,warps=4,sleep_ns=0") == l2.PrefetchConfig(
        (("o", 1.0, 0),), warps=4, sleep_ns=0
    )
    for bad in (
        "o",
        "o=0",
        "o=1.5",
        "qkv=1",
        "o=1,o=0.5",
        "ctas=0",
        "o=1,policy=first",
        "o=x",
        "timeout_us=0",
        "delay_us=-1",
    ):
        with pytest.raises(ValueError, match="SPECSERVE_L2_PREFETCH: bad item"):
            l2.parse_config(bad)
    with pytest.raises(ValueError, match="names no projection"):
        l2.parse_config("ctas=8")


def test_schedule() -> None:
    """Events per layer in the configured order: the weight's address, its K-slice stride and count, the bytes
    prefetched from each slice's start (whole 128-byte lines) and the delay; flags one per layer."""
    weights = [
        {"o": (torch.zeros(64, 32, dtype=torch.bfloat16), 4), "gate_up": (torch.zeros(64, 96), 1)}
        for _ in range(3)
    ]
    cfg = l2.parse_config("gate_up=0.25@2,o=1,down=1")
    assert cfg is not None
    pf = l2.L2Prefetcher(cfg, weights)  # no down weights given: no down events
    ev = pf.events.tolist()
    assert pf.n_events == 6 and pf.flags.tolist() == [0, 0, 0]
    for i in range(3):
        o, gu = weights[i]["o"][0], weights[i]["gate_up"][0]
        assert ev[2 * i] == [i, gu.data_ptr(), 64 * 96 * 4, 1, 64 * 96, 2000]
        assert ev[2 * i + 1] == [i, o.data_ptr(), 64 * 32 * 2 // 4, 4, 64 * 32 * 2 // 4, 0]
    assert pf.prefetched_bytes == 3 * (64 * 96 + 64 * 32 * 2)
    assert torch.equal(pf.flag(1), pf.flags[1:2]) and pf.flag(1).data_ptr() == pf.flags.data_ptr() + 4
    small = l2.L2Prefetcher(l2.PrefetchConfig((("o", 0.1, 0),)), weights)  # 0.1 of a 1 KiB slice: 0 lines
    assert small.n_events == 0


@pytest.mark.parametrize("fused", [True, False])
def test_attention_sets_its_signal(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a signal tensor the attention (the one kernel, or rope_store + attention) sets it to 1 and computes
    exactly what it computes without one."""
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "1" if fused else "0")
    batch = make_batch([9, 30, 17], [1, 1, 1], group=3, seed=11)
    h = batch.q.shape[1]
    inp = _fused_rope_inputs(batch, "signal", partials=True, qk_norm=True)
    meta = (batch.query_start_loc, batch.seq_lens, batch.block_tables)
    kc0, vc0 = batch.k_cache.clone(), batch.v_cache.clone()
    ref = ta.rope_store_paged_attention(inp, h, kc0, vc0, *meta, max_query_len=1)
    sig = torch.zeros(4, dtype=torch.int32)
    kc1, vc1 = batch.k_cache.clone(), batch.v_cache.clone()
    out = ta.rope_store_paged_attention(inp._replace(signal=sig[2:3]), h, kc1, vc1, *meta, max_query_len=1)
    assert sig.tolist() == [0, 0, 1, 0]
    assert torch.equal(out, ref)
    torch.testing.assert_close(kc1, kc0, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc1, vc0, rtol=0, atol=0, equal_nan=True)


def test_prefetch_kernel_compiles_for_sm90() -> None:
    """The prefetch kernel as the H200 / H100 run it: a volatile spin on the flag bounded by %globaltimer, then line
    prefetches into L2 (with the evict_last hint under policy=last), no spills; the attention kernel's trigger is one
    predicated store."""
    out = run_script(
        """
from sm90 import compile_sm90
from specserve.layers.l2_prefetch import _prefetcher_kernel
import specserve.layers.triton_attention as ta
for last in (False, True):
    k, reg, stack = compile_sm90(_prefetcher_kernel, {"flags_ptr": "i32", "ev_ptr": "i64"},
                                 {"LANES": 128, "EVICT_LAST": last, "SLEEP_NS": 500}, 1, 1)
    ptx = k.asm["ptx"]
    assert stack == 0, stack
    assert "ld.volatile.global" in ptx and "%globaltimer" in ptx and "nanosleep.u32 500" in ptx, ptx[:2000]
    hint = "prefetch.global.L2::evict_last" in ptx
    assert "prefetch.global.L2" in ptx and hint == last
    print(last, reg, stack)
print("OK")
"""
    )
    assert out.count("0\n") >= 2


def test_attention_prefetch_programs_compile_for_sm90() -> None:
    """site=attn: the Qwen3-8B decode attention (one kernel with rope_store, 8 split-K partials) with its extra
    prefetch programs, after (PF=1) or before (PF=2) their wait, compiles without spills; the programs' line
    prefetches are in the PTX."""
    run_script(
        """
import specserve.layers.triton_attention as ta
from sm90 import compile_sm90
attn_ptrs = dict(q_ptr="bf16", k_cache_ptr="bf16", v_cache_ptr="bf16", out_ptr="bf16", part_out_ptr="fp32",
                 part_lse_ptr="fp32", counter_ptr="i32", qsl_ptr="i32", seq_lens_ptr="i32", bt_ptr="i32",
                 qkv_ptr="bf16", pos_ptr="i64", cos_ptr="fp32", sin_ptr="fp32", qw_ptr="bf16", kw_ptr="bf16",
                 slot_ptr="i64")
cfg = ta.select_attention_config(32, 8, 128, 1)
base = dict(HEAD_DIM=128, BLOCK_D=128, GROUP=4, QT=cfg.queries_per_tile, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_SIZE=16, CAUSAL=True, WINDOW=0, NUM_SPLITS=16, FUSED_MERGE=False, PRECISION="tf32",
            UPCAST=False, PDL=True, ROPE=True, NUM_HEADS=32, NUM_KV_HEADS=8, R_PAD=2, QK_NORM=True, MODE=1,
            NSPLIT=8, SIGNAL=True)
ptrs = dict(attn_ptrs, qkv_ptr="fp32", signal_ptr="i32", pf_ptr="u8")
for pf, last in ((0, False), (1, False), (2, True)):
    k, reg, stack = compile_sm90(ta._paged_attn_kernel, ptrs, dict(base, PF=pf, PF_EVICT_LAST=last),
                                 cfg.num_warps, cfg.num_stages, floats=("qk_scale", "eps"),
                                 not_divisible=("stride_bt", "pf_b", "pf_slices"))
    ptx = k.asm["ptx"]
    assert stack == 0, (pf, stack)
    assert ("prefetch.global.L2" in ptx) == (pf > 0) and ("evict_last" in ptx) == last, pf
    assert "griddepcontrol.wait" in ptx
    print(pf, reg, stack)
print("OK")
"""
    )


def test_engine_leaves_it_out_of_cpu_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setting on, a CPU model builds no prefetcher and passes no signal (the prefetcher is for captured CUDA
    steps), and a bad setting is not read there either."""
    from specserve.models.llama import _l2_prefetcher

    monkeypatch.setenv(l2.ENV, "o=1")
    layers = torch.nn.ModuleList()
    assert _l2_prefetcher(layers, torch.zeros(1, 8), {"o": 2, "down": 2}, 1) is None
    assert "_l2_prefetchers" not in layers.__dict__
