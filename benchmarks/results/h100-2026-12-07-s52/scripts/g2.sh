# session 52 (carry [".s28q", ".s52"]): megakernel variants (megakernel_decode.py: paged KV through a shuffled block
# table, the engine's layouts read in place), the fastest picked; then the engine's step (step_latency.py: plain and
# DFlash K=15, batch 1) without the megakernel (default kn layout) and with it (SPECSERVE_MEGAKERNEL=1: nk layout,
# batch-1 plain steps one persistent kernel inside the decode graph)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${MT:-170} python benchmarks/megakernel_decode.py --reps 2 --variants ${MV:-rb=4,st=3 rb=4,st=3,po=7 \
  rb=4,st=3,mg=4 rb=4,st=3,mg=4,po=7 rb=4,st=3,mg=8,ch=64,po=7} --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v Warning $OUT/mega.log | tail -12
BEST=$(python -c "import json; r=[x for x in json.load(open('$OUT/mega.json'))['rows'] if 'ms_per_step' in x]; print(min(r, key=lambda x: x['ms_per_step'])['variant'])" 2>/dev/null || echo rb=4,st=3)
echo "best: $BEST"
for MK in 0 1; do
  SPECSERVE_MEGAKERNEL=$MK SPECSERVE_MEGAKERNEL_OPTS=$BEST timeout 200 python benchmarks/step_latency.py --config-dir /root/q3 \
    --batches 1 --configs plain dflash:15 --skip-hf --skip-eager --out $OUT/step_latency_mk$MK.json > $OUT/step_latency_mk$MK.log 2>&1
  echo "step mk=$MK rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "^method" $OUT/step_latency_mk$MK.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency_mk$MK.log
  grep -i "megakernel\|error\|Traceback" $OUT/step_latency_mk$MK.log | head -5
done
