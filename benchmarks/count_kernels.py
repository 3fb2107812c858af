"""CUDA kernels per decoder layer in one decode step, fused path vs eager torch ops (both on the Triton attention
backend), from torch.profiler. Per layer = (kernels with 2L layers - kernels with L layers) / L, so embedding,
final norm and anything outside the layers cancel out. Random weights; SmolLM2-135M shape by default.

    python benchmarks/count_kernels.py [--config-dir DIR] [--qwen3] [--batch 1] [--context 128] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json

import torch

from specserve.config import ModelConfig
from specserve.layers.attention import AttnMetadata, TritonAttentionBackend
from specserve.models.llama import DecoderLM
from specserve.runner.model_runner import init_dummy_weights

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: the values check only (TRITON_INTERPRET=1)


def smollm2(qwen3: bool) -> ModelConfig:
    return ModelConfig(
        architecture="Qwen3ForCausalLM" if qwen3 else "LlamaForCausalLM",
        model_type="qwen3" if qwen3 else "llama",
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        rms_norm_eps=1e-5,
        rope_theta=1e5,
        rope_scaling=None,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attention_bias=False,
        qk_norm=qwen3,
    )


def build(cfg: ModelConfig, layers: int, dtype: torch.dtype, fused: bool, blocks: int) -> DecoderLM:
    cfg = dataclasses.replace(cfg, num_hidden_layers=layers)
    prev = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(DEV):
            model = DecoderLM(cfg, max_position=4096)
    finally:
        torch.set_default_dtype(prev)
    init_dummy_weights(model)
    model.eval().requires_grad_(False)
    backend = TritonAttentionBackend()
    backend.fused = fused
    model.backend = backend
    shape = (blocks, 16, cfg.num_key_value_heads, cfg.head_dim)
    model.kv_caches = [
        (torch.zeros(shape, dtype=dtype, device=DEV), torch.zeros(shape, dtype=dtype, device=DEV))
        for _ in range(layers)
    ]
    return model


def decode_inputs(
    batch: int, context: int, max_seq_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, AttnMetadata, int]:
    """``batch`` requests decoding their token at position ``context`` (KV for 0..context in the cache).

    ``max_seq_len``: the host bound the attention picks its split count from (default the true length; the
    engine's graphs pass the model's max length)."""
    per = context // 16 + 1
    dev = DEV
    pos = torch.full((batch,), context, dtype=torch.long, device=dev)
    tables = torch.arange(batch * per, dtype=torch.int32, device=dev).view(batch, per)
    slots = tables[:, context // 16].long() * 16 + context % 16
    meta = AttnMetadata(
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device=dev),
        seq_lens=torch.full((batch,), context + 1, dtype=torch.int32, device=dev),
        block_tables=tables,
        slot_mapping=slots,
        max_query_len=1,
        max_seq_len=max_seq_len or context + 1,
    )
    return torch.zeros(batch, dtype=torch.long, device=dev), pos, meta, batch * per


@torch.inference_mode()
def kernels(
    model: DecoderLM, ids: torch.Tensor, pos: torch.Tensor, meta: AttnMetadata
) -> collections.Counter:
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # Triton compiles, cuBLAS heuristics
        model(ids, pos, meta)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(ids, pos, meta)
        torch.cuda.synchronize()
    return collections.Counter(
        e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", default=None, help="HF config.json dir (default: SmolLM2-135M shape)")
    ap.add_argument("--qwen3", action="store_true", help="default shape with Qwen3 q/k norm")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2, help="L of the 2L - L difference")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = ap.parse_args()
    if args.config_dir:
        import transformers

        cfg = ModelConfig.from_hf(transformers.AutoConfig.from_pretrained(args.config_dir))
    else:
        cfg = smollm2(args.qwen3)
    dtype = getattr(torch, args.dtype)
    ids, pos, meta, blocks = decode_inputs(args.batch, args.context)
    report: dict[str, object] = {"model": cfg.architecture, "batch": args.batch, "context": args.context}
    for name, fused in (("unfused", False), ("fused", True)) if DEV == "cuda" else ():
        n = args.layers
        small = kernels(build(cfg, n, dtype, fused, blocks), ids, pos, meta)
        big = kernels(build(cfg, 2 * n, dtype, fused, blocks), ids, pos, meta)
        per_layer = {k: (big[k] - small[k]) / n for k in big if big[k] != small[k]}
        report[name] = {
            "kernels_per_layer": sum(per_layer.values()),
            "outside_layers": sum(small.values()) - n * sum(per_layer.values()),
            "per_layer_by_name": dict(sorted(per_layer.items(), key=lambda kv: -kv[1])),
        }
        print(f"{name}: {sum(per_layer.values()):.1f} kernels per layer", flush=True)
    # values: the same weights (init_dummy_weights is seeded) through both paths, a multi-token prefill then a
    # decode step, so the fused K/V store is read back by the next step's attention
    with torch.inference_mode():
        outs = {}
        for name, fused in (("unfused", False), ("fused", True)):
            model = build(cfg, args.layers, dtype, fused, blocks)
            seq = args.context + 1
            pre_ids = torch.randint(0, cfg.vocab_size, (seq,), generator=torch.Generator().manual_seed(0))
            pre_meta = AttnMetadata(
                query_start_loc=torch.tensor([0, seq - 1], dtype=torch.int32, device=DEV),
                seq_lens=torch.tensor([seq - 1], dtype=torch.int32, device=DEV),
                block_tables=meta.block_tables[:1],
                slot_mapping=torch.arange(seq - 1, device=DEV),
                max_query_len=seq - 1,
                max_seq_len=seq - 1,
            )
            model(pre_ids[:-1].to(DEV), torch.arange(seq - 1, device=DEV), pre_meta)
            h = model(
                pre_ids[-1:].to(DEV),
                pos[:1],
                dataclasses.replace(
                    meta,
                    query_start_loc=meta.query_start_loc[:2],
                    seq_lens=meta.seq_lens[:1],
                    block_tables=meta.block_tables[:1],
                    slot_mapping=meta.slot_mapping[:1],
                ),
            )
            h = h[0] if isinstance(h, tuple) else h
            outs[name] = (
                h.float(),
                model.compute_logits(h).float().argmax(-1),
                model.kv_caches[0][0].float(),
            )
        (hu, au, ku), (hf, af, kf) = outs["unfused"], outs["fused"]
        rel = float((hu - hf).abs().max() / hu.abs().max().clamp_min(1e-6))
        kv = float((ku - kf).abs().max())
        report["values"] = {
            "hidden_max_rel_diff": rel,
            "kv_max_abs_diff": kv,
            "argmax_equal": bool((au == af).all()),
        }
        print(
            f"fused vs unfused values: hidden max rel diff {rel:.2e}, KV max abs diff {kv:.2e}, "
            f"argmax equal {bool((au == af).all())}",
            flush=True,
        )
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
