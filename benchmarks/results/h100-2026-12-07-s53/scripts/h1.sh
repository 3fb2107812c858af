# session 53, call 1: the megakernel's forms on this card (incl. deeper pipelines for the H200's bandwidth), then the
# engine's plain step with and without it (separate processes, both orders) and the default DFlash K=15 step
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 200 python benchmarks/megakernel_decode.py --reps 2 --variants rb=4,st=3,rp=1,pf=1,mg=4 rb=4,st=4,rp=1,pf=1,mg=4 \
  rb=4,st=3,rp=1,pf=2,mg=4 rb=8,st=3,rp=1,pf=1,mg=4 rb=4,st=3,rp=0,pf=0,mg=0 --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v "Warning\|nanm\|first = \|done_" $OUT/mega.log | tail -12
BEST=$(python -c "import json; r=[x for x in json.load(open('$OUT/mega.json'))['rows'] if 'ms_per_step' in x]; print(min(r, key=lambda x: x['ms_per_step'])['variant'])" 2>/dev/null || echo rb=4,st=3,rp=1,pf=1,mg=4)
for R in "1|1 4 8|plain" "0|1 4 8|plain" "0|1|dflash:15" "1|1|plain"; do
  IFS='|' read MK BS CF <<< "$R"; TAG=mk$MK-$(echo $BS | tr ' ' _)-${CF%%:*}
  SPECSERVE_MEGAKERNEL=$MK SPECSERVE_MEGAKERNEL_OPTS=$BEST timeout 150 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches $BS --configs $CF --skip-hf --skip-eager --out $OUT/step_$TAG.json > $OUT/step_$TAG.log 2>&1
  echo "step $TAG ($BEST) rc=$? $(( $(date +%s) - T0 )) s"; grep -A5 "^method" $OUT/step_$TAG.log
  grep -o "weight-read floor [0-9.]* ms" $OUT/step_$TAG.log
done
