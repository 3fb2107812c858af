# session 53, the H200 plan (exits at once on any other card): the megakernel standalone, then the engine's batch-1
# plain step with it and without (separate processes, both orders) and the default DFlash K=15 step
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0;; esac
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 120 python benchmarks/megakernel_decode.py --reps 2 --variants rb=4,st=3,rp=1,pf=1,mg=4 rb=4,st=4,rp=1,pf=1,mg=4 \
  rb=4,st=3,rp=1,pf=2,mg=4 --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v "Warning\|nanm\|first = \|done_" $OUT/mega.log | tail -8
BEST=$(python -c "import json; r=[x for x in json.load(open('$OUT/mega.json'))['rows'] if 'ms_per_step' in x]; print(min(r, key=lambda x: x['ms_per_step'])['variant'])" 2>/dev/null || echo rb=4,st=3,rp=1,pf=1,mg=4)
for R in "1|plain|a" "0|plain dflash:15|b" "1|plain|c" "0|plain|d"; do
  IFS='|' read MK CF TAG <<< "$R"; TAG=mk$MK-$TAG
  SPECSERVE_MEGAKERNEL=$MK SPECSERVE_MEGAKERNEL_OPTS=$BEST timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches 1 --configs $CF --skip-hf --skip-eager --out $OUT/step_$TAG.json > $OUT/step_$TAG.log 2>&1
  echo "step $TAG ($BEST) rc=$? $(( $(date +%s) - T0 )) s"; grep -A2 "^method" $OUT/step_$TAG.log
  grep -o "weight-read floor [0-9.]* ms" $OUT/step_$TAG.log
done
