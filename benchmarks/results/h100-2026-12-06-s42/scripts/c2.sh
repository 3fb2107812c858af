# session 42, call 2 (carry [".partB", ".s23e", ".s42"], made at once after c1g.sh on an H200): session 40's
# c2.sh cut to the owed rows (#6: SmolLM2 plain and DFlash vs HF's static cache + torch.compile, H200), medians of 3
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; E3=/root/assets/smollm2-135m-eagle3; R=/root/r2; mkdir -p $R
timeout ${HT:-260} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --eagle3 $E3 --no-eager --reps ${REPS:-3} \
    --only plain "dflash K=7" "dflash K=15" --hf-timeout ${HFT:-180} \
    --timed-file /root/ev/gsm8k_test.jsonl:2 --timed-file /root/ev/mt_bench_question.jsonl:2 \
    --out $R/smollm2_gpu-hf.json > $R/smollm2_gpu-hf.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/smollm2_gpu-hf.log | grep -v "^{" | tail -24
cp $R/smollm2_gpu-hf.json $R/smollm2_gpu-hf.log $OUT/
echo "[c2] total $(( $(date +%s) - T0 )) s"
