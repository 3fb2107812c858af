# session 53: the attention's own chunk merge (am=N) against o_proj's (mg=4), short and long contexts, standalone
# and in the engine (decode_env_sweep: one process a value list; the default engine beside it)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
B=rb=4,st=3,rp=1,pf=1
timeout 80 python benchmarks/megakernel_decode.py --reps 2 --variants $B,mg=4 $B,am=8 $B,am=4 --out $OUT/mega128.json > $OUT/mega128.log 2>&1
echo "mega128 rc=$? $(( $(date +%s) - T0 )) s"; grep "x floor" $OUT/mega128.log
for PL in 128 1800; do
  SPECSERVE_MEGAKERNEL=0 timeout 50 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_MEGAKERNEL \
    --values 0 --prompt-len $PL --max-model-len 4096 --out $OUT/eng$PL-mk0.json > $OUT/eng$PL-mk0.log 2>&1
  echo "eng$PL mk0 rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "step ms" $OUT/eng$PL-mk0.log | grep -v "^--"
  SPECSERVE_MEGAKERNEL=1 timeout 70 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_MEGAKERNEL_OPTS \
    --values mg=4 am=8 --prompt-len $PL --max-model-len 4096 --out $OUT/eng$PL-mk1.json > $OUT/eng$PL-mk1.log 2>&1
  echo "eng$PL mk1 rc=$? $(( $(date +%s) - T0 )) s"; grep -A3 "step ms" $OUT/eng$PL-mk1.log | grep -v "^--"
done
timeout 90 python benchmarks/megakernel_decode.py --reps 1 --prompt 1800 --check-steps 1100 --variants $B,mg=4 $B,am=8 \
  --out $OUT/mega1800.json > $OUT/mega1800.log 2>&1
echo "mega1800 rc=$? $(( $(date +%s) - T0 )) s"; grep "x floor" $OUT/mega1800.log
