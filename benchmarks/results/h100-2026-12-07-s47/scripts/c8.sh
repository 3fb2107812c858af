# session 47, call 8 (carry [".s28q", ".s47"]): the greedy tail over up to 64 programs a row (the vocabulary split)
# vs one program a row (SPECSERVE_GREEDY_TAIL_PROGRAMS=1, the form before): the plain 8B-shaped step at batch 1
# interleaved, the chain profile of both, then step_latency.py plain / DFlash K=15 for both
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; P1="SPECSERVE_GREEDY_TAIL_PROGRAMS=1"
timeout 100 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json --values "$A" "$P1" "$A" "$P1" "$A" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $OUT/sweep.log | cut -c1-130
timeout 70 python benchmarks/chain_profile.py --config-dir /root/q3 --top 40 --out $OUT/chain.json \
  --values "" "$P1" > $OUT/chain.log 2>&1
echo "chain rc=$?"; grep "greedy_tail\|< _greedy\|^==" $OUT/chain.log | cut -c1-130
for v in default p1; do
  [ $v = p1 ] && export SPECSERVE_GREEDY_TAIL_PROGRAMS=1
  timeout 100 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 \
    --skip-hf --skip-eager --out $OUT/step_latency-$v.json > $OUT/step_latency-$v.log 2>&1
  echo "$v rc=$?"; grep -A3 "^method" $OUT/step_latency-$v.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency-$v.log
done
echo "[c8] total $(( $(date +%s) - T0 )) s"
