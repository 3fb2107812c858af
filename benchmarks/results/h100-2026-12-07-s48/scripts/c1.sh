# session 48, call 1 (carry [".s28q", ".s48"]): SPECSERVE_ATTN_PREFETCH (the one-query attention reads the metadata,
# the new row's cos / sin and its first KV tile's block ids before its PDL wait; 1: the first K tile into registers,
# 2: its K / V lines prefetched into L2) vs 0 (the default): the plain 8B-shaped step at batch 1 interleaved, then
# the chain profile of 0 / 1 / 2
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; P1="SPECSERVE_ATTN_PREFETCH=1"; P2="SPECSERVE_ATTN_PREFETCH=2"
timeout 130 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json --values "$A" "$P1" "$P2" "$A" "$P1" "$P2" "$A" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep.log | cut -c1-130; grep -i "error\|Traceback" $OUT/sweep.log | tail -3
timeout 90 python benchmarks/chain_profile.py --config-dir /root/q3 --top 14 --out $OUT/chain.json \
  --values "" "$P1" "$P2" > $OUT/chain.log 2>&1
echo "chain rc=$?"; grep "^==\|_paged_attn\|_merge\|< _merge\|_splitk_gemm_kernel < _rms" $OUT/chain.log | cut -c1-130
echo "[c1] total $(( $(date +%s) - T0 )) s"
