# session 54's copy of session 53's plan (its sweep adds pf=2 and rb=8: on the H100 both lost, but the H200 streams
# ~1.45x the bytes, so it may want more in flight); after session 53, for an H200 (copy to an ignored .sNN/ beside .s28q, carry both; exits at once on another card):
# the megakernel standalone (defaults: rb=4,st=3,rp=1,pf=1,am=8), the engine's batch-1 plain step with it and without
# (separate processes, both orders) with the default DFlash K=15 step, then both at an 1800-token context
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0;; esac
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 140 python benchmarks/megakernel_decode.py --reps 2 --variants rb=4 rb=4,st=4 rb=4,pf=2 rb=8 rb=4,am=0,mg=4 \
  --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep "x floor" $OUT/mega.log
for R in "1|plain|a" "0|plain dflash:15|b" "1|plain|c" "0|plain|d"; do
  IFS='|' read MK CF TAG <<< "$R"; TAG=mk$MK-$TAG
  SPECSERVE_MEGAKERNEL=$MK timeout 100 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches 1 --configs $CF --skip-hf --skip-eager --out $OUT/step_$TAG.json > $OUT/step_$TAG.log 2>&1
  echo "step $TAG rc=$? $(( $(date +%s) - T0 )) s"; grep -A2 "^method" $OUT/step_$TAG.log
  grep -o "weight-read floor [0-9.]* ms" $OUT/step_$TAG.log
done
timeout 90 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_MEGAKERNEL --values 0 1 0 1 \
  --prompt-len 1800 --max-model-len 4096 --out $OUT/ctx1800.json > $OUT/ctx1800.log 2>&1
echo "ctx1800 rc=$? $(( $(date +%s) - T0 )) s"; grep -A5 "step ms" $OUT/ctx1800.log
