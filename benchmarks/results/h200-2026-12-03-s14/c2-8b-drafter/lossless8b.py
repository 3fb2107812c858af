# session 14: one request at a time (max_num_seqs=1): DFlash verify + drafter blocks of 16 rows take the split path
"""Greedy tokens of the Qwen3-8B shape (random weights, float32, graphs) with the session-13 default (Triton split-K
GEMMs + PDL): plain vs DFlash K=15 vs EAGLE-3 K=7 (random drafters) must be identical; also plain on cuBLAS."""
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
for name, spec, tg in [("plain", None, None), ("plain-cublas", None, "0"),
                       ("dflash15", {"method": "dflash", "model": df, "num_speculative_tokens": 15}, None),
                       ("eagle3_7", {"method": "eagle3", "model": ea, "num_speculative_tokens": 7}, None)]:
    if tg is None:
        os.environ.pop("SPECSERVE_TRITON_GEMM", None)
    else:
        os.environ["SPECSERVE_TRITON_GEMM"] = tg
    llm = LLM(".bench/qwen3-8b", load_format="dummy", dtype="float32", device="cuda", max_model_len=1024, max_num_seqs=1,
              speculative_config=spec, enable_prefix_caching=False, gpu_memory_utilization=0.7)
    res[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp)]
    m = llm.get_metrics() if spec else {}
    r = llm.engine.runner.model
    d = getattr(llm.engine.runner.proposer, "model", None)
    print(name, "split", r.split_gemm, "triton", r.triton_gemm, "drafter split", getattr(d, "split_gemm", None), getattr(d, "triton_gemm", None), "drafts", m.get("spec_decode_num_drafts"), "accepted", m.get("spec_decode_num_accepted_tokens"), flush=True)
    del llm
    gc.collect(); torch.cuda.empty_cache()
for k in res:
    print(f"{k}: identical to plain (triton): {res[k] == res['plain']}")
