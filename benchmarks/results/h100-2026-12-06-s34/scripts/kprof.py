"""Per-kernel table of the engine's plain decode step (graphs on, default settings), from torch.profiler over
graph replays: count per step, mean GPU duration, and the step-advance attributed to each kernel
(end(k) - end(previous kernel), clipped at 0: the critical-path share of a serial chain)."""
import collections, json, os, sys, time
import torch
sys.path.insert(0, "benchmarks")
from step_latency import copy_bandwidth, read_bandwidth, read_weight_bytes
from specserve import LLM, SamplingParams
from torch.profiler import ProfilerActivity, profile

cfg = sys.argv[1]; batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
spec = json.loads(sys.argv[3]) if len(sys.argv) > 3 and sys.argv[3] != "-" else None
ntok = 64
llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=2048, max_num_seqs=max(batch, 1),
          enable_prefix_caching=False, gpu_memory_utilization=0.5, speculative_config=spec)
eng = llm.engine
wb = read_weight_bytes(eng.runner.model)
dram = max(copy_bandwidth(), read_bandwidth())
g = torch.Generator().manual_seed(0)
ps = [{"prompt_token_ids": torch.randint(1000, 100000, (128,), generator=g).tolist()} for _ in range(batch)]
sp = SamplingParams(temperature=0, max_tokens=ntok, ignore_eos=True)
llm.generate(ps, sp, use_tqdm=False)
steps = {"n": 0}
orig = eng.step
def counted():
    steps["n"] += 1
    return orig()
eng.step = counted
torch.cuda.synchronize()
t0 = time.perf_counter(); llm.generate(ps, sp, use_tqdm=False); wall = time.perf_counter() - t0
nsteps = steps["n"]
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    llm.generate(ps, sp, use_tqdm=False)
    torch.cuda.synchronize()
ev = sorted([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and "Memcpy" not in e.name and "Memset" not in e.name],
            key=lambda e: e.time_range.start)
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
prev_end = None
spans = []
for e in ev:
    s, t = e.time_range.start, e.time_range.end
    adv = 0.0 if prev_end is None else max(0.0, t - max(prev_end, s) if t > prev_end else 0.0)
    gap = 0.0 if prev_end is None else max(0.0, s - prev_end)
    a = agg[e.name[:90]]
    a[0] += 1; a[1] += t - s; a[2] += (t - prev_end) if prev_end is not None and t > prev_end else 0.0
    prev_end = t if prev_end is None else max(prev_end, t)
tot_adv = sum(v[2] for v in agg.values())
floor_ms = 1e3 * wb / dram
print(f"batch {batch} spec {spec} steps {nsteps} wall/step {1e3*wall/nsteps:.3f} ms floor {floor_ms:.3f} ms "
      f"profiled kernel span/step {tot_adv/1e3/nsteps:.3f} ms")
print(f"{'kernel':90} {'per step':>8} {'mean us':>8} {'adv us/step':>11}")
rows = []
for name, (c, d, adv) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
    rows.append(dict(kernel=name, per_step=c / nsteps, mean_us=d / c, adv_us_per_step=adv / nsteps))
    print(f"{name:90} {c/nsteps:8.2f} {d/c:8.2f} {adv/nsteps:11.1f}")
out = os.environ.get("OUT", "/tmp")
json.dump(dict(batch=batch, spec=spec, steps=nsteps, wall_ms_per_step=1e3*wall/nsteps, floor_ms=floor_ms, rows=rows),
          open(f"{out}/kprof-b{batch}-{'spec' if spec else 'plain'}.json", "w"), indent=1)
