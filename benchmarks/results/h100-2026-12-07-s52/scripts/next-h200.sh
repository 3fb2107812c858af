# after session 52, for an H200 (copy to an ignored .sNN/ beside .s28q, carry both; runs on any card and says which):
# the megakernel's forms on that card, then the engine's plain step with and without it (separate processes), and
# the default DFlash K=15 step beside them for #6's ratio
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 150 python benchmarks/megakernel_decode.py --reps 2 --variants rb=4,st=3,rp=1,pf=1,mg=4 rb=4,st=3,rp=0,pf=0,mg=0 \
  rb=4,st=3,rp=1,pf=1,mg=0 rb=4,st=3,rp=1,pf=2,mg=4 --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v "Warning\|nanm\|first = \|done_" $OUT/mega.log | tail -9
BEST=$(python -c "import json; r=[x for x in json.load(open('$OUT/mega.json'))['rows'] if 'ms_per_step' in x]; print(min(r, key=lambda x: x['ms_per_step'])['variant'])" 2>/dev/null || echo rb=4,st=3,rp=1,pf=1,mg=4)
for MK in 1 0; do
  CF="plain"; [ $MK = 0 ] && CF="plain dflash:15"
  SPECSERVE_MEGAKERNEL=$MK SPECSERVE_MEGAKERNEL_OPTS=$BEST timeout 200 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches 1 --configs $CF --skip-hf --skip-eager --out $OUT/step_latency_mk$MK.json > $OUT/step_latency_mk$MK.log 2>&1
  echo "step mk=$MK ($BEST) rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "^method" $OUT/step_latency_mk$MK.log
  grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency_mk$MK.log
done
