"""What the GPU does between two CUDA-graph steps (plain decode / DFlash), from a torch.profiler trace: the GPU
events (kernels, memcpy, memset) and the host runtime calls around two step boundaries, in microseconds."""
import json, sys, time
import torch
from specserve import LLM, SamplingParams
from torch.profiler import ProfilerActivity, profile

cfg = sys.argv[1]
spec = json.loads(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2] != "-" else None
llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=2048, max_num_seqs=4,
          enable_prefix_caching=False, gpu_memory_utilization=0.5, speculative_config=spec)
g = torch.Generator().manual_seed(0)
ps = [{"prompt_token_ids": torch.randint(1000, 40000, (128,), generator=g).tolist()}]
sp = SamplingParams(temperature=0, max_tokens=48, ignore_eos=True)
llm.generate(ps, sp, use_tqdm=False)
eng = llm.engine
n = {"s": 0}
orig = eng.step
def counted():
    n["s"] += 1
    return orig()
eng.step = counted
t0 = time.perf_counter(); llm.generate(ps, sp, use_tqdm=False); wall = time.perf_counter() - t0
print(f"{cfg} spec={bool(spec)} steps {n['s']} wall/step {1e3*wall/n['s']:.3f} ms")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    llm.generate(ps, sp, use_tqdm=False)
    torch.cuda.synchronize()
evs = [e for e in prof.events()]
gpu = sorted([e for e in evs if e.device_type == torch.autograd.DeviceType.CUDA], key=lambda e: e.time_range.start)
cpu = sorted([e for e in evs if e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("cuda")],
             key=lambda e: e.time_range.start)
# gaps between consecutive GPU events; the largest ones per step are the step boundaries
gaps = []
end = gpu[0].time_range.end
for i, e in enumerate(gpu[1:], 1):
    gaps.append((e.time_range.start - end, i))
    end = max(end, e.time_range.end)
busy = sum(e.time_range.end - e.time_range.start for e in gpu)
span = gpu[-1].time_range.end - gpu[0].time_range.start
big = sorted(gaps, reverse=True)[: n["s"]]
print(f"GPU span {span/1e3:.2f} ms, idle gaps >2us total {sum(g for g, _ in gaps if g > 2)/1e3:.3f} ms "
      f"({sum(1 for g, _ in gaps if g > 2)} gaps), median of the {len(big)} largest {sorted(g for g, _ in big)[len(big)//2]:.1f} us")
gl = [e.time_range.end - e.time_range.start for e in cpu if e.name == "cudaGraphLaunch"]
print(f"cudaGraphLaunch calls {len(gl)}, mean CPU {sum(gl)/max(1,len(gl)):.1f} us, total per step {sum(gl)/n['s']:.1f} us")
mid = sorted(i for _, i in big)[len(big) // 2]
lo = max(0, mid - 12); hi = min(len(gpu), mid + 10)
base = gpu[mid].time_range.start
print("around one boundary (us from the first event after the gap):")
for e in gpu[lo:hi]:
    print(f"  GPU {e.time_range.start - base:9.1f} {e.time_range.end - e.time_range.start:7.1f}  {e.name[:80]}")
for e in cpu:
    if base - 400 < e.time_range.start < base + 100:
        print(f"  CPU {e.time_range.start - base:9.1f} {e.time_range.end - e.time_range.start:7.1f}  {e.name[:80]}")
