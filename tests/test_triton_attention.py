"""Paged attention / KV store: torch reference vs a dense oracle, and the Triton kernels (interpreted on CPU)
vs both."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import importlib
import math
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("triton")

from specserve.layers import attention_ref  # noqa: E402
from specserve.layers import triton_attention as ta  # noqa: E402
from specserve.layers.attention_ref import paged_attention_ref, store_kv_ref  # noqa: E402

if type(ta._paged_attn_kernel).__name__ != "InterpretedFunction":
    # Imported earlier in this process without TRITON_INTERPRET: re-decorate the kernels for the interpreter.
    ta = importlib.reload(ta)


# ------------------------------------------------------------------------------------------------ helpers


@dataclass
class Batch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    k_dense: list[torch.Tensor]  # per request [seq_len, n_kv, hd]
    v_dense: list[torch.Tensor]
    q_lens: list[int]
    seq_lens_list: list[int]


def make_batch(
    seq_lens: list[int],
    q_lens: list[int],
    *,
    n_kv: int = 2,
    group: int = 1,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> Batch:
    """Random K/V per request scattered into NaN-filled caches through a shuffled (non-contiguous) block table.

    Unused slots are NaN and unused block-table entries point far out of range, so any read beyond a request's
    visible KV poisons the output or faults.
    """
    g = torch.Generator().manual_seed(seed)
    n_blocks = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(n_blocks) + 3
    max_blocks = max(n_blocks + [1]) + 2
    k_cache = torch.full((num_blocks, block_size, n_kv, head_dim), float("nan"), dtype=dtype)
    v_cache = k_cache.clone()
    perm = torch.randperm(num_blocks, generator=g)
    block_tables = torch.full((len(seq_lens), max_blocks), num_blocks + 1000, dtype=torch.int32)
    k_dense, v_dense = [], []
    used = 0
    for b, (s, nb) in enumerate(zip(seq_lens, n_blocks)):
        block_tables[b, :nb] = perm[used : used + nb].to(torch.int32)
        used += nb
        kd = torch.randn(s, n_kv, head_dim, generator=g).to(dtype)
        vd = torch.randn(s, n_kv, head_dim, generator=g).to(dtype)
        pos = torch.arange(s)
        blk = block_tables[b, pos // block_size].long()
        k_cache[blk, pos % block_size] = kd
        v_cache[blk, pos % block_size] = vd
        k_dense.append(kd)
        v_dense.append(vd)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    q = torch.randn(sum(q_lens), n_kv * group, head_dim, generator=g).to(dtype)
    return Batch(
        q, k_cache, v_cache, qsl, torch.tensor(seq_lens, dtype=torch.int32), block_tables, k_dense, v_dense,
        list(q_lens), list(seq_lens),
    )  # fmt: skip


def dense_oracle(
    batch: Batch, *, causal: bool = True, sliding_window: int | None = None, scale: float | None = None
) -> torch.Tensor:
    """Independent float64 attention over contiguous per-request K/V with explicit repeat of KV heads."""
    t, h, d = batch.q.shape
    scale = d**-0.5 if scale is None else scale
    out = torch.zeros(t, h, d, dtype=torch.float64)
    start = 0
    for ql, s, kd, vd in zip(batch.q_lens, batch.seq_lens_list, batch.k_dense, batch.v_dense):
        if ql == 0:
            continue
        group = h // kd.shape[1]
        q = batch.q[start : start + ql].double()
        k = kd.double().repeat_interleave(group, dim=1)
        v = vd.double().repeat_interleave(group, dim=1)
        for j in range(ql):
            pos = s - ql + j
            vis = [
                kp
                for kp in range(s)
                if (not causal or kp <= pos) and (sliding_window is None or kp > pos - sliding_window)
            ]
            if not vis:
                continue
            idx = torch.tensor(vis)
            scores = torch.einsum("hd,khd->hk", q[j], k[idx]) * scale
            out[start + j] = torch.einsum("hk,khd->hd", scores.softmax(-1), v[idx])
        start += ql
    return out


def run_triton(batch: Batch, **kw) -> torch.Tensor:
    kw.setdefault("max_query_len", max(batch.q_lens + [1]))
    return ta.paged_attention(
        batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, **kw
    )


def run_ref(batch: Batch, **kw) -> torch.Tensor:
    return paged_attention_ref(
        batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens, batch.block_tables, **kw
    )


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert not torch.isnan(actual).any(), "NaN in output: a read went past the visible KV"
    torch.testing.assert_close(actual.double(), expected.double(), **tol(dtype))


# ------------------------------------------------------------------------------------------------ store_kv


@pytest.mark.parametrize("dtype,head_dim", [(torch.float32, 64), (torch.bfloat16, 128), (torch.float32, 80)])
def test_store_kv_matches_ref(dtype: torch.dtype, head_dim: int) -> None:
    g = torch.Generator().manual_seed(1)
    n_kv, n_q, block_size, num_blocks = 3, 6, 16, 6
    t = 11
    # k/v as strided views of a fused qkv projection output, like the model produces them.
    qkv = torch.randn(t, n_q + 2 * n_kv, head_dim, generator=g).to(dtype)
    k, v = qkv[:, n_q : n_q + n_kv], qkv[:, n_q + n_kv :]
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[[2, 7]] = -1
    caches = [torch.full((num_blocks, block_size, n_kv, head_dim), -7.0, dtype=dtype) for _ in range(4)]
    ta.store_kv(k, v, caches[0], caches[1], slots)
    store_kv_ref(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    flat_k = caches[0].view(-1, n_kv, head_dim)
    valid = slots >= 0
    assert torch.equal(flat_k[slots[valid]], k[valid])
    assert torch.equal(caches[1].view(-1, n_kv, head_dim)[slots[valid]], v[valid])
    # -1 slots wrote nothing: exactly t - 2 slots changed.
    changed = (flat_k != -7.0).any(-1).any(-1)
    assert int(changed.sum()) == t - 2


def test_store_kv_int32_slots_block_size_32_and_empty() -> None:
    k = torch.randn(4, 2, 64)
    v = torch.randn(4, 2, 64)
    kc, vc = torch.zeros(3, 32, 2, 64), torch.zeros(3, 32, 2, 64)
    slots = torch.tensor([95, 0, -1, 33], dtype=torch.int32)
    ta.store_kv(k, v, kc, vc, slots)
    assert torch.equal(kc[2, 31], k[0]) and torch.equal(vc[0, 0], v[1]) and torch.equal(kc[1, 1], k[3])
    assert int((kc != 0).any(-1).any(-1).sum()) == 3
    ta.store_kv(k[:0], v[:0], kc, vc, slots[:0])  # no tokens: no launch, no error
    with pytest.raises(ValueError):
        ta.store_kv(k, v, kc, vc, slots[:3])


# ------------------------------------------------------------------------------------------------ reference

REF_CASES = [
    # (seq_lens, q_lens, group, causal, window)
    ([5, 37, 64], [1, 1, 1], 1, True, None),  # decode
    ([12, 40], [5, 5], 3, True, None),  # spec verify causal
    ([12, 40], [5, 5], 3, False, None),  # spec verify non-causal (DFlash drafter)
    ([23], [7], 1, True, None),  # prefill chunk with context
    ([30, 17, 9, 12, 0], [10, 1, 5, 0, 2], 3, True, None),  # mixed + q_len 0 + padded seq_len 0
    ([40, 20], [6, 1], 3, True, 8),  # sliding window
    ([40, 20], [6, 3], 1, False, 8),  # sliding window, non-causal
    ([150, 140, 9], [150, 1, 1], 3, True, None),  # long prefill + decodes
    (
        [20 + 3 * i for i in range(17)],
        [1] * 16 + [0],
        3,
        True,
        None,
    ),  # many similar decodes (heuristic: batched)
]


@pytest.mark.parametrize("mode", ["batched", "per_request"])
@pytest.mark.parametrize("seq_lens,q_lens,group,causal,window", REF_CASES)
def test_reference_matches_dense_oracle(
    seq_lens: list[int],
    q_lens: list[int],
    group: int,
    causal: bool,
    window: int | None,
    mode: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(attention_ref, "_FORCE_MODE", mode)
    batch = make_batch(seq_lens, q_lens, group=group, seed=len(seq_lens))
    out = run_ref(batch, causal=causal, sliding_window=window)
    assert out.dtype == batch.q.dtype and out.shape == batch.q.shape
    assert_close(out, dense_oracle(batch, causal=causal, sliding_window=window), torch.float32)


@pytest.mark.parametrize("mode", ["batched", "per_request"])
def test_reference_bf16_custom_scale_and_block_size_32(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_ref, "_FORCE_MODE", mode)
    batch = make_batch([33, 70], [4, 2], group=2, head_dim=128, block_size=32, dtype=torch.bfloat16, seed=5)
    out = run_ref(batch, scale=0.05)
    assert out.dtype == torch.bfloat16
    assert_close(out, dense_oracle(batch, scale=0.05), torch.bfloat16)


# ------------------------------------------------------------------------------------------------ Triton

TRITON_CASES = {
    # name: (seq_lens, q_lens, make_batch kwargs, paged_attention kwargs)
    "decode_b3_gqa3": ([5, 37, 64], [1, 1, 1], {"group": 3}, {}),
    "decode_b3_split4": ([5, 37, 64], [1, 1, 1], {"group": 3}, {"num_splits": 4}),
    "verify_causal_gqa1_hd128": ([12, 40], [5, 5], {"head_dim": 128}, {}),
    "verify_noncausal_gqa3": ([12, 40], [5, 5], {"group": 3}, {"causal": False}),
    "verify_bucket_max_q8": ([12, 40], [5, 5], {"group": 3}, {"max_query_len": 8}),
    "prefill_chunk_q7_s23": ([23], [7], {"group": 3}, {}),
    "mixed_padded": ([30, 17, 9, 12, 0], [10, 1, 5, 0, 2], {"group": 3}, {}),
    "mixed_padded_split3": ([30, 17, 9, 12, 0], [10, 1, 5, 0, 2], {"group": 3}, {"num_splits": 3}),
    "sliding_window": ([40, 20], [6, 1], {"group": 3}, {"sliding_window": 8}),
    "sliding_window_noncausal_split2": (
        [40, 20],
        [6, 3],
        {},
        {"sliding_window": 8, "causal": False, "num_splits": 2},
    ),
    "hd80_bs32": ([33, 7], [3, 1], {"head_dim": 80, "block_size": 32, "group": 3}, {}),
    "bf16_decode_hd128": ([5, 37, 64], [1, 1, 1], {"dtype": torch.bfloat16, "head_dim": 128, "group": 3}, {}),
    "bf16_mixed_split2": (
        [30, 17, 9, 0],
        [10, 1, 5, 1],
        {"dtype": torch.bfloat16, "group": 3},
        {"num_splits": 2},
    ),
    "bf16_noncausal_bs32": ([20, 45], [5, 5], {"dtype": torch.bfloat16, "block_size": 32}, {"causal": False}),
    # 32 splits over at most 2 KV tiles of 64 (as in a CUDA graph bucket sized for the model's max length): most
    # splits are empty; a q_len 0 request, a padded request (seq_len 0) and seq_lens that are tile multiples.
    "mostly_empty_split32": (
        [100, 128, 30, 64, 0],
        [1, 3, 0, 1, 2],
        {"group": 3},
        {"num_splits": 32},
    ),
}

# Split cases run with both split merges (SPECSERVE_ATTN_MERGE); the others never merge.
_TRITON_PARAMS = [
    pytest.param(name, merge, id=f"{name}-{merge}" if "num_splits" in TRITON_CASES[name][3] else name)
    for name in TRITON_CASES
    for merge in (("fused", "kernel") if "num_splits" in TRITON_CASES[name][3] else ("fused",))
]


@pytest.mark.parametrize("name,merge", _TRITON_PARAMS)
def test_paged_attention_matches_ref_and_oracle(
    name: str, merge: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ta.MERGE_ENV, merge)
    seq_lens, q_lens, batch_kw, attn_kw = TRITON_CASES[name]
    batch = make_batch(seq_lens, q_lens, seed=sum(map(ord, name)), **batch_kw)
    dtype = batch.q.dtype
    # NaN-filled output: every covered row must be written (by the last split of its group when fused).
    out = run_triton(batch, out=torch.full_like(batch.q, float("nan")), **attn_kw)
    assert out.shape == batch.q.shape and out.dtype == dtype
    ref_kw = {k: v for k, v in attn_kw.items() if k in ("causal", "sliding_window")}
    assert_close(out, run_ref(batch, **ref_kw), dtype)
    assert_close(out, dense_oracle(batch, **ref_kw), dtype)
    # Queries of padded requests (seq_len 0) output exactly zero.
    start = 0
    for ql, s in zip(q_lens, seq_lens):
        if s == 0:
            assert torch.count_nonzero(out[start : start + ql]) == 0
        start += ql


def test_paged_attention_strided_q_out_buffer_and_scale() -> None:
    batch = make_batch([19, 50], [3, 1], group=2, seed=11)
    t, h, d = batch.q.shape
    qkv = torch.randn(t, h + 4, d)
    qkv[:, :h] = batch.q
    batch.q = qkv[:, :h]  # non-contiguous view, as sliced from a fused qkv output
    out_buf = torch.full((t, h, d), 3.0)
    out = run_triton(batch, out=out_buf, scale=0.1)
    assert out is out_buf
    assert_close(out, dense_oracle(batch, scale=0.1), torch.float32)


@pytest.mark.parametrize("num_splits", [None, 4])
def test_paged_attention_replay_with_new_metadata_in_place(num_splits: int | None) -> None:
    """Same static args and buffers, metadata rewritten in place (what a CUDA-graph replay sees); with splits,
    the number of used splits per group changes between the calls (fused merge counters are reused)."""
    first = make_batch([9, 30, 4], [5, 5, 5], group=3, seed=21)
    out = torch.empty_like(first.q)
    meta = (first.query_start_loc.clone(), first.seq_lens.clone(), first.block_tables.clone())
    cfg = ta.AttentionConfig(block_m=16, block_n=16, queries_per_tile=5, num_warps=4, num_stages=2)
    kw = {"max_query_len": 5, "max_seq_len": 64, "out": out, "num_splits": num_splits, "config": cfg}
    ta.paged_attention(first.q, first.k_cache, first.v_cache, *meta, **kw)
    assert_close(out, dense_oracle(first), torch.float32)
    # Next step: request 0 accepted 2 tokens, request 1 is now a 1-token decode, request 2 became padding.
    second = make_batch([11, 31, 0], [5, 1, 1], group=3, seed=22)
    qsl, sl, bt = meta
    qsl.copy_(second.query_start_loc[: qsl.numel()])
    sl.copy_(second.seq_lens)
    bt[:, : second.block_tables.shape[1]].copy_(second.block_tables)
    q = torch.zeros_like(first.q)
    q[: second.q.shape[0]] = second.q
    out.fill_(float("nan"))
    ta.paged_attention(q, second.k_cache, second.v_cache, qsl, sl, bt, **kw)
    assert_close(out[: second.q.shape[0]], dense_oracle(second), torch.float32)


def test_fused_split_merge_repeatable_and_resets_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several query tiles per request and uneven used-split counts: the fused merge equals the two-kernel
    merge to fp32 rounding, a second identical call (counters reused) gives bit-identical output, and every
    arrival counter is back at 0 after each call (else the next launch or graph replay would never merge)."""
    batch = make_batch([70, 33, 0, 16, 49], [10, 5, 1, 0, 9], group=2, seed=31)
    cfg = ta.AttentionConfig(block_m=16, block_n=16, queries_per_tile=4, num_warps=4, num_stages=2)
    kw = {"num_splits": 4, "config": cfg, "max_query_len": 10}  # 3 query tiles; 1..4 KV tiles per split

    def call(merge: str) -> torch.Tensor:
        monkeypatch.setenv(ta.MERGE_ENV, merge)
        return run_triton(batch, out=torch.full_like(batch.q, float("nan")), **kw)

    fused = call("fused")
    counters = ta._merge_counters(batch.q.device, 1)
    n_groups = 5 * 2 * 3  # B * num_kv_heads * query tiles
    assert counters.numel() >= max(ta._MIN_COUNTERS, n_groups)
    assert torch.count_nonzero(counters) == 0
    assert_close(fused, dense_oracle(batch), torch.float32)
    assert torch.equal(call("fused"), fused)
    assert torch.count_nonzero(counters) == 0
    torch.testing.assert_close(fused, call("kernel"), atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match=ta.MERGE_ENV):
        call("bogus")
    monkeypatch.delenv(ta.MERGE_ENV)
    assert ta._merge_mode() == "kernel"  # the default: the fused merge measured slower on the H200


@pytest.mark.parametrize("merge", ["kernel", "fused"])
def test_split_merge_ignores_stale_scratch(merge: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The split partials live in uninitialised memory (a graph pool's, reused by every layer and step): with
    the scratch NaN-poisoned before each call, both merges still give the oracle's output: every split the merge
    reads wrote its rows (an empty split its zeros and lse -inf for the merge kernel; the fused merge reads only
    the used ones). A second call on the same poisoned buffers, with fewer used splits, too."""
    monkeypatch.setenv(ta.MERGE_ENV, merge)
    made: list[torch.Tensor] = []

    def poisoned(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not made:
            made.extend(t.fill_(float("nan")) for t in ta_split_scratch(*args))
        return made[0], made[1]

    ta_split_scratch = ta._split_scratch
    monkeypatch.setattr(ta, "_split_scratch", poisoned)
    cfg = ta.AttentionConfig(block_m=16, block_n=16, queries_per_tile=4, num_warps=4, num_stages=2)
    kw = {"num_splits": 8, "config": cfg, "max_query_len": 10}
    first = make_batch([70, 33, 0, 16, 49], [10, 5, 1, 0, 9], group=2, seed=33)
    out = run_triton(first, out=torch.full_like(first.q, float("nan")), **kw)
    assert_close(out, dense_oracle(first), torch.float32)
    # 1-2 KV tiles: 6-7 empty splits
    second = make_batch([20, 9, 0, 5, 17], [10, 5, 1, 0, 9], group=2, seed=34)
    for t in made:
        t.fill_(float("nan"))
    out = run_triton(second, out=torch.full_like(second.q, float("nan")), **kw)
    assert_close(out, dense_oracle(second), torch.float32)


def test_fused_split_merge_one_counter_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter runs programs one after another, so counters shared by two groups would go unnoticed:
    poison one group's counter and check that exactly that group's rows (request, query tile, heads of its KV
    head) are left unmerged, and only its counter stays off 0."""
    monkeypatch.setenv(ta.MERGE_ENV, "fused")
    batch = make_batch([70, 33, 0, 16, 49], [10, 5, 1, 0, 9], group=2, seed=32)
    cfg = ta.AttentionConfig(block_m=16, block_n=16, queries_per_tile=4, num_warps=4, num_stages=2)
    counters = ta._merge_counters(batch.q.device, 1)
    b, kvh, q_tile, hk, q_tiles = (
        4,
        1,
        1,
        2,
        3,
    )  # request 4, queries 4..7: up to 48 keys, 3 KV tiles: 3 used splits
    g = (b * hk + kvh) * q_tiles + q_tile
    try:
        counters[g] = 1000  # never reaches used - 1: that group's last split does not merge
        out = run_triton(
            batch, out=torch.full_like(batch.q, float("nan")), num_splits=4, config=cfg, max_query_len=10
        )
        left = torch.nonzero(counters).flatten().tolist()
        assert left == [g] and int(counters[g]) == 1000 + 3
    finally:
        counters.zero_()
    tok0 = int(batch.query_start_loc[b]) + 4 * q_tile
    unmerged = torch.zeros(out.shape[:2], dtype=torch.bool)
    unmerged[tok0 : tok0 + 4, kvh * 2 : kvh * 2 + 2] = True
    assert torch.isnan(out).all(-1).eq(unmerged).all()
    expected = dense_oracle(batch)
    torch.testing.assert_close(out[~unmerged].double(), expected[~unmerged], **tol(torch.float32))


def test_paged_attention_rejects_bad_shapes() -> None:
    batch = make_batch([10], [2], group=2)
    with pytest.raises(ValueError, match="head_dim"):
        ta.paged_attention(
            batch.q[..., :32], batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, max_query_len=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="dtype"):
        ta.paged_attention(
            batch.q.double(), batch.k_cache, batch.v_cache, batch.query_start_loc, batch.seq_lens,
            batch.block_tables, max_query_len=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="metadata"):
        ta.paged_attention(
            batch.q, batch.k_cache, batch.v_cache, batch.query_start_loc[:1], batch.seq_lens,
            batch.block_tables, max_query_len=2,
        )  # fmt: skip


@pytest.mark.parametrize(
    "num_heads,num_kv_heads,head_dim,max_query_len",
    [
        (32, 8, 128, 1),
        (32, 8, 128, 5),
        (9, 3, 64, 16),
        (9, 3, 64, 1),
        (16, 16, 80, 1),
        (32, 8, 128, 2048),
        (8, 1, 256, 3),
    ],
)
def test_select_attention_config_packs_queries_and_heads(
    num_heads: int, num_kv_heads: int, head_dim: int, max_query_len: int
) -> None:
    cfg = ta.select_attention_config(num_heads, num_kv_heads, head_dim, max_query_len)
    group = num_heads // num_kv_heads
    assert cfg.block_m >= 16 and cfg.block_m & (cfg.block_m - 1) == 0
    assert cfg.queries_per_tile >= 1 and cfg.queries_per_tile * group <= cfg.block_m
    # Decode / verify buckets fit one query tile, so K/V are read once per KV head.
    if max_query_len * group <= 64:
        assert cfg.queries_per_tile >= max_query_len
    assert math.ceil(max_query_len / cfg.queries_per_tile) >= 1
    # No splits off-GPU (the CPU interpreter gains nothing from them).
    assert ta._pick_num_splits(torch.device("cpu"), 8, cfg.block_n, 4096, max_query_len) == 1
    # 8 warps for one-query tiles of heads padded to >= 128 and for 128-row tiles (measured faster on H100s), else 4
    wide = cfg.block_m >= 128 or (max_query_len == 1 and 1 << (head_dim - 1).bit_length() >= 128)
    assert cfg.num_warps == (8 if wide else 4)


def test_attention_warps_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECSERVE_ATTN_WARPS (and the norm / SiLU-mul knobs) override a launch's warps; bad values are rejected."""
    from specserve.layers.triton_fused import warps_setting

    monkeypatch.delenv("SPECSERVE_ATTN_WARPS", raising=False)
    assert warps_setting("SPECSERVE_ATTN_WARPS", 4) == 4
    monkeypatch.setenv("SPECSERVE_ATTN_WARPS", "8")
    assert warps_setting("SPECSERVE_ATTN_WARPS", 4) == 8
    monkeypatch.setenv("SPECSERVE_ATTN_WARPS", "3")
    with pytest.raises(ValueError, match="SPECSERVE_ATTN_WARPS must be 1, 2, 4, 8 or 16"):
        warps_setting("SPECSERVE_ATTN_WARPS", 4)


def test_split_count_heuristic_and_its_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flash-decoding splits on a (faked) 132-SM GPU: ~2 waves of programs, >= 2 KV tiles per split, a power of
    two, none for long query blocks; SPECSERVE_ATTN_MAX_SPLITS caps the count (a bad value is a clear error)."""
    monkeypatch.setattr(ta, "_sm_count", lambda index: 132)
    monkeypatch.delenv("SPECSERVE_ATTN_MAX_SPLITS", raising=False)
    cuda = torch.device("cuda", 0)
    assert ta._pick_num_splits(cuda, 8, 64, 2048 + 16, 1) == 16  # 8 KV heads: 33 -> 2048 / 128 keys -> 16
    assert ta._pick_num_splits(cuda, 3, 64, 8192, 1) == 64  # 88 wanted, at most 64
    assert ta._pick_num_splits(cuda, 8, 64, 300, 16) == 2  # a short maximum: 2 tiles per split
    assert ta._pick_num_splits(cuda, 132, 64, 8192, 1) == 1  # the grid fills the GPU already
    assert ta._pick_num_splits(cuda, 8, 64, 8192, 65) == 1  # prefill-sized query blocks
    monkeypatch.setenv("SPECSERVE_ATTN_MAX_SPLITS", "4")
    assert ta._pick_num_splits(cuda, 8, 64, 8192, 1) == 4 and ta.max_splits() == 4
    monkeypatch.setenv("SPECSERVE_ATTN_MAX_SPLITS", "3")
    assert ta._pick_num_splits(cuda, 8, 64, 8192, 1) == 2  # rounded down to a power of two
    monkeypatch.setenv("SPECSERVE_ATTN_MAX_SPLITS", "0")
    with pytest.raises(ValueError, match="SPECSERVE_ATTN_MAX_SPLITS"):
        ta._pick_num_splits(cuda, 8, 64, 8192, 1)


# ------------------------------------------------------------------------ rope_store + attention in one kernel

FUSED_ROPE_CASES = {
    # name: (seq_lens, q_lens, make_batch kwargs, kwargs of the attention call)
    "decode_b3_gqa4_qknorm": ([5, 37, 64], [1, 1, 1], {"group": 4, "n_kv": 2}, {}),
    "decode_split4": ([5, 37, 64], [1, 1, 1], {"group": 3}, {"num_splits": 4}),
    "verify_16_split3": ([40, 90], [16, 16], {"group": 3}, {"num_splits": 3}),
    "verify_noncausal_dflash_block": ([20, 45], [16, 16], {"group": 3}, {"causal": False, "num_splits": 2}),
    "mixed_padded_slot_minus1": ([30, 17, 9, 12, 0], [5, 1, 5, 0, 2], {"group": 3}, {"max_query_len": 8}),
    "mostly_empty_split32": ([100, 128, 30, 64, 0], [1, 3, 0, 1, 2], {"group": 3}, {"num_splits": 32}),
    "sliding_window_split2": ([40, 20], [6, 1], {"group": 3}, {"sliding_window": 8, "num_splits": 2}),
    "bf16_decode_hd128": ([5, 37, 64], [1, 1, 1], {"dtype": torch.bfloat16, "head_dim": 128, "group": 4}, {}),
    "bf16_verify_split2": ([30, 17, 9], [5, 5, 5], {"dtype": torch.bfloat16, "group": 3}, {"num_splits": 2}),
}


def _fused_rope_inputs(batch: Batch, name: str, partials: bool, qk_norm: bool):
    from specserve.layers.rotary import RotaryEmbedding

    g = torch.Generator().manual_seed(sum(map(ord, name)) + 7)
    t, h, d = batch.q.shape
    hk = batch.k_cache.shape[2]
    bs = batch.k_cache.shape[1]
    dtype = batch.q.dtype
    rope = RotaryEmbedding(d, 256, 10000.0, None)
    x = torch.randn(3, t, (h + 2 * hk) * d, generator=g)  # 3 split-K partials
    qkv = (x[0] + x[1] + x[2]).to(dtype)
    pos, slots = [], []
    for ql, sl, b in zip(batch.q_lens, batch.seq_lens_list, range(len(batch.q_lens))):
        for j in range(ql):
            p = sl - ql + j
            pos.append(max(p, 0))
            slots.append(int(batch.block_tables[b, p // bs]) * bs + p % bs if p >= 0 else -1)
    slot_t = torch.tensor(slots, dtype=torch.int64)
    if len(slots) > 2:
        slot_t[len(slots) // 2] = -1  # a padding row: writes nothing (keeps the cache's value there)
    qw = (torch.rand(d, generator=g) + 0.5).to(dtype) if qk_norm else None
    kw = (torch.rand(d, generator=g) + 0.5).to(dtype) if qk_norm else None
    template = torch.empty(1, dtype=dtype).expand(t, qkv.shape[1])
    return ta.RopeStoreInputs(
        template if partials else qkv, x if partials else None, torch.tensor(pos), rope.cos, rope.sin, qw, kw,
        1e-6, slot_t,
    )  # fmt: skip


@pytest.mark.parametrize("partials", [False, True])
@pytest.mark.parametrize("name", list(FUSED_ROPE_CASES))
def test_rope_store_attention_equals_rope_store_then_attention(
    name: str, partials: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-kernel rope_store + attention == ``rope_store`` then ``paged_attention``: the whole caches bit for bit
    (the new K/V rows written, slot -1 rows not) and the output, with q/k norm (Qwen3) or without, from the qkv rows
    or from split-K partials, with 1-32 KV splits (each writing the new rows of its own range)."""
    from specserve.layers.triton_fused import rope_store

    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "1")  # the one kernel for every case (not the auto rule's choice)
    seq_lens, q_lens, batch_kw, attn_kw = FUSED_ROPE_CASES[name]
    batch = make_batch(seq_lens, q_lens, seed=sum(map(ord, name)), **batch_kw)
    t, h, d = batch.q.shape
    kw = dict(attn_kw)
    kw.setdefault("max_query_len", max(q_lens))
    inp = _fused_rope_inputs(batch, name, partials, qk_norm=(len(name) + partials) % 2 == 0)
    meta = (batch.query_start_loc, batch.seq_lens, batch.block_tables)
    kc_ref, vc_ref = batch.k_cache.clone(), batch.v_cache.clone()
    q = rope_store(
        inp.qkv, inp.positions, inp.cos, inp.sin, inp.q_norm_weight, inp.k_norm_weight, inp.eps, kc_ref, vc_ref,
        inp.slot_mapping, h, batch.k_cache.shape[2], d, inp.partials,
    )  # fmt: skip
    ref = ta.paged_attention(q, kc_ref, vc_ref, *meta, **kw)
    kc, vc = batch.k_cache.clone(), batch.v_cache.clone()
    out = ta.rope_store_paged_attention(inp, h, kc, vc, *meta, **kw)
    assert out.shape == (t, h, d) and out.dtype == batch.q.dtype
    assert not torch.equal(kc_ref, batch.k_cache)  # the new rows were written
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vc, vc_ref, rtol=0, atol=0, equal_nan=True)
    # q's RMS sum adds its two rotate-half halves' sums (rope_store: one sum over the row): rstd may differ in
    # its last bit, so the output is compared at the dtype's tolerance (a wrong head / position / row is O(1))
    start = 0
    for ql in q_lens:  # rows of requests with queries (the others are unspecified in both)
        assert_close(out[start : start + ql], ref[start : start + ql], batch.q.dtype)
        start += ql


def test_rope_store_attention_falls_back_beyond_one_query_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill chunk longer than one query tile (and SPECSERVE_FUSED_ROPE_ATTN=0) take rope_store + the
    attention kernel: same results as the one-kernel path's contract."""
    from specserve.layers.triton_fused import rope_store

    batch = make_batch([90, 9], [60, 1], group=3, seed=5)
    t, h, d = batch.q.shape
    inp = _fused_rope_inputs(batch, "prefill", partials=False, qk_norm=True)
    meta = (batch.query_start_loc, batch.seq_lens, batch.block_tables)
    calls: list[int] = []
    real = ta._paged_attn_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                calls.append(int(kwargs.get("ROPE", False)))
                return real[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(ta, "_paged_attn_kernel", Spy())
    kc_ref, vc_ref = batch.k_cache.clone(), batch.v_cache.clone()
    q = rope_store(inp.qkv, inp.positions, inp.cos, inp.sin, inp.q_norm_weight, inp.k_norm_weight, inp.eps,
                   kc_ref, vc_ref, inp.slot_mapping, h, batch.k_cache.shape[2], d)  # fmt: skip
    ref = ta.paged_attention(q, kc_ref, vc_ref, *meta, max_query_len=60)
    kc, vc = batch.k_cache.clone(), batch.v_cache.clone()
    out = ta.rope_store_paged_attention(inp, h, kc, vc, *meta, max_query_len=60)
    assert calls == [
        0,
        0,
    ]  # the reference and the fallback: no one-kernel launch for a 60-query prefill (42 a tile)
    assert torch.equal(out, ref)
    torch.testing.assert_close(kc, kc_ref, rtol=0, atol=0, equal_nan=True)  # unused slots are NaN
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "0")
    out1 = ta.rope_store_paged_attention(
        inp, h, batch.k_cache.clone(), batch.v_cache.clone(), *meta, max_query_len=60
    )
    assert calls == [0, 0, 0] and torch.equal(out1, ref)
    monkeypatch.delenv(ta.FUSED_ROPE_ENV)
    dec = make_batch([9, 30], [1, 1], group=3, seed=6)
    dinp = _fused_rope_inputs(dec, "decode", partials=True, qk_norm=False)
    ta.rope_store_paged_attention(dinp, h, dec.k_cache, dec.v_cache, dec.query_start_loc, dec.seq_lens,
                                  dec.block_tables, max_query_len=1)  # fmt: skip
    assert calls[-1] == 1
    with pytest.raises(ValueError, match="num_heads must be"):
        ta.rope_store_paged_attention(dinp, h + 1, dec.k_cache, dec.v_cache, dec.query_start_loc, dec.seq_lens,
                                      dec.block_tables, max_query_len=1)  # fmt: skip
    with pytest.raises(ValueError, match="positions and slot_mapping"):
        bad = dinp._replace(positions=dinp.positions[:1])
        ta.rope_store_paged_attention(bad, h, dec.k_cache, dec.v_cache, dec.query_start_loc, dec.seq_lens,
                                      dec.block_tables, max_query_len=1)  # fmt: skip


def test_fused_rope_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECSERVE_FUSED_ROPE_ATTN: auto (default) = one-query steps and light q prologues (the Qwen3-8B shape's
    16-row verify over 8 split-K partials is not: measured slower on the H200), 1 / decode / 0, bad values rejected."""
    monkeypatch.delenv(ta.FUSED_ROPE_ENV, raising=False)
    assert ta.fused_rope_wanted(1, 4, 128, 8)  # Qwen3-8B decode
    assert not ta.fused_rope_wanted(16, 4, 128, 8)  # its verify
    assert ta.fused_rope_wanted(16, 3, 64, 3)  # SmolLM2's verify / DFlash block
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "1")
    assert ta.fused_rope_wanted(16, 4, 128, 8)
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "decode")
    assert ta.fused_rope_wanted(1, 4, 128, 8) and not ta.fused_rope_wanted(2, 1, 16, 1)
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "0")
    assert not ta.fused_rope_wanted(1, 1, 16, 1)
    monkeypatch.setenv(ta.FUSED_ROPE_ENV, "yes")
    with pytest.raises(ValueError, match="SPECSERVE_FUSED_ROPE_ATTN must be one of"):
        ta.fused_rope_wanted(1, 1, 16, 1)


_HOPPER_COMPILE_SCRIPT = r"""
import specserve.layers.triton_attention as ta
from sm90 import compile_sm90


def build(fn, ptrs, const, num_warps, num_stages=3, plain=("stride_bt", "num_kv_heads")):
    # Mimic the JIT's specialisation: pointers and strides divisible by 16 (true for real caches).
    k, reg, stack = compile_sm90(fn, ptrs, const, num_warps, num_stages, floats=("qk_scale", "eps"),
                                 not_divisible=plain)
    print(fn.__name__, const.get("BLOCK_M"), const.get("NUM_SPLITS"), const.get("FUSED_MERGE"), f"REG:{reg} STACK:{stack}")
    assert stack == 0, f"register spills: {fn.__name__} {const}"
    return k


attn_ptrs = dict(q_ptr="bf16", k_cache_ptr="bf16", v_cache_ptr="bf16", out_ptr="bf16", part_out_ptr="fp32",
                 part_lse_ptr="fp32", counter_ptr="i32", qsl_ptr="i32", seq_lens_ptr="i32", bt_ptr="i32",
                 qkv_ptr="bf16", pos_ptr="i64", cos_ptr="fp32", sin_ptr="fp32", qw_ptr="bf16", kw_ptr="bf16",
                 slot_ptr="i64")
# (num_heads, num_kv_heads, head_dim, max_query_len, num_splits, fused split merge, rope_store in the kernel:
# 0 no, else the qkv GEMM's split-K partials summed (1: its bf16 output))
for h, hk, d, qlen, splits, fused, rope in [
        (32, 8, 128, 1, 16, True, 0), (32, 8, 128, 1, 16, False, 0), (32, 8, 128, 5, 1, False, 0),
        (9, 3, 64, 16, 4, True, 0), (9, 3, 64, 16, 4, False, 0), (8, 1, 256, 3, 8, True, 0),
        (32, 8, 128, 2048, 1, False, 0), (32, 8, 128, 1, 16, False, 8), (32, 8, 128, 16, 4, False, 8),
        (9, 3, 64, 1, 4, False, 1), (9, 3, 64, 16, 4, False, 3)]:
    cfg = ta.select_attention_config(h, hk, d, qlen)
    const = dict(HEAD_DIM=d, BLOCK_D=d, GROUP=h // hk, QT=cfg.queries_per_tile, BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, BLOCK_SIZE=16, CAUSAL=True, WINDOW=0, NUM_SPLITS=splits, FUSED_MERGE=fused,
                 PRECISION="tf32", UPCAST=False, PDL=True, ROPE=rope > 0, NUM_HEADS=h, NUM_KV_HEADS=hk,
                 R_PAD=max(2, 1 << (cfg.queries_per_tile - 1).bit_length()), QK_NORM=rope > 0 and h == 32, MODE=1,
                 NSPLIT=max(rope, 1))
    ptrs = dict(attn_ptrs, qkv_ptr="fp32" if rope > 1 else "bf16")
    ptx = build(ta._paged_attn_kernel, ptrs, const, cfg.num_warps, cfg.num_stages).asm["ptx"]
    # fused split merge: one gpu-scope acq_rel arrival (after a CTA barrier), partials re-read through L2
    merge_ops = ("atom.global.gpu.acq_rel.add", "ld.global.cg")
    assert all((op in ptx) == (fused and splits > 1) for op in merge_ops), (h, d, splits, fused)
    # programmatic dependent launch: the kernel waits for its predecessor, then releases its successor
    assert "griddepcontrol.wait" in ptx and "griddepcontrol.launch_dependents" in ptx
# the merge at the warps the engine launches it with (merge_warps: one per 4096 fp32 values of its tile)
for d, splits in [(128, 16), (128, 32), (64, 64), (128, 64), (256, 64)]:
    build(ta._merge_splits_kernel, dict(part_out_ptr="fp32", part_lse_ptr="fp32", out_ptr="bf16"),
          dict(HEAD_DIM=d, BLOCK_D=d, NUM_SPLITS=splits, SPLITS_PAD=splits, PDL=True), ta.merge_warps(splits * d))
build(ta._store_kv_kernel, dict(k_ptr="bf16", v_ptr="bf16", k_cache_ptr="bf16", v_cache_ptr="bf16", slot_ptr="i64"),
      dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_H=8, BLOCK_SIZE=16, PDL=True), 4)
print("OK")
"""


def test_kernels_compile_for_hopper_without_spills() -> None:
    """The interpreter accepts code the compiler rejects: compile the GPU path for sm_90 (no GPU needed)."""
    from sm90 import run_script

    run_script(_HOPPER_COMPILE_SCRIPT)


def test_merge_warps(monkeypatch: pytest.MonkeyPatch) -> None:
    """One warp per 4096 fp32 values of the merge tile (at most 4), or the setting."""
    monkeypatch.delenv(ta.MERGE_WARPS_ENV, raising=False)
    assert [ta.merge_warps(t) for t in (2 * 16, 8 * 128, 32 * 128, 64 * 128, 64 * 256, 128 * 256)] == [
        1,
        1,
        1,
        2,
        4,
        4,
    ]
    monkeypatch.setenv(ta.MERGE_WARPS_ENV, "2")
    assert ta.merge_warps(32 * 128) == 2
    monkeypatch.setenv(ta.MERGE_WARPS_ENV, "3")
    with pytest.raises(ValueError, match=ta.MERGE_WARPS_ENV):
        ta.merge_warps(32 * 128)
