# session 48, call 8 (carry [".s28q", ".s48"]): only on an H200 (an H100 exits at once): step_latency.py plain at
# batch 1 on the committed default, the H200's owed ratio to its floor
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0 ;; esac
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain \
  --skip-hf --skip-eager --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "rc=$?"; grep -A2 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
echo "[c8] total $(( $(date +%s) - T0 )) s"
