"""The eager CPU layers' cheaper forms (session 30): RMSNorm as one ``F.rms_norm`` in float32, RoPE with a sign-folded
sin table (q and k heads rotated together where there is no q/k norm; cos / sin rows shared by the layers of one
forward), and the torch attention backend's per-forward plan (host lists, gather indices, masks built once per
AttnMetadata). Each gives the values of the form it replaced, checked against transformers' modules where they exist
and against the uncached computation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

import specserve.layers.attention_ref as attention_ref
from specserve.config import ModelConfig
from specserve.layers.attention import AttnMetadata, TorchAttentionBackend
from specserve.layers.attention_ref import paged_attention_ref, store_kv_ref
from specserve.layers.norm import RMSNorm
from specserve.layers.rotary import RotaryEmbedding
from specserve.models.llama import Attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_transformers_bit_for_bit(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    for dim, rows, scale in [(64, 1, 1.0), (576, 3, 50.0), (1536, 17, 1e-3)]:
        ours, ref = RMSNorm(dim, 1e-5), LlamaRMSNorm(dim, eps=1e-5)
        w = torch.randn(dim)
        ours.weight.data, ref.weight.data = w.to(dtype), w.to(dtype)
        x = (torch.randn(rows, 2, dim) * scale).to(dtype)[:, 1]  # a non-contiguous input
        assert torch.equal(ours(x), ref(x)), (dim, rows, dtype)


def test_rope_equals_transformers_and_shares_rows_only_while_positions_are_unchanged() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(64, 512, 10000.0)
    pos = torch.tensor([0, 5, 77, 300])
    q, k = torch.randn(4, 6, 64), torch.randn(4, 2, 64)
    rq, rk = rope(pos, q, k)
    cos, sin = rope.cos[pos], rope.sin[pos]
    eq, ek = _hf_rope(q, k, cos, sin)
    assert torch.equal(rq, eq) and torch.equal(rk, ek)
    # the second layer of a forward reuses the rows; a positions buffer refilled in place gets fresh ones
    assert torch.equal(rope.rotate(pos, q), rq)
    pos[:] = torch.tensor([1, 2, 3, 4])
    cos2, sin2 = rope.cos[pos], rope.sin[pos]
    eq2, _ = _hf_rope(q, k, cos2, sin2)
    assert torch.equal(rope.rotate(pos, q), eq2)
    assert torch.equal(rope.rotate(pos.clone(), q.bfloat16()), rope.rotate(pos, q.bfloat16()))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_attention_projection_equals_split_then_rotate(qk_norm: bool) -> None:
    torch.manual_seed(0)
    hf = LlamaConfig(
        hidden_size=96, num_attention_heads=6, num_key_value_heads=2, head_dim=16, intermediate_size=64,
        num_hidden_layers=1, vocab_size=50,
    )  # fmt: skip
    cfg = dataclasses.replace(ModelConfig.from_hf(hf), qk_norm=qk_norm)
    rope = RotaryEmbedding(16, 64, 10000.0)
    attn = Attention(cfg, rope)
    if qk_norm:
        attn.q_norm.weight.data.normal_()
        attn.k_norm.weight.data.normal_()
    x, pos = torch.randn(5, 96), torch.tensor([3, 4, 5, 6, 9])
    q, k, v = attn.project_qkv(x, pos)
    ql, kl, vl = attn.qkv_proj(x).split([96, 32, 32], dim=-1)
    ql, kl = ql.reshape(5, 6, 16), kl.reshape(5, 2, 16)
    if qk_norm:
        ql, kl = attn.q_norm(ql), attn.k_norm(kl)
    eq, ek = _hf_rope(ql, kl, rope.cos[pos], rope.sin[pos])
    assert torch.equal(q, eq) and torch.equal(k, ek)
    assert torch.equal(v, vl.reshape(5, 2, 16))


def _hf_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """transformers' apply_rotary_pos_emb on our [T, heads, D] layout (its own: [batch, heads, T, D])."""
    eq, ek = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    return eq[0].transpose(0, 1), ek[0].transpose(0, 1)


def _paged(seq_lens: list[int], q_lens: list[int], block_size: int = 16, seed: int = 0):
    """Random K/V in NaN-filled caches through shuffled block tables (reads past a request's keys poison the output)."""
    g = torch.Generator().manual_seed(seed)
    nbs = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(nbs) + 2
    kc = torch.full((num_blocks, block_size, 2, 16), float("nan"))
    vc = kc.clone()
    perm = torch.randperm(num_blocks, generator=g)
    bt = torch.full((len(seq_lens), max(nbs) + 1), -1, dtype=torch.int32)
    used = 0
    for b, (s, nb) in enumerate(zip(seq_lens, nbs)):
        bt[b, :nb] = perm[used : used + nb].int()
        used += nb
        p = torch.arange(s)
        blk = bt[b, p // block_size].long()
        kc[blk, p % block_size] = torch.randn(s, 2, 16, generator=g)
        vc[blk, p % block_size] = torch.randn(s, 2, 16, generator=g)
    qsl = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), 6, 16, generator=g)
    return q, kc, vc, qsl, torch.tensor(seq_lens, dtype=torch.int32), bt


@pytest.mark.parametrize("mode", [None, "batched", "per_request"])
@pytest.mark.parametrize(
    "seq_lens,q_lens",
    [([40], [1]), ([40], [4]), ([33, 50, 20, 47], [1, 1, 1, 1]), ([33, 50, 20, 47], [4, 4, 0, 4])],
)
def test_attention_plan_is_reused_per_metadata_and_rebuilt_when_stale(
    seq_lens, q_lens, mode, monkeypatch
) -> None:
    monkeypatch.setattr(attention_ref, "_FORCE_MODE", mode)
    q, kc, vc, qsl, seq, bt = _paged(seq_lens, q_lens)
    meta = AttnMetadata(qsl, seq, bt, torch.zeros(q.shape[0], dtype=torch.long), max(q_lens), max(seq_lens))
    backend = TorchAttentionBackend()
    for causal in (True, False):
        expected = paged_attention_ref(q, kc, vc, qsl, seq, bt, causal=causal)
        assert not expected.isnan().any()
        for _layer in range(3):  # the first call builds the plan, the others reuse it
            out = backend.attend(q, kc, vc, meta, causal=causal, sliding_window=None, scale=16**-0.5)
            assert torch.equal(out, expected)
    plans = meta.derived
    assert len(plans) == 2  # one per (causal, ...) key
    # a metadata tensor modified in place (here: one request's keys shortened) is noticed
    seq[0] -= 7
    expected = paged_attention_ref(q, kc, vc, qsl, seq, bt, causal=True)
    assert torch.equal(
        backend.attend(q, kc, vc, meta, causal=True, sliding_window=None, scale=16**-0.5), expected
    )
    # rows past the last request's queries stay zero
    qx = torch.cat([q, torch.randn(2, 6, 16)])
    out = paged_attention_ref(qx, kc, vc, qsl, seq, bt, causal=True, plan_cache={})
    assert torch.equal(out[: q.shape[0]], expected) and not out[q.shape[0] :].any()


def test_store_kv_on_strided_caches() -> None:
    k, v = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    slots = torch.tensor([17, -1, 2])
    both = torch.zeros(4, 16, 2, 2, 16)  # K and V interleaved: each cache a non-contiguous view
    kc, vc = both[:, :, :, 0], both[:, :, :, 1]
    store_kv_ref(k, v, kc, vc, slots)
    assert (
        torch.equal(kc[1, 1], k[0])
        and torch.equal(vc[0, 2], v[2])
        and int((both != 0).any(-1).sum()) == 2 * 2 * 2
    )
    kc2, vc2 = torch.zeros(4, 16, 2, 16), torch.zeros(4, 16, 2, 16)
    store_kv_ref(k, v, kc2, vc2, slots)
    assert torch.equal(kc2, kc) and torch.equal(vc2, vc)


def test_attention_over_strided_caches_equals_contiguous() -> None:
    q, kc, vc, qsl, seq, bt = _paged([40, 23], [3, 1])
    both = torch.stack([kc, vc], 3)  # [blocks, block_size, Hk, 2, D]: each cache a non-contiguous view
    ks, vs = both[:, :, :, 0], both[:, :, :, 1]
    assert not ks.is_contiguous()
    for causal in (True, False):
        expected = paged_attention_ref(q, kc, vc, qsl, seq, bt, causal=causal)
        assert torch.equal(paged_attention_ref(q, ks, vs, qsl, seq, bt, causal=causal), expected)


@pytest.mark.parametrize(
    "seq_lens,q_lens,batched",
    [
        ([150, 150], [1, 1], True),  # similar decodes: one padded SDPA call
        ([50, 100, 200, 400], [4, 4, 4, 4], True),  # 2x padding of short verify blocks still pays
        ([300, 300, 300, 300], [256, 1, 1, 1], False),  # a prefill chunk beside decodes: per request
        ([150], [1], False),  # one request
    ],
)
def test_attention_batches_requests_by_the_padding_budget(seq_lens, q_lens, batched) -> None:
    q, kc, vc, qsl, seq, bt = _paged(seq_lens, q_lens)
    cache: dict = {}
    paged_attention_ref(q, kc, vc, qsl, seq, bt, plan_cache=cache)
    (plan,) = cache.values()
    assert (plan.batched is not None) == batched
