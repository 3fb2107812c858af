#!/usr/bin/env python
"""Random sampling inside the CUDA graphs vs greedy (random weights, batch 8, 128 tokens): tok/s and how many steps
ran on the graph path (and of those, sampling in the graph), plain and DFlash K=15.

    python benchmarks/sampling_in_graph.py CONFIG_DIR [DFLASH_DIR]
"""

from __future__ import annotations

import sys
import time

from specserve import LLM, SamplingParams


def main() -> int:
    cfg = sys.argv[1]
    dflash = sys.argv[2] if len(sys.argv) > 2 else "specserve/assets/smollm2-135m-dflash"
    for spec in (None, {"method": "dflash", "model": dflash, "num_speculative_tokens": 15}):
        llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=8,
                  enable_prefix_caching=False, speculative_config=spec)  # fmt: skip
        r = llm.engine.runner
        prompts = [{"prompt_token_ids": list(range(100 + i, 140 + i))} for i in range(8)]
        for temp in (0.0, 0.8):
            sp = SamplingParams(temperature=temp, max_tokens=128, ignore_eos=True)
            llm.generate(prompts[:1], SamplingParams(temperature=temp, max_tokens=8))
            s0, f0, t0 = r.num_sampling_steps, r.num_fast_steps, time.perf_counter()
            n = sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, sp))
            dt = time.perf_counter() - t0
            print(f"{'plain' if spec is None else 'dflash K=15'} T={temp} batch 8: {n / dt:.0f} tok/s, "
                  f"graph steps {r.num_fast_steps - f0} (sampling {r.num_sampling_steps - s0})", flush=True)  # fmt: skip
        del llm
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
