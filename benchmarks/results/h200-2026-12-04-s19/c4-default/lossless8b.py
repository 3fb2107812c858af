"""Greedy tokens, Qwen3-8B shape (random weights): float32 with graphs, the residual-add epilogues at one-row steps
(SPECSERVE_FUSED_NORM default auto) vs off, plain at batch 1 and 4, DFlash K=15 and EAGLE-3 K=7 (random drafters) at
batch 1: all identical to plain with the default. bf16 at batch 1: graphs == --enforce-eager for 128 tokens."""
import gc
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, "benchmarks")
from step_latency import write_drafters  # noqa: E402

from specserve import LLM, SamplingParams  # noqa: E402

cfg = sys.argv[1]
df, ea = write_drafters(Path("/root/drafters"))
prompts = [{"prompt_token_ids": torch.randint(1000, 100000, (64,), generator=torch.Generator().manual_seed(i)).tolist()} for i in range(4)]
sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
res = {}
for name, spec, mode in [("plain", None, "auto"), ("plain-fused-norm-off", None, "0"),
                         ("dflash15", {"method": "dflash", "model": df, "num_speculative_tokens": 15}, "auto"),
                         ("eagle3_7", {"method": "eagle3", "model": ea, "num_speculative_tokens": 7}, "auto")]:
    os.environ["SPECSERVE_FUSED_NORM"] = mode
    llm = LLM(cfg, load_format="dummy", dtype="float32", device="cuda", max_model_len=1024, max_num_seqs=4,
              speculative_config=spec, enable_prefix_caching=False, gpu_memory_utilization=0.7)
    res[name] = [o.outputs[0].token_ids for o in llm.generate(prompts[:1], sp)]
    if spec is None:
        res[name + "-b4"] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    m = llm.get_metrics() if spec else {}
    print(name, "drafts", m.get("spec_decode_num_drafts"), "accepted", m.get("spec_decode_num_accepted_tokens"), flush=True)
    del llm
    gc.collect(); torch.cuda.empty_cache()
for k in res:
    ref = res["plain-b4"] if k.endswith("-b4") else res["plain"]
    print(f"8B fp32 {k}: identical to plain (default): {res[k] == ref}")
os.environ["SPECSERVE_FUSED_NORM"] = "auto"
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
outs = {}
for eager in (False, True):
    llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=1024, max_num_seqs=1,
              enforce_eager=eager, enable_prefix_caching=False, gpu_memory_utilization=0.5)
    outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts[:1], sp)]
    del llm
    gc.collect(); torch.cuda.empty_cache()
print(f"8B bf16 plain batch 1: graphs == enforce_eager for 128 tokens: {outs[False] == outs[True]}", flush=True)
