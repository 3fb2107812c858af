# next session, call 3: SmolLM2 batch 1 without HF (its static compile ran past 150 s in sessions 25-26; session 15 measured it), the draft model on its fused step, bench serve, structured outputs (warm-up fixed); carry [".whl", ".s23s"]
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
G=/root/smollm2.gguf; R=/root/r3; mkdir -p $R
DF=${DF:-specserve/assets/smollm2-135m-dflash}; E3=${E3:-specserve/assets/smollm2-135m-eagle3}  # the shipped pair, in the tree
echo "drafters: $DF $E3"
timeout ${ST:-200} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --eagle3 $E3 --draft-model $G --skip-hf \
    --only plain "dflash K=15" "eagle3 K=7" "draft_model K=3" --timed-file /root/ev/gsm8k_test.jsonl:2 --out $R/smollm2_gpu.json > $R/smollm2_gpu.log 2>&1
grep -v "^INFO" $R/smollm2_gpu.log | tail -22
echo "[c3] smollm2 at $(( $(date +%s) - T0 )) s"
S="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":15}"
OUTPUT_LEN=256 CONCURRENCY="${CONC:-1 4}" timeout ${BT:-150} bash benchmarks/serve_e2e.sh $G /root/ev/mt_bench_question.jsonl $R/e2e 16 "$S" > $R/e2e.log 2>&1
grep -h "Output token throughput\|Mean TPOT\|cceptance" $R/e2e/bench-*.txt
echo "[c3] e2e at $(( $(date +%s) - T0 )) s"
# structured outputs (JSON schema) on the GPU: float32 constrained greedy with DFlash / EAGLE-3 == plain constrained,
# valid JSON, tok/s vs free text (session 25's feature; first GPU run)
timeout ${SOT:-120} python benchmarks/structured_gpu.py --model $G --dflash $DF --eagle3 $E3 --batch 8 --tokens 192 \
    --out $R/structured_gpu-h200.json > $R/structured_gpu.log 2>&1
grep -v "^INFO" $R/structured_gpu.log | tail -8
mkdir -p $OUT && tar -C /root -czf $OUT/r3.tgz r3
echo "[c3] total $(( $(date +%s) - T0 )) s"
