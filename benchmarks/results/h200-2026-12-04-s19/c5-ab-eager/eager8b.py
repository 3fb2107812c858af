"""Qwen3-8B shape, bf16, random weights, batch 1: greedy tokens with graphs == --enforce-eager for 128 tokens with
the default SPECSERVE_FUSED_NORM (auto: the residual-add epilogues at one-row steps)."""
import gc
import sys

import torch

from specserve import LLM, SamplingParams

cfg = sys.argv[1]
prompts = [{"prompt_token_ids": torch.randint(1000, 100000, (64,), generator=torch.Generator().manual_seed(0)).tolist()}]
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
outs = {}
for eager in (False, True):
    llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=512, max_num_seqs=1,
              enforce_eager=eager, enable_prefix_caching=False, gpu_memory_utilization=0.5)
    outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    print("eager" if eager else "graphs", outs[eager][0][:12], flush=True)
    del llm
    gc.collect(); torch.cuda.empty_cache()
print(f"8B bf16 plain batch 1: graphs == enforce_eager for 128 tokens: {outs[False] == outs[True]}", flush=True)
