"""SmolLM2 shape bf16 (random weights): greedy tokens with graphs == --enforce-eager for 128 tokens, with the fused
rope_store+attention kernel (plain; DFlash K=15 with the bundled drafter)."""
import gc
import torch
from specserve import LLM, SamplingParams
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
