#!/usr/bin/env bash
# End-to-end `bench serve` through the HTTP server on the mt-bench prompts, greedy, concurrency 1-4,
# with and without speculation. Usage:
#   benchmarks/serve_e2e.sh MODEL MT_BENCH_JSONL OUT_DIR NUM_PROMPTS 'SPEC_JSON' [extra serve args...]
# LABELS="spec" runs only the speculative server (default "nospec spec").
set -uo pipefail
MODEL=$1; DATA=$2; OUT=$3; N=$4; SPEC=$5; shift 5
mkdir -p "$OUT"
run_server() {  # $1 label, $2.. serve args
  local label=$1; shift
  python -m specserve serve "$MODEL" --port 8321 --max-num-seqs 4 --max-model-len 2048 --no-enable-prefix-caching \
      --disable-log-stats "$@" > "$OUT/server-$label.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1 180); do curl -sf localhost:8321/health > /dev/null && return 0; sleep 1; done
  echo "server $label did not start"; tail -20 "$OUT/server-$label.log"; return 1
}
for label in ${LABELS:-nospec spec}; do
  if [ "$label" = spec ]; then run_server spec --speculative-config "$SPEC" "$@"; else run_server nospec --no-speculation "$@"; fi || continue
  for c in ${CONCURRENCY:-1 2 4}; do
    python -m specserve bench serve --base-url http://127.0.0.1:8321 --dataset-name hf --hf-name philschmid/mt-bench \
      --dataset-path "$DATA" --num-prompts "$N" --max-concurrency "$c" --temperature 0 --disable-tqdm \
      --hf-output-len "${OUTPUT_LEN:-256}" \
      --save-result --result-dir "$OUT" --result-filename "bench-$label-c$c.json" 2>&1 | tee "$OUT/bench-$label-c$c.txt" \
      | sed -n '/Serving Benchmark Result/,/^=*$/p'
  done
  kill $SERVER; wait $SERVER 2>/dev/null
done
