"""Where a drafter loses: greedy generation of a few prompts, one request at a time, printed as the text each
speculative step committed with the number of draft tokens it accepted in front: ``[2] a sum of|[0] $|[0]p|...``.

    python benchmarks/acceptance_trace.py --model SmolLM2-135M-Instruct.Q4_1.gguf --device cpu --dtype float32 \
        -sc '{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}' \
        --dataset ../shared/data/math500_test.jsonl --num-prompts 3 --max-tokens 160

Session 21 found this way that the round-I DFlash drafter drafted LaTeX inline math (``$p$ and $q$``) one token at
a time on math500 (its data was 80% gsm8k, where "$" is followed by a dollar amount): hence ``--self-grid latex``.
"""

from __future__ import annotations

import argparse
import json
import sys

from specserve import LLM, SamplingParams
from specserve.engine import engine as engine_mod
from specserve.spec.eval_acceptance import read_prompts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="target (default: the bundled demo model)")
    ap.add_argument("-sc", "--speculative-config", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--num-prompts", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="auto")
    a = ap.parse_args(argv)

    steps: list[int] = []  # accepted draft tokens of each speculative step of the running request
    observe = engine_mod.SpecStats.observe

    def record(self: engine_mod.SpecStats, num_draft: int, num_accepted: int) -> None:
        steps.append(num_accepted)
        observe(self, num_draft, num_accepted)

    engine_mod.SpecStats.observe = record  # type: ignore[method-assign]
    llm = LLM(a.model, dtype=a.dtype, device=a.device, max_num_seqs=1,
              speculative_config=json.loads(a.speculative_config))  # fmt: skip
    tok = llm.get_tokenizer()
    total_tokens = total_steps = 0
    for prompt in read_prompts(a.dataset, a.num_prompts):
        steps.clear()
        out = llm.chat(
            [[{"role": "user", "content": prompt}]], SamplingParams(temperature=0, max_tokens=a.max_tokens)
        )
        ids = out[0].outputs[0].token_ids
        pos, segs = 1, ["[prefill]" + tok.decode(ids[:1])]  # the prefill step commits one token, no drafts
        for n in steps:  # each speculative step commits its accepted drafts plus one token of the target
            segs.append(f"[{n}]" + tok.decode(ids[pos : pos + n + 1]))
            pos += n + 1
        if pos < len(ids):  # steps without drafts (none expected with one request) are not traced
            segs.append("[untraced]" + tok.decode(ids[pos:]))
        total_tokens += pos - 1
        total_steps += len(steps)
        print(f"=== acceptance length {(pos - 1) / max(1, len(steps)):.2f} over {len(steps)} steps")
        print("|".join(segs))
    print(f"all prompts: acceptance length {total_tokens / max(1, total_steps):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
