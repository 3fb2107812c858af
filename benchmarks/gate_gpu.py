"""GPU check of drafting switched off and on mid-request (speculative_config.disable_when_slower's mechanism).

A gate forced to a fixed schedule (draft for ``--on`` steps, then ``--off`` plain steps, repeated) runs DFlash
with CUDA graphs and the pipelined steps; its plain steps go through the target's q=1 graph + the drafter's context
graph (``ModelRunner.launch_decode``). Checks, in float32: every output equals plain greedy decoding, and the
drafts made after a plain stretch equal those of a run that drafted at every step at the same committed tokens
(the drafter's context stayed whole). Prints one JSON line per check.

    python benchmarks/gate_gpu.py --model M.gguf --dflash DIR [--k 15] [--tokens 128] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from specserve import LLM, SamplingParams
from specserve.spec.gate import SpeculationGate

PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
    "clips did Natalia sell altogether in April and May?",
    "Write a short story about a robot who learns to paint.",
]


class ScheduledGate(SpeculationGate):
    """Drafting on for ``on`` decode steps, off for ``off``, repeated (counted in recorded decode steps)."""

    def __init__(self, on: int, off: int) -> None:
        super().__init__()
        self.on, self.off, self.n = on, off, 0

    def drafting_on(self, batch_size: int) -> bool:
        return self.n % (self.on + self.off) < self.on

    def record(self, kind, b, now, tokens_per_request=None):  # type: ignore[no-untyped-def]
        if kind is not None:
            self.n += 1


def run(llm: LLM, prompts: list[list[dict]], tokens: int) -> tuple[list[list[int]], dict]:
    """Chat completions stepped by hand: outputs, and request 0's drafts keyed by its committed tokens."""
    eng = llm.engine
    tok = llm.get_tokenizer()
    sp = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    for i, msgs in enumerate(prompts):
        ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        eng.add_request(str(i), {"prompt_token_ids": ids}, sp)
    drafts: dict[tuple[int, ...], list[int]] = {}
    outs: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = list(o.outputs[0].token_ids)
        r = next((r for r in eng.scheduler.running if r.request_id == "0"), None)
        if r is not None and r.spec_token_ids:
            drafts[tuple(r.token_ids)] = list(r.spec_token_ids)
    return [outs[str(i)] for i in range(len(prompts))], drafts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--dflash", required=True)
    ap.add_argument("--k", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--on", type=int, default=4)
    ap.add_argument("--off", type=int, default=6)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    common = dict(dtype=args.dtype, device=args.device, max_model_len=2048, max_num_seqs=4, enable_prefix_caching=False)
    plain = LLM(args.model, **common)  # type: ignore[arg-type]
    ref, _ = run(plain, chats, args.tokens)
    del plain
    spec = {"method": "dflash", "model": args.dflash, "num_speculative_tokens": args.k}
    always = LLM(args.model, speculative_config=spec, **common)  # type: ignore[arg-type]
    outs_a, drafts_a = run(always, chats, args.tokens)
    del always
    gated = LLM(args.model, speculative_config=spec, **common)  # type: ignore[arg-type]
    eng = gated.engine
    eng.gate = eng.runner.gate = ScheduledGate(args.on, args.off)
    outs_g, drafts_g = run(gated, chats, args.tokens)
    runner = eng.runner
    common_keys = [k for k in drafts_g if k in drafts_a]
    same = sum(drafts_g[k] == drafts_a[k] for k in common_keys)
    result = {
        "gpu": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "dtype": args.dtype,
        "k": args.k,
        "schedule": [args.on, args.off],
        "always_equals_plain": outs_a == ref,
        "gated_equals_plain": outs_g == ref,
        "context_graph": runner.use_context_step,
        "pipelined_plain_steps": runner.num_async_steps,
        "pipelined_spec_steps": runner.num_async_spec_steps,
        "drafts_compared": len(common_keys),
        "drafts_equal": same,
        "metrics": {k: v for k, v in gated.get_metrics().items() if k.startswith("spec_decode_num_")},
    }
    try:
        rev = subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        rev = "unknown"
    result.update(command=" ".join(["python"] + sys.argv), git_revision=rev)
    print(json.dumps(result), flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
    ok = result["gated_equals_plain"] and result["pipelined_plain_steps"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
