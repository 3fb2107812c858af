#!/usr/bin/env python
"""``max_cudagraph_capture_size`` on the GPU: an engine that captures only the steps of at most N tokens (larger
batches run the same padded step eagerly) gives the tokens of one that captures every bucket. A tiny random Qwen3
(bf16) with and without a random DFlash drafter (K=3), greedy and seeded sampling (counter-based, so the tokens may
not depend on graph vs eager), 8 requests of different lengths at max_num_seqs 8, caps 8 / 2 / 64 tokens.

    PYTHONPATH=. python benchmarks/capture_size_gpu.py      # prints SAME ... per case, then ALL SAME or MISMATCH

Exit status 1 on a mismatch. Written in session 56, not yet run on a GPU (no device was lent).
"""

import logging
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, "tests")
from drafters import make_dflash  # noqa: E402

from specserve import SamplingParams  # noqa: E402
from specserve.config import EngineConfig  # noqa: E402
from specserve.engine.engine import LLMEngine  # noqa: E402

logging.basicConfig(level=logging.INFO, format="%(message)s")
for n in ("httpx", "urllib3"):
    logging.getLogger(n).setLevel(logging.WARNING)
root = Path(tempfile.mkdtemp())
tok = transformers.ByT5Tokenizer()
torch.manual_seed(0)
cfg = transformers.Qwen3Config(
    vocab_size=len(tok),
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    rope_theta=1e6,
    bos_token_id=1,
    eos_token_id=1,
)
m = transformers.Qwen3ForCausalLM(cfg)
with torch.no_grad():
    for p in m.parameters():
        if p.dim() == 2:
            p.normal_(0, 0.08)
m.save_pretrained(root / "t")
tok.save_pretrained(root / "t")
dfl = make_dflash(root / "d", 128, 2, len(tok), layer_ids=[0, 1])
prompts = [{"prompt_token_ids": [(7 * i + 3 * j) % 300 + 3 for j in range(5 + 37 * i)]} for i in range(8)]


def run(spec, cap, temp):
    eng = LLMEngine(
        EngineConfig(
            model=str(root / "t"),
            dtype="bfloat16",
            device="cuda",
            max_num_seqs=8,
            speculative_config=spec,
            max_cudagraph_capture_size=cap,
        )
    )
    ids = []
    for i, p in enumerate(prompts):
        sp = SamplingParams(temperature=temp, seed=100 + i, max_tokens=8 + 6 * i, ignore_eos=True)
        ids.append(eng.add_request(str(i), p, sp))
    done = {}
    t0 = time.perf_counter()
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                done[o.request_id] = list(o.outputs[0].token_ids)
    r = eng.runner
    print(
        f"RUN spec={bool(spec)} cap={cap} temp={temp}: {time.perf_counter() - t0:.2f}s fast={r.num_fast_steps} "
        f"fused={r.num_fused_steps} async={r.num_async_steps} async_spec={r.num_async_spec_steps} "
        f"prefill_graph={r.num_prefill_graph_steps}",
        flush=True,
    )
    return [done[i] for i in ids]


spec = {"method": "dflash", "model": dfl, "num_speculative_tokens": 3}
ok = True
for s in (None, spec):
    for temp in (0.0, 0.8):
        base = run(s, None, temp)
        for cap in (8, 2, 64):
            got = run(s, cap, temp)
            same = got == base
            ok &= same
            print(f"SAME spec={bool(s)} temp={temp} cap={cap}: {same}", flush=True)
print("ALL SAME" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
