# session 52, call 3 (carry [".s28q", ".s52"]): megakernel variants (residual preload rp, fine-grained down fg, o_proj
# L2 prefetch after the qkv signal po, generic prefetch pf), the fastest picked; then the engine's step
# (step_latency.py, batch 1): default (kn layout) plain + DFlash K=15, and plain with SPECSERVE_MEGAKERNEL=1
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${MT:-200} python benchmarks/megakernel_decode.py --reps 2 --variants ${MV:-rb=4,st=3 rb=4,st=3,rp=1 rb=4,st=3,rp=1,po=7 \
  rb=4,st=3,rp=1,fg=1 rb=4,st=3,rp=1,fg=1,po=7 rb=4,st=3,rp=1,fg=1,po=7,pf=1} --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v "Warning\|nanm\|first = \|done_" $OUT/mega.log | tail -14
BEST=$(python -c "import json; r=[x for x in json.load(open('$OUT/mega.json'))['rows'] if 'ms_per_step' in x]; print(min(r, key=lambda x: x['ms_per_step'])['variant'])" 2>/dev/null || echo rb=4,st=3)
echo "best: $BEST"
SPECSERVE_MEGAKERNEL=1 SPECSERVE_MEGAKERNEL_OPTS=$BEST timeout 150 python benchmarks/step_latency.py --config-dir /root/q3 \
  --batches 1 --configs plain --skip-hf --skip-eager --out $OUT/step_latency_mk1.json > $OUT/step_latency_mk1.log 2>&1
echo "step mk=1 rc=$? $(( $(date +%s) - T0 )) s"; grep -A2 "^method" $OUT/step_latency_mk1.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency_mk1.log
grep -i "error\|Traceback" $OUT/step_latency_mk1.log | head -3
SPECSERVE_MEGAKERNEL=0 timeout 200 python benchmarks/step_latency.py --config-dir /root/q3 \
  --batches 1 --configs plain dflash:15 --skip-hf --skip-eager --out $OUT/step_latency_mk0.json > $OUT/step_latency_mk0.log 2>&1
echo "step mk=0 rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "^method" $OUT/step_latency_mk0.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency_mk0.log
