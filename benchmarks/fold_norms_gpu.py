"""GPU check of ``SPECSERVE_FOLD_NORMS`` (the layers' RMSNorm weights folded into qkv / gate_up at load, fused-norm
mode 3 at one-row steps: no norm / SiLU-mul kernels between the layers): greedy tokens with and without the fold.

    python benchmarks/fold_norms_gpu.py --config-dir DIR [--layers 4] [--dtype float32] [--tokens 64]

DIR holds a Qwen3-8B config.json and tokenizer files; the target keeps its shapes with ``--layers`` decoder layers
and random weights (``load_format="dummy"``) whose norm weights are drawn from U(0.5, 1.5) (the dummy loader's are
ones, which would make the fold a no-op). Per setting (fold 0 / 1, CUDA graphs / ``--enforce-eager``) one engine
generates ``--tokens`` greedy tokens for 4 random prompts at batch 1 (one request at a time: the one-row steps
that take mode 3) and at batch 4; prints whether each equals the unfolded graphs' tokens and the common prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", required=True)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import specserve.runner.model_runner as mr
    from specserve import LLM, SamplingParams

    real_init = mr.init_dummy_weights

    @torch.no_grad()
    def init(model: torch.nn.Module, seed: int = 0, std: float = 0.02) -> None:
        real_init(model, seed, std)
        g = torch.Generator(device=next(model.parameters()).device).manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight")):
                p.copy_(0.5 + torch.rand(p.shape, generator=g, device=p.device))

    mr.init_dummy_weights = init
    tmp = Path(tempfile.mkdtemp())
    for f in Path(args.config_dir).iterdir():
        shutil.copy(f, tmp / f.name)
    cfg = json.loads((tmp / "config.json").read_text())
    cfg["num_hidden_layers"] = args.layers
    (tmp / "config.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    prompts = [
        {"prompt_token_ids": torch.randint(1000, 100000, (96,), generator=g).tolist()} for _ in range(4)
    ]
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    rows, ref = [], {}
    for fold, eager in (("0", False), ("1", False), ("1", True)):
        os.environ["SPECSERVE_FOLD_NORMS"] = fold
        llm = LLM(str(tmp), load_format="dummy", dtype=args.dtype, device="cuda", max_model_len=1024,
                  max_num_seqs=4, enable_prefix_caching=False, gpu_memory_utilization=0.5,
                  enforce_eager=eager)  # fmt: skip
        folded = llm.engine.runner.model.norms_folded
        for batch in (1, 4):
            if batch == 1:
                toks = [llm.generate([p], sp)[0].outputs[0].token_ids for p in prompts]
            else:
                toks = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
            base = ref.setdefault(batch, toks)
            common = sum(
                next((i for i, (x, y) in enumerate(zip(a, r)) if x != y), len(a)) for a, r in zip(toks, base)
            ) / sum(len(a) for a in toks)
            row = {"fold": fold, "folded": folded, "enforce_eager": eager, "batch": batch, "dtype": args.dtype,
                   "layers": args.layers, "same_as_unfolded": toks == base, "common_prefix": round(common, 3)}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
        del llm
        torch.cuda.empty_cache()
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
