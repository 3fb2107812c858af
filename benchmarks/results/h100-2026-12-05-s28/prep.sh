# Rebuild, on a fresh checkout of the dev VM, the ignored folders session 28's calls carried (run from the repo root
# with the venv active, after `bash benchmarks/results/h200-2026-12-05-s23/prep.sh` for .partA/.partB/.whl/.s23e):
#   .s28   SmolLM2's config + tokenizer (from the GGUF cache the demo fills: tokenizer.json xz'd) + c1-c3.sh, c6.sh,
#          pick.py;  call 1 `bash .s28/c1.sh` carrying [".partA", ".whl", ".s28"] (benchmarks/results moved out),
#          call 2 `bash .s28/c2.sh` carrying [".partB", ".s23e", ".s28"] (results and the drafters' model.safetensors
#          moved out), call 3 `bash .s28/c3.sh` carrying [".s28"]; `bash .s28/c6.sh` (lazy compiles) on its own
#   .s28q  a Qwen3-8B config.json + the Qwen2/3 tokenizer files (xz'd) + c4.sh / c5.sh (step_latency.py, 8B shape)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
TOK=${TOK:-../shared/data/tokenizers/qwen2_qwen3}
# the demo GGUF (fetched on first use) and its config / tokenizer cache under ~/.cache/specserve/gguf
python - <<'PY'
from specserve.loading.checkpoint import _gguf_cache
from specserve.loading.demo import demo_target_path
from specserve.loading.gguf_loader import load_gguf_config, load_gguf_tokenizer
g = str(demo_target_path())
load_gguf_config(g, _gguf_cache())
load_gguf_tokenizer(g, _gguf_cache())
PY
D=$(ls -d ~/.cache/specserve/gguf/SmolLM2-135M-Instruct*/ | head -1)
rm -rf .s28 .s28q && mkdir -p .s28/smollm2cfg .s28q/q3
cp "$D"/config/config.json "$D"/tokenizer/chat_template.jinja "$D"/tokenizer/tokenizer_config.json .s28/smollm2cfg/
xz -9 -c "$D"/tokenizer/tokenizer.json > .s28/smollm2cfg/tokenizer.json.xz
cp "$HERE"/scripts/c1.sh "$HERE"/scripts/c2.sh "$HERE"/scripts/c3.sh "$HERE"/scripts/c6.sh "$HERE"/scripts/pick.py .s28/
cp "$HERE"/scripts/qwen3-8b-config.json .s28q/q3/config.json
cp "$TOK"/tokenizer_config.json .s28q/q3/
xz -9 -c "$TOK"/vocab.json > .s28q/q3/vocab.json.xz && xz -9 -c "$TOK"/merges.txt > .s28q/q3/merges.txt.xz
cp "$HERE"/scripts/c4.sh "$HERE"/scripts/c5.sh .s28q/
du -sh .s28 .s28q
