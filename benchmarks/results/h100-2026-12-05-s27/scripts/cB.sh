# session 27, call B: disable_when_slower on the GPU. carry [".partB", ".s23e", ".s27"] with benchmarks/results and the
# drafters' model.safetensors moved out of the tree (the drafters come from /root/assets, call A)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=$OUT/r; mkdir -p $R
# 1) drafting switched off / on mid-request with graphs + pipelined steps: float32 == plain, drafts == always-on
timeout ${GT:-110} python benchmarks/gate_gpu.py --model $G --dflash $DF --k 15 --tokens 128 --out $R/gate_gpu.json > $R/gate_gpu.log 2>&1
echo "gate_gpu rc=$?"; grep -v "^INFO" $R/gate_gpu.log | tail -3 | cut -c1-600
echo "[cB] gate at $(( $(date +%s) - T0 )) s"
# 2) batch 1: plain, DFlash K=15, DFlash K=15 gated (the demo default) on chat / gsm8k_test / mt_bench prompts
timeout ${ST:-200} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf \
    --only plain "dflash K=15" "dflash K=15 gated" --timed-file /root/ev/gsm8k_test.jsonl:2 \
    --timed-file /root/ev/mt_bench_question.jsonl:4 --out $R/smollm2_gpu.json > $R/smollm2_gpu.log 2>&1
grep -v "^INFO" $R/smollm2_gpu.log | grep -v "^{" | tail -16
grep "gated" $R/smollm2_gpu.log | grep "^{" | cut -c1-400
echo "[cB] smollm2 at $(( $(date +%s) - T0 )) s"
# 3) bench serve, mt-bench, 16 prompts x 256 tokens, c1 / c4: none, DFlash K=15, DFlash K=15 gated
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
SG="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15,\"disable_when_slower\":true}"
OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT:-140} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1
LABELS=spec OUTPUT_LEN=256 CONCURRENCY="1 4" timeout ${BT2:-80} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e-gated 16 "$SG" > $R/e2e-gated.log 2>&1
for f in $R/e2e/bench-*.txt $R/e2e-gated/bench-*.txt; do echo "== $f"; grep -h "Output token throughput\|Mean TPOT\|cceptance length" $f; done
echo "[cB] total $(( $(date +%s) - T0 )) s"
