# session 51, call 3 (carry [".s28q", ".s51"]; the budget's last call, so the engine's step first): the engine's plain
# step (step_latency.py), then megakernel variants: call 2's best (rb=4,st=3) against the o_proj merge of the chunks
# in one load (mg=4), + L2 prefetch of 8 units a phase, and 64-token chunks merged in one load (mg=8,ch=64)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain --skip-hf --skip-eager \
  --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "step rc=$? $(( $(date +%s) - T0 )) s"; grep -A1 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
timeout 200 python benchmarks/megakernel_decode.py --reps 2 --variants rb=4,st=3 rb=4,st=3,mg=4 rb=4,st=3,mg=4,pf=8 \
  rb=4,st=3,mg=8,ch=64 --out $OUT/mega.json > $OUT/mega.log 2>&1
echo "mega rc=$? $(( $(date +%s) - T0 )) s"; grep -v Warning $OUT/mega.log | tail -8
