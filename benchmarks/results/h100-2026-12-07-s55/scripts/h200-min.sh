N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0;; esac
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
for R in "0|plain|a" "1|plain|b" "0|plain|c" "1|plain|d"; do
  IFS='|' read MK CF TAG <<< "$R"; TAG=mk$MK-$TAG
  SPECSERVE_MEGAKERNEL=$MK timeout 45 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches 1 --configs $CF --skip-hf --skip-eager --out $OUT/step_$TAG.json > $OUT/step_$TAG.log 2>&1
  echo "step $TAG rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "^method" $OUT/step_$TAG.log
  grep -o "weight-read floor [0-9.]* ms" $OUT/step_$TAG.log
done
