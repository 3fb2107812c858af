"""cProfile of the engine loop: where the host time of a speculative step goes (GPU machine)."""
import cProfile, io, json, pstats, sys, time
sys.path.insert(0, "benchmarks")
import torch
from specserve import LLM, SamplingParams
from step_latency import count_steps

cfg, spec_json, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = json.loads(spec_json) if spec_json != "none" else None
llm = LLM(cfg, load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=2048, max_num_seqs=4,
          speculative_config=spec, enable_prefix_caching=False, async_spec=True if spec else None)
eng = llm.engine
steps = count_steps(eng)
p = [{"prompt_token_ids": list(range(1000, 1128))}]
sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
llm.generate(p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
modes = [False, True] if spec else [None]
for mode in modes:
    if mode is not None:
        eng.runner.async_spec = mode
    best = 1e9
    for _ in range(3):
        steps["n"] = 0
        torch.cuda.synchronize(); t0 = time.perf_counter(); llm.generate(p, sp); dt = time.perf_counter() - t0
        best = min(best, dt / steps["n"])
    print(f"== {spec['method'] if spec else 'plain'} async_spec={mode}: {best*1e3:.3f} ms/step ({steps['n']} steps)", flush=True)
    pr = cProfile.Profile(); steps["n"] = 0; pr.enable(); llm.generate(p, sp); pr.disable()
    n = steps["n"]
    for key in ("tottime", "cumulative"):
        s = io.StringIO(); st = pstats.Stats(pr, stream=s); st.sort_stats(key).print_stats(28)
        print(f"-- by {key}, {n} steps (divide by it)\n" + "\n".join(s.getvalue().splitlines()[6:]), flush=True)
