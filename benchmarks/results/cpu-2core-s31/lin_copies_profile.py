"""Session 31 (2-core VM): every clone / copy_ of a float32 DFlash K=3 demo run under torch.profiler, grouped by
its parent ops and input shapes (run from the repository root: python benchmarks/results/cpu-2core-s31/lin_copies_profile.py)."""
import torch, collections
from specserve import LLM, SamplingParams
from torch.profiler import profile, ProfilerActivity
spec = {"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 3}
llm = LLM(None, speculative_config=spec, dtype="float32")
sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
ps = ["Write a short story about a robot learning to paint."]
llm.generate(ps, sp, use_tqdm=False)
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    llm.generate(ps, sp, use_tqdm=False)
# parent of each clone/copy_
evs = prof.events()
agg = collections.defaultdict(lambda: [0, 0.0])
for e in evs:
    if e.name in ("aten::clone", "aten::copy_"):
        p = e.cpu_parent
        chain = []
        while p is not None and len(chain) < 3:
            chain.append(p.name); p = p.cpu_parent
        k = (e.name, " < ".join(chain), str(e.input_shapes)[:80])
        agg[k][0] += 1; agg[k][1] += e.cpu_time_total
for k, v in sorted(agg.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{v[0]:6d} {v[1]/1e3:7.1f} ms {k[0]:12s} {k[1][:90]:90s} {k[2]}")
