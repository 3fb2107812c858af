# the engine's greedy tokens with the megakernel (SPECSERVE_MEGAKERNEL=1, inside the decode graph) against the
# default layers, same random 8B-shaped weights (seed), 3 prompts x 96 tokens one request at a time
import os, sys, torch
from specserve import LLM, SamplingParams
mk = sys.argv[1]
os.environ["SPECSERVE_MEGAKERNEL"] = mk
os.environ["SPECSERVE_MEGAKERNEL_OPTS"] = "rb=4,st=3,rp=1,pf=1,mg=4"
llm = LLM("/root/q3", load_format="dummy", dtype="bfloat16", device="cuda", max_model_len=1024, max_num_seqs=1,
          enable_prefix_caching=False, gpu_memory_utilization=0.5, seed=0)
sp = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True)
out = [llm.generate([{"prompt_token_ids": [1 + 7 * j + 13 * i for i in range(40 + 60 * j)]}], sp)[0].outputs[0].token_ids for j in range(3)]
torch.save(out, f"/root/tok{mk}.pt")
print(mk, llm.engine.runner.model.megakernel is not None, [o[:8] for o in out])
