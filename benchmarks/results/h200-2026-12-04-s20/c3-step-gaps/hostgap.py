"""Host overhead per engine step: wall ms per step (no profiler) vs the GPU time of the step's graphs replayed
back to back (CUDA events): plain decode (the q=1 bucket-1 graph) and the fused DFlash step (target verify graph +
the proposer's fused drafter graph, bucket 1)."""
import json, sys, time
import torch
from specserve import LLM, SamplingParams

cfg = sys.argv[1]
spec = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=2048, max_num_seqs=4,
          enable_prefix_caching=False, gpu_memory_utilization=0.5, speculative_config=spec)
g = torch.Generator().manual_seed(0)
ps = [{"prompt_token_ids": torch.randint(1000, 40000, (128,), generator=g).tolist()}]
eng, r = llm.engine, llm.engine.runner
n = {"s": 0}
orig = eng.step
def counted():
    n["s"] += 1
    return orig()
eng.step = counted
best = {}
for toks in (64, 256):
    sp = SamplingParams(temperature=0, max_tokens=toks, ignore_eos=True)
    llm.generate(ps, sp, use_tqdm=False)
    b = (1e9, 0)
    for _ in range(3):
        n["s"] = 0
        torch.cuda.synchronize(); t0 = time.perf_counter(); llm.generate(ps, sp, use_tqdm=False)
        b = min(b, (time.perf_counter() - t0, n["s"]))
    best[toks] = b
(t1, s1), (t2, s2) = best[64], best[256]
wall = 1e3 * (t2 - t1) / (s2 - s1)


def gpu_ms(graphs):
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for gr in graphs:
        gr.replay()
    torch.cuda.synchronize()
    e0.record()
    for _ in range(50):
        for gr in graphs:
            gr.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / 50


q = 1 if spec is None else spec["num_speculative_tokens"] + 1
gs = [r.graphs[q].graphs[1]]
if spec is not None:
    gs.append(r.proposer.fused.graphs[1])
gpu = gpu_ms(gs)
print(f"{cfg} spec={bool(spec)}: wall {wall:.3f} ms/step (difference of 256- and 64-token runs), graphs back to back "
      f"{gpu:.3f} ms -> host/gaps {wall - gpu:.3f} ms ({100 * (wall - gpu) / wall:.1f}%)")
