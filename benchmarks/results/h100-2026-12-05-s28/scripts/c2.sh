# session 28, call 2: the GGUF (half B); real weights, batch 1 and bench serve: the default vs the sweep's best
# setting (call 1), and the committed gate (v3). carry [".partB", ".s23e", ".s28"] (results + drafter weights out)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev; cp .s28/*.sh .s28/*.py /root/s28/
BEST=$(python /root/s28/pick.py /root/s28/r1/sweep_dflash.log); echo "BEST=[$BEST]"; echo "$BEST" > /root/s28/best.env
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=/root/s28/r2; mkdir -p $R
timeout ${ST:-150} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager \
    --only plain "dflash K=15" "dflash K=15 gated" --timed-file /root/ev/gsm8k_test.jsonl:2 \
    --timed-file /root/ev/mt_bench_question.jsonl:4 --out $R/smollm2_gpu.json > $R/smollm2_gpu.log 2>&1
grep -v "^INFO" $R/smollm2_gpu.log | grep -v "^{" | tail -12
echo "[c2] smollm2 default $(( $(date +%s) - T0 )) s"
if [ -n "$BEST" ]; then
  env $BEST timeout ${ST2:-90} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager \
    --only plain "dflash K=15" --timed-file /root/ev/gsm8k_test.jsonl:2 \
    --timed-file /root/ev/mt_bench_question.jsonl:4 --out $R/smollm2_gpu-best.json > $R/smollm2_gpu-best.log 2>&1
  grep -v "^INFO" $R/smollm2_gpu-best.log | grep -v "^{" | tail -8
fi
echo "[c2] smollm2 best $(( $(date +%s) - T0 )) s"
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
SG="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15,\"disable_when_slower\":true}"
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-150} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1; pkill -f "specserve serve"; sleep 1
if [ -n "$BEST" ]; then
  env $BEST LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT2:-80} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e-best 16 "$S" > $R/e2e-best.log 2>&1; pkill -f "specserve serve"; sleep 1
fi
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT3:-80} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e-gated 16 "$SG" > $R/e2e-gated.log 2>&1; pkill -f "specserve serve"; sleep 1
for f in $R/e2e*/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|cceptance length" $f; done
cp -r $R $OUT/
echo "[c2] total $(( $(date +%s) - T0 )) s"
