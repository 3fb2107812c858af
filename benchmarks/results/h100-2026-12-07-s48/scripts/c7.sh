# session 48, call 7 (carry [".s28q", ".s48"]): the committed default (one-query attention tiles of 128-wide heads
# at 8 warps) vs SPECSERVE_ATTN_WARPS=4 (the form before): step_latency.py plain / DFlash K=15 / EAGLE-3 K=7 at
# batch 1 (EAGLE-3's drafter steps are one-query steps too)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -f /root/q3/vocab.json ] || { mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz); }
for v in default aw4; do
  [ $v = aw4 ] && export SPECSERVE_ATTN_WARPS=4
  timeout 130 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
    --skip-hf --skip-eager --out $OUT/step_latency-$v.json > $OUT/step_latency-$v.log 2>&1
  echo "$v rc=$?"; grep -A4 "^method" $OUT/step_latency-$v.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency-$v.log
done
echo "[c7] total $(( $(date +%s) - T0 )) s"
