# session 48, call 5 (carry [".s28q", ".s48"]): the attention kernel at 8 / 16 warps (SPECSERVE_ATTN_WARPS; call 4:
# 8 warps -28..-40 us a step at batch 1) and 8 with 8-warp SiLU-mul, vs the default (4), batches 1 and 4 interleaved
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -f /root/q3/vocab.json ] || { mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz); }
A="SPECSERVE_PDL=1"; AW=SPECSERVE_ATTN_WARPS; SW=SPECSERVE_SILU_WARPS
timeout 230 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 4 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json \
  --values "$A" "$AW=8" "$AW=16" "$AW=8;$SW=8" "$A" "$AW=8" "$AW=16" "$A" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A20 "^weight-read floor" $OUT/sweep.log | cut -c1-100; grep -i "error\|Traceback" $OUT/sweep.log | tail -3
echo "[c5] total $(( $(date +%s) - T0 )) s"
