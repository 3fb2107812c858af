"""Greedy tokens, Qwen3-8B shape (random weights, float32, graphs): the fused rope_store+attention kernel on vs off,
plain vs DFlash K=15 vs EAGLE-3 K=7 (random drafters): all identical. SmolLM2 shape bf16: graphs vs --enforce-eager
identical with the fused kernel (plain, DFlash K=15 with the bundled drafter)."""
import gc, os, sys
from pathlib import Path
import torch
sys.path.insert(0, "benchmarks")
from step_latency import write_drafters
from specserve import LLM, SamplingParams
df, ea = write_drafters(Path("/root/drafters"))
prompts = [{"prompt_token_ids": torch.randint(1000, 100000, (64,), generator=torch.Generator().manual_seed(i)).tolist()} for i in range(4)]
sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
res = {}
for name, spec, fused in [("plain", None, "1"), ("plain-unfused", None, "0"),
                          ("dflash15", {"method": "dflash", "model": df, "num_speculative_tokens": 15}, "1"),
                          ("eagle3_7", {"method": "eagle3", "model": ea, "num_speculative_tokens": 7}, "1")]:
    os.environ["SPECSERVE_FUSED_ROPE_ATTN"] = fused
    llm = LLM(".bench/qwen3-8b", load_format="dummy", dtype="float32", device="cuda", max_model_len=1024, max_num_seqs=4,
              speculative_config=spec, enable_prefix_caching=False, gpu_memory_utilization=0.7)
    res[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    m = llm.get_metrics() if spec else {}
    print(name, "drafts", m.get("spec_decode_num_drafts"), "accepted", m.get("spec_decode_num_accepted_tokens"), flush=True)
    del llm
    gc.collect(); torch.cuda.empty_cache()
for k in res:
    print(f"8B fp32 {k}: identical to plain (fused): {res[k] == res['plain']}")
os.environ["SPECSERVE_FUSED_ROPE_ATTN"] = "1"
sp = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
prompts = [{"prompt_token_ids": torch.randint(100, 40000, (40,), generator=torch.Generator().manual_seed(i)).tolist()} for i in range(4)]
dfl = {"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}
for name, spec in [("plain", None), ("dflash15", dfl)]:
    outs = {}
    for eager in (False, True):
        llm = LLM(".bench/smollm2", load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=1024, max_num_seqs=4,
                  speculative_config=spec, enforce_eager=eager, gpu_memory_utilization=0.3)
        outs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
        del llm
        gc.collect(); torch.cuda.empty_cache()
    print(f"SmolLM2 shape bf16 {name}: graphs == enforce_eager for 128 tokens: {outs[False] == outs[True]}", flush=True)
