# session 33, call 3 (carry [".s28q", ".s33"]; warm, /root from calls 1-2): the Qwen3-8B-shaped plain / DFlash K=15
# step at batch 1 (graphs only) on this machine; bench serve (mt-bench, 16 x 256 tokens, concurrency 1 and 4): no
# speculation, DFlash K=15 (the demo's GPU default), DFlash K=7
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout ${ST:-150} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 \
   --skip-eager --skip-hf --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1.log | tail -8
echo "[c3] step $(( $(date +%s) - T0 )) s"
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=/root/r3; mkdir -p $R
S15="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
S7="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":7}"
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-200} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e15 16 "$S15" > $R/e2e15.log 2>&1; pkill -f "specserve serve"; sleep 1
echo "[c3] serve K=15 $(( $(date +%s) - T0 )) s"
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-150} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e7 16 "$S7" > $R/e2e7.log 2>&1; pkill -f "specserve serve"; sleep 1
for f in $R/e2e*/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|cceptance length\|Mean TPOT" $f; done
tar -C /root -czf $OUT/r3.tgz r3
echo "[c3] total $(( $(date +%s) - T0 )) s"
