# session 49, call 2 (carry [".partB", ".s23e", ".s49"], made at once after call 1; results and the drafters' weights
# out of the tree): the GGUF; SmolLM2-135M batch 1 vs HF transformers (static cache + its torch.compile) in one run,
# every timed row the median of 5 passes: plain, DFlash K=15 / K=7, EAGLE-3 K=7 on chat, gsm8k_test and mt_bench prompts
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name --format=csv,noheader
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; E3=/root/assets/smollm2-135m-eagle3; R=/root/r2; mkdir -p $R
timeout ${HT:-540} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --eagle3 $E3 --no-eager --reps ${REPS:-5} \
    --only plain "dflash K=15" "dflash K=7" "eagle3 K=7" --hf-timeout ${HFT:-300} \
    --timed-file /root/ev/gsm8k_test.jsonl:2 --timed-file /root/ev/mt_bench_question.jsonl:2 \
    --out $R/smollm2_gpu-hf.json > $R/smollm2_gpu-hf.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/smollm2_gpu-hf.log | grep -v "^{" | tail -24
cp $R/smollm2_gpu-hf.json $R/smollm2_gpu-hf.log $OUT/
echo "[c2] total $(( $(date +%s) - T0 )) s"
