"""Validation sets for the demo drafters (session 4), and the prompts the demo data has not used yet.

    python benchmarks/demo_val_sets.py --data-dir ../shared/data --train-data .traindata/data.jsonl.gz \
        --out .gendata [--device cpu --dtype float32]

The demo data (benchmarks/train_demo_drafters.sh) answers 3500 of gsm8k_train's 7473 prompts (a seeded
shuffle). This script writes, under --out:
  extra_math_prompts.jsonl   the other 3973 (with the same half-and-half answer-format suffix);
  extra_math_train.jsonl     those minus the first 64: more training prompts (EXTRA_PROMPTS of the demo script);
  val-gsm8k-extra-64.jsonl   the target's greedy answers (<= 384 tokens) to the first 64: a validation set no demo
                             run has trained on (VAL_DATA of the demo script, or --val-data of --eval-only);
  train-gsm8k-64.jsonl       the first 64 gsm8k samples of --train-data (trained on: the other side of the gap).
Then, per drafter: specserve train dflash --init-from specserve/assets/smollm2-135m-dflash --eval-only \
    --val-data OUT/val-gsm8k-extra-64.jsonl (and eagle3 likewise).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--train-data", default=".traindata/data.jsonl.gz", help="the demo's generated samples")
    ap.add_argument("--out", default=".gendata")
    ap.add_argument("--num-val", type=int, default=64)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default="auto")
    a = ap.parse_args()

    from specserve.loading.demo import demo_target_path
    from specserve.train.data import load_prompts
    from specserve.train.target import load_tokenizer

    gsm = os.path.join(a.data_dir, "gsm8k_train.jsonl")
    used = set(load_prompts([gsm + ":3500"], seed=0))  # exactly the demo script's spec (first, so same RNG)
    extra = [p for p in load_prompts([gsm], seed=0) if p not in used]
    os.makedirs(a.out, exist_ok=True)

    def write(name: str, prompts: list[str]) -> str:
        path = os.path.join(a.out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"prompt": p}) + "\n" for p in prompts)
        return path

    write("extra_math_prompts.jsonl", extra)
    write("extra_math_train.jsonl", extra[a.num_val :])
    val_prompts = write("val-prompts.jsonl", extra[: a.num_val])
    work = os.path.join(a.out, "val-gen")
    cmd = [sys.executable, "-m", "specserve.train.cli", "dflash", "--target", demo_target_path(), "--output", work,
           "--generate-only", "--prompts", val_prompts, "--max-new-tokens", "384", "--max-prompt-length", "1024",
           "--gen-temperature", "0", "--generator", "engine", "--gen-batch-size", str(a.num_val), "--seed", "0",
           "--dtype", a.dtype, "--no-progress"] + (["--device", a.device] if a.device else [])  # fmt: skip
    subprocess.run(cmd, check=True)
    os.replace(os.path.join(work, "data.jsonl"), os.path.join(a.out, f"val-gsm8k-extra-{a.num_val}.jsonl"))

    # the trained-on side: gsm8k samples of the demo data (their question is one of the 3500 used prompts)
    tok = load_tokenizer(demo_target_path())
    keys = {u.split("\n")[0][:80] for u in used}
    picked: list[str] = []
    opener = gzip.open if a.train_data.endswith(".gz") else open
    with opener(a.train_data, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        for line in f:
            d = json.loads(line)
            text = tok.decode(d["input_ids"][: d["loss_mask"].index(1)])
            if text.split("<|im_start|>user\n")[-1].split("\n")[0][:80] in keys:
                picked.append(line)
            if len(picked) >= a.num_val:
                break
    with open(os.path.join(a.out, f"train-gsm8k-{a.num_val}.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(picked)
    print(
        f"{len(extra)} unused gsm8k_train prompts; {a.num_val} answered for validation; {len(picked)} trained-on"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
