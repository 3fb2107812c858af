"""Fused Triton kernels (add+RMSNorm, q/k-norm+RoPE+KV store, SiLU-mul; interpreted on CPU) vs the torch ops
they replace, and the fused model path vs the torch path: logits, taps, KV caches, greedy generations."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # must be set before triton decorates the kernels

import importlib

import pytest
import torch

pytest.importorskip("triton")

from specserve.config import ModelConfig  # noqa: E402
from specserve.layers import triton_fused as tf  # noqa: E402
from specserve.layers.attention import AttnMetadata, TorchAttentionBackend, TritonAttentionBackend  # noqa: E402
from specserve.layers.attention_ref import store_kv_ref  # noqa: E402
from specserve.layers.norm import RMSNorm  # noqa: E402
from specserve.layers.rotary import RotaryEmbedding  # noqa: E402
from specserve.models.llama import MLP, Attention, DecoderLM  # noqa: E402
from specserve.runner.model_runner import init_dummy_weights  # noqa: E402

if type(tf._rms_norm_kernel).__name__ != "InterpretedFunction":
    # Imported earlier in this process without TRITON_INTERPRET: re-decorate the kernels for the interpreter.
    tf = importlib.reload(tf)

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def assert_ulp_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """fp32: tight tolerance (reduction order differs); bf16/fp16: equal or 1 ulp apart, rarely."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
        return
    a, e = actual.view(torch.int16).int(), expected.view(torch.int16).int()
    diff = (a - e).abs()
    assert int(diff.max()) <= 1, f"max {int(diff.max())} ulps apart"
    assert float((diff > 0).float().mean()) < 0.01, "too many elements 1 ulp off"


def rand(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def model_config(qwen3: bool, head_dim: int = 16, **kw) -> ModelConfig:
    base = dict(
        architecture="Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLM",
        model_type="qwen3" if qwen3 else "llama",
        vocab_size=128,
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=1e6 if qwen3 else 1e4,
        rope_scaling=None if qwen3 else LLAMA3_SCALING,
        max_position_embeddings=256,
        tie_word_embeddings=not qwen3,
        attention_bias=False,
        qk_norm=qwen3,
    )
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------- RMSNorm


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_and_fused_add(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(rand((96,), dtype, g, 0.3) + 1)
    x = rand((9, 96), dtype, g, 2.0)
    res = rand((9, 96), dtype, g, 4.0)
    assert_ulp_close(tf.rms_norm(x, norm.weight, norm.eps), norm(x))
    out, new_res = tf.fused_add_rms_norm(x, res, norm.weight, norm.eps)
    h = res + x  # the torch path: h = h + attn(...) in the model dtype
    assert torch.equal(new_res, h)
    assert_ulp_close(out, norm(h))
    # leading dims and an empty batch
    x3 = rand((2, 3, 96), dtype, g)
    assert_ulp_close(tf.rms_norm(x3, norm.weight, norm.eps), norm(x3))
    assert tf.rms_norm(x[:0], norm.weight, norm.eps).shape == (0, 96)


# --------------------------------------------------------------------------------------------- rope_store


ROPE_CASES = [
    # dtype, head_dim, qk_norm, heads, kv_heads, rope scaling
    (torch.float32, 64, False, 6, 2, LLAMA3_SCALING),
    (torch.float32, 128, True, 4, 4, None),
    (torch.bfloat16, 64, True, 9, 3, None),
    (torch.bfloat16, 128, False, 8, 2, LLAMA3_SCALING),
    (torch.float16, 64, True, 4, 1, None),
]


@pytest.mark.parametrize("dtype,head_dim,qk_norm,heads,kv_heads,scaling", ROPE_CASES)
def test_rope_store_matches_project_qkv_and_store(dtype, head_dim, qk_norm, heads, kv_heads, scaling) -> None:
    g = torch.Generator().manual_seed(head_dim + heads)
    cfg = model_config(
        qk_norm,
        head_dim=head_dim,
        hidden_size=32,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        rope_scaling=scaling,
        attention_bias=not qk_norm,
    )
    rope = RotaryEmbedding(head_dim, 600, cfg.rope_theta, cfg.rope_scaling)
    attn = Attention(cfg, rope).to(dtype)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            p.copy_(rand(tuple(p.shape), dtype, g, 0.3) + (1.0 if "norm" in name else 0.0))
    t, block_size, num_blocks = 11, 8, 6
    x = rand((t, 32), dtype, g)
    positions = torch.tensor([5, 0, 599, 77, 78, 300, 3, 3, 511, 128, 64])  # not contiguous, repeats
    slots = torch.randperm(num_blocks * block_size, generator=g)[:t]
    slots[[1, 6]] = -1
    caches = [torch.full((num_blocks, block_size, kv_heads, head_dim), -7.0, dtype=dtype) for _ in range(4)]
    with torch.no_grad():
        q_ref, k_ref, v_ref = attn.project_qkv(x, positions)  # the torch path's exact code
        store_kv_ref(k_ref, v_ref, caches[0], caches[1], slots)
        qn, kn = attn.q_norm, attn.k_norm
        q = tf.rope_store(
            attn.qkv_proj(x),
            positions,
            rope.cos,
            rope.sin,
            qn.weight if qn is not None else None,
            kn.weight if kn is not None else None,
            cfg.rms_norm_eps,
            caches[2],
            caches[3],
            slots.to(torch.int32),
            heads,
            kv_heads,
            head_dim,
        )
    assert q.shape == (t, heads, head_dim)
    assert_ulp_close(q, q_ref)
    assert_ulp_close(caches[2], caches[0])
    assert torch.equal(caches[3], caches[1])  # v is copied as is
    # slot -1 rows wrote nothing: exactly t - 2 slots changed
    changed = (caches[2] != -7.0).any(-1).any(-1)
    assert int(changed.sum()) == t - 2


def test_rope_store_validates_shapes() -> None:
    rope = RotaryEmbedding(64, 16, 1e4)
    kc = torch.zeros(2, 16, 2, 64)
    qkv = torch.zeros(3, 8 * 64)
    pos = torch.zeros(3, dtype=torch.long)
    with pytest.raises(ValueError):
        tf.rope_store(qkv, pos, rope.cos, rope.sin, None, None, 1e-6, kc, kc.clone(), pos, 4, 1, 64)  # width
    with pytest.raises(ValueError):
        tf.rope_store(qkv, pos[:2], rope.cos, rope.sin, None, None, 1e-6, kc, kc.clone(), pos, 4, 2, 64)
    with pytest.raises(ValueError):
        w = torch.ones(64)
        tf.rope_store(qkv, pos, rope.cos, rope.sin, w, None, 1e-6, kc, kc.clone(), pos, 4, 2, 64)
    q = tf.rope_store(
        qkv[:0], pos[:0], rope.cos, rope.sin, None, None, 1e-6, kc, kc.clone(), pos[:0], 4, 2, 64
    )
    assert q.shape == (0, 4, 64)


# ------------------------------------------------------------------------------------------------ SiLU-mul


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_mlp(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(3)
    mlp = MLP(32, 1100).to(dtype)  # > one 1024-wide column block
    with torch.no_grad():
        for p in mlp.parameters():
            p.copy_(rand(tuple(p.shape), dtype, g, 0.2))
    x = rand((3, 32), dtype, g, 2.0)
    with torch.no_grad():
        gu = mlp.gate_up_proj(x)
        gate, up = gu.split(1100, dim=-1)
        assert_ulp_close(tf.silu_mul(gu, 1100), torch.nn.functional.silu(gate) * up)
        assert_ulp_close(mlp.forward_fused(x), mlp(x))


# ------------------------------------------------------------------------------------------- whole model


class Batch:
    """Two requests through one prefill step (q_len 9 and 5) and one decode step, plus a padding row (slot -1)."""

    def __init__(self, block_size: int = 8) -> None:
        g = torch.Generator().manual_seed(5)
        self.block_size = block_size
        self.tables = [[3, 0], [1, 4]]
        self.prompts = [torch.randint(0, 128, (9,), generator=g), torch.randint(0, 128, (5,), generator=g)]

    def slot(self, b: int, pos: int) -> int:
        return self.tables[b][pos // self.block_size] * self.block_size + pos % self.block_size

    def step(self, new: list[list[int]], starts: list[int], pad: bool = False):  # type: ignore[no-untyped-def]
        ids, pos, slots, qsl, seq = [], [], [], [0], []
        for b, (toks, s) in enumerate(zip(new, starts)):
            ids += toks
            pos += list(range(s, s + len(toks)))
            slots += [self.slot(b, p) for p in range(s, s + len(toks))]
            qsl.append(qsl[-1] + len(toks))
            seq.append(s + len(toks))
        tables = list(self.tables)
        if pad:  # a padded request, as the CUDA-graph path adds: position 0, no KV write, seq_len 0
            ids, pos, slots = ids + [0], pos + [0], slots + [-1]
            qsl.append(qsl[-1] + 1)
            seq.append(0)
            tables.append([0, 0])
        meta = AttnMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),
            seq_lens=torch.tensor(seq, dtype=torch.int32),
            block_tables=torch.tensor(tables, dtype=torch.int32),
            slot_mapping=torch.tensor(slots, dtype=torch.int64),
            max_query_len=max(qsl[i + 1] - qsl[i] for i in range(len(seq))),
            max_seq_len=max(seq),
        )
        return torch.tensor(ids), torch.tensor(pos), meta


def build_model(cfg: ModelConfig, dtype: torch.dtype, backend, taps: list[int]) -> DecoderLM:  # type: ignore[no-untyped-def]
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = DecoderLM(cfg, max_position=64)
    finally:
        torch.set_default_dtype(prev)
    init_dummy_weights(model, seed=0, std=0.15)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(rand(tuple(p.shape), dtype, g, 0.2) + 1)
    model.eval().requires_grad_(False)
    model.backend = backend
    model.tap_indices = taps
    shape = (6, 8, cfg.num_key_value_heads, cfg.head_dim)
    model.kv_caches = [
        (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in model.layers
    ]
    return model


def fused_backend(kind: str):  # type: ignore[no-untyped-def]
    backend = TorchAttentionBackend() if kind == "torch" else TritonAttentionBackend()
    backend.fused = True
    return backend


@pytest.mark.parametrize(
    "qwen3,dtype,attn",
    [
        (True, torch.float32, "triton"),
        (False, torch.float32, "triton"),
        (True, torch.float32, "torch"),
        (True, torch.bfloat16, "torch"),
    ],
)
def test_fused_model_path_matches_torch_path(qwen3: bool, dtype: torch.dtype, attn: str) -> None:
    cfg = model_config(qwen3)
    taps = [3, 0, 2]  # unsorted, includes the embeddings and the stack's output
    ref = build_model(cfg, dtype, TorchAttentionBackend(), taps)
    fused = build_model(cfg, dtype, fused_backend(attn), taps)
    assert not ref.backend.fused and fused.backend.fused
    batch = Batch()
    steps = [
        batch.step([p.tolist() for p in batch.prompts], [0, 0]),
        batch.step([[7], [11]], [9, 5], pad=True),
        batch.step([[1, 2, 3], [4]], [10, 6]),  # a verify-like block and a decode
    ]
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 0.1, "rtol": 0.05}
    for ids, pos, meta in steps:
        h_ref, aux_ref = ref(ids, pos, meta)
        h, aux = fused(ids, pos, meta)
        assert aux is not None and aux_ref is not None and aux.shape == aux_ref.shape == (len(ids), 3 * 48)
        rows = meta.slot_mapping >= 0  # the padded row attends to nothing; only real rows are compared
        torch.testing.assert_close(aux[rows], aux_ref[rows], **tol)
        torch.testing.assert_close(h[rows], h_ref[rows], **tol)
        logits, logits_ref = fused.compute_logits(h[rows]), ref.compute_logits(h_ref[rows])
        torch.testing.assert_close(logits.float(), logits_ref.float(), **tol)
        if dtype == torch.float32:
            assert torch.equal(logits.argmax(-1), logits_ref.argmax(-1))
        # the embeddings tap is the same tensor value in both paths
        assert torch.equal(aux[:, 48:96], aux_ref[:, 48:96])
    for (kc, vc), (kr, vr) in zip(fused.kv_caches, ref.kv_caches):
        torch.testing.assert_close(kc, kr, **tol)
        torch.testing.assert_close(vc, vr, **tol)


@pytest.mark.parametrize("attn", ["torch", "triton"])
def test_dflash_drafter_fused_path(attn: str) -> None:
    """The DFlash drafter's layers (non-causal, one sliding-window layer) on the fused kernels."""
    from specserve.models.dflash import DFlashDraftModel

    raw = {
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 4,
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 2]},
    }
    model = DFlashDraftModel(raw, target_hidden=48, max_position=64)
    init_dummy_weights(model, seed=2, std=0.15)
    model.eval().requires_grad_(False)
    batch = Batch()
    g = torch.Generator().manual_seed(9)
    embeds = rand((9 + 5, 48), torch.float32, g)
    _, pos, meta = batch.step([p.tolist() for p in batch.prompts], [0, 0])
    meta.causal = False
    outs = []
    for backend in (TorchAttentionBackend(), fused_backend(attn)):
        caches = [(torch.zeros(6, 8, 2, 16), torch.zeros(6, 8, 2, 16)) for _ in range(2)]
        outs.append((model(embeds, pos, meta, caches, backend), caches))
    (ref, ref_caches), (out, caches) = outs
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)
    for (kc, vc), (kr, vr) in zip(caches, ref_caches):
        torch.testing.assert_close(kc, kr, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(vc, vr, atol=1e-5, rtol=1e-5)


def test_llm_greedy_triton_backend_fused_on_cpu(tiny2_qwen3_dir, monkeypatch) -> None:
    from specserve import LLM, SamplingParams

    monkeypatch.delenv("SPECSERVE_FUSED_KERNELS", raising=False)  # the default: fused on the triton backend

    prompts = ["The capital of France is", "1 2 3 4 5 6"]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outs = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            tiny2_qwen3_dir, dtype="float32", device="cpu", attention_backend=backend, num_gpu_blocks=16
        )
        assert llm.engine.runner.backend.fused == (backend == "triton")
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    assert outs["triton"] == outs["torch"]
    monkeypatch.setenv("SPECSERVE_FUSED_KERNELS", "0")  # the opt-out
    llm = LLM(tiny2_qwen3_dir, dtype="float32", device="cpu", attention_backend="triton", num_gpu_blocks=16)
    assert not llm.engine.runner.backend.fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transposed", [False, True])
def test_dflash_context_kv_store_fused(dtype: torch.dtype, transposed: bool) -> None:
    """The DFlash context K/V (fc, hidden norm, the stacked K/V GEMM, k norm, RoPE, store into every layer's
    cache) on the fused kernels (one ``rope_store`` with no q heads per layer) equals the eager ops'; slot -1
    rows write nothing; the transposed weight layout computes the same."""
    from specserve.models.dflash import DFlashDraftModel

    raw = {
        "hidden_size": 48,
        "intermediate_size": 80,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1e6,
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": [1, 2]},
    }
    torch.manual_seed(0)
    model = DFlashDraftModel(raw, target_hidden=48, max_position=64).to(dtype)
    init_dummy_weights(model, seed=3, std=0.15)
    model.stack_context_weights()
    model.eval().requires_grad_(False)
    g = torch.Generator().manual_seed(4)
    feats = rand((7, 96), dtype, g)
    pos = torch.tensor([3, 4, 5, 6, 20, 21, 40])
    slots = torch.tensor([3, 4, -1, 6, 17, -1, 40])
    caches = {}
    for name, backend in (("ref", TorchAttentionBackend()), ("fused", fused_backend("triton"))):
        if name == "fused" and transposed:
            model.transpose_weights()
            model.transpose_weights()  # idempotent
            assert model.ctx_kv_weight.shape == (48, 3 * 2 * 2 * 16)
        caches[name] = [
            (torch.zeros(6, 8, 2, 16, dtype=dtype), torch.zeros(6, 8, 2, 16, dtype=dtype)) for _ in range(3)
        ]
        model.store_context_kv(feats, pos, slots, caches[name], backend)
    k_ref, v_ref = model.context_kv(feats, pos)  # the eager values, [L, N, n_kv, hd]
    written = slots >= 0
    for layer, ((kc, vc), (kr, vr)) in enumerate(zip(caches["fused"], caches["ref"])):
        flat_k, flat_v = kc.view(-1, 2, 16), vc.view(-1, 2, 16)
        assert torch.count_nonzero(flat_k.abs().sum((1, 2))) == int(written.sum())  # nothing at slot -1
        if dtype == torch.float32:
            torch.testing.assert_close(kc, kr, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(vc, vr, atol=1e-5, rtol=1e-5)
        else:
            assert_ulp_close(flat_k[slots[written]], k_ref[layer][written])
            assert_ulp_close(flat_v[slots[written]], v_ref[layer][written])
            assert_ulp_close(kc, kr)
            assert_ulp_close(vc, vr)
