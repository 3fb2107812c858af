# session 28, call 3 (carry [".s28"]): HF transformers (eager, static cache + torch.compile) vs specserve plain and
# DFlash K=15 in one run, graphs == eager, with the setting call 2 used (/root/s28/best.env); lossless_gpu with it
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
BEST=$(cat /root/s28/best.env 2>/dev/null); echo "BEST=[$BEST]"
G=/root/smollm2.gguf; DF=/root/assets/smollm2-135m-dflash; R=/root/s28/r3; mkdir -p $R
env $BEST timeout ${HT:-380} python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --only plain "dflash K=15" \
    --hf-timeout ${HFT:-260} --timed-file /root/ev/gsm8k_test.jsonl:2 --out $R/smollm2_gpu-hf.json > $R/smollm2_gpu-hf.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/smollm2_gpu-hf.log | grep -v "^{" | tail -14
echo "[c3] hf $(( $(date +%s) - T0 )) s"
env $BEST timeout ${LT:-150} python benchmarks/lossless_gpu.py --model $G --dflash $DF --out $R/lossless.json > $R/lossless.log 2>&1
echo "rc=$?"; grep -v "^INFO" $R/lossless.log | tail -8
cp -r $R $OUT/
echo "[c3] total $(( $(date +%s) - T0 )) s"
