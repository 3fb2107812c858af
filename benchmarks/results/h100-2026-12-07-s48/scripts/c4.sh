# session 48, call 4 (carry [".s28q", ".s48"]): on an H200 .s48/c2.sh (its H200 branch); on an H100 the warps of the
# one-row step's small kernels (new knobs SPECSERVE_NORM_WARPS: default 16 at 4096 columns, SPECSERVE_ATTN_WARPS:
# default 4, SPECSERVE_SILU_WARPS: default 4) vs the defaults, the plain 8B-shaped step at batch 1 interleaved
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
if [[ "$N" == *H200* ]]; then bash .s48/c2.sh; exit; fi
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; NW=SPECSERVE_NORM_WARPS; AW=SPECSERVE_ATTN_WARPS; SW=SPECSERVE_SILU_WARPS
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json \
  --values "$A" "$NW=4" "$NW=2" "$NW=8" "$AW=2" "$AW=8" "$SW=2" "$SW=8" "$A" "$NW=4" "$NW=2" "$A" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A14 "^weight-read floor" $OUT/sweep.log | cut -c1-100; grep -i "error\|Traceback" $OUT/sweep.log | tail -3
echo "[c4] total $(( $(date +%s) - T0 )) s"
