# session 51, call 1 (carry [".s28q", ".s51"]): the persistent one-launch decode step (megakernel_decode.py, its
# variants: unit rows, L2 prefetch depth, attention chunk) against the engine's plain step (step_latency.py) on the
# same card, Qwen3-8B shape, random bf16 weights, batch 1
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${MT:-330} python benchmarks/megakernel_decode.py ${MV:+--variants $MV} --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v Warning $OUT/mega.log | tail -15
timeout 150 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain --skip-hf --skip-eager \
  --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "step rc=$?"; grep -A3 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
tail -3 $OUT/step_latency.log
echo "[g1] total $(( $(date +%s) - T0 )) s"
