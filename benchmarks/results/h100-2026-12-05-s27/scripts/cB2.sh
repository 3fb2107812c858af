# session 27, call B2: the tuned gate (margin 0.1, probes from 16 steps) against ungated DFlash and plain, same run.
# carry [".partB", ".s23e", ".s27"] with benchmarks/results and the drafters' model.safetensors moved out of the tree
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=$OUT/r; mkdir -p $R
timeout ${ST:-150} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager \
    --only plain "dflash K=15" "dflash K=15 gated" --timed-file /root/ev/gsm8k_test.jsonl:2 \
    --timed-file /root/ev/mt_bench_question.jsonl:4 --out $R/smollm2_gpu.json > $R/smollm2_gpu.log 2>&1
grep -v "^INFO" $R/smollm2_gpu.log | grep -v "^{" | tail -16
grep "gated" $R/smollm2_gpu.log | grep "^{" | cut -c1-400
echo "[cB2] smollm2 at $(( $(date +%s) - T0 )) s"
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
SG="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15,\"disable_when_slower\":true}"
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-140} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT2:-80} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e-gated 16 "$SG" > $R/e2e-gated.log 2>&1
for f in $R/e2e/bench-*.txt $R/e2e-gated/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|Mean TPOT\|cceptance length" $f; done
echo "[cB2] total $(( $(date +%s) - T0 )) s"
