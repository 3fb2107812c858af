# session 47, call 4 (carry [".s28q", ".s47"]): issue #6's full step-latency table on the committed default (plain,
# DFlash K=4/15, EAGLE-3 K=4/7 at batch 1-8 with graphs; plain and DFlash K=15 with --enforce-eager; HF's forward)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${ST:-540} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 2 4 8 --max-tokens 160 \
  --short-tokens 32 --configs plain dflash:4 dflash:15 eagle3:4 eagle3:7 --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{\|tokenizer you are" $OUT/step_latency.log | grep -A40 "^Qwen3-8B-shaped" | cut -c1-150
echo "[c4] total $(( $(date +%s) - T0 )) s"
