# session 46, call 3 (carry [".s28q", ".s46"]; any card, meant for an H200): the one-row split-K tile sweep of the
# Qwen3-8B projections (session 43's list: the defaults + five wider / deeper tiles, 4-16-way splits), then the
# plain step at batch 1 in the engine with the sweep's best tiles and splits against the defaults, A/B/A/B, beside
# the weight-read floor measured in the same run
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 /root/s46 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${T1:-200} python benchmarks/triton_gemm.py --rows 1 --best-env /root/s46/best.env --out $OUT/triton_gemm.json \
  --splits "qkv=4/8/16,o=8/16,down=8/16" \
  --tiles1 128:32:6:4 128:64:4:4 256:32:6:8 512:32:3:8 256:64:3:8 > $OUT/triton_gemm.log 2>&1
echo "rc=$?"; grep -A8 "^best per" $OUT/triton_gemm.log; cat /root/s46/best.env; cp /root/s46/best.env $OUT/
echo "[c3] sweep $(( $(date +%s) - T0 )) s"
. /root/s46/best.env
V1="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=$SPECSERVE_SPLIT_GEMM_BEST"
unset SPECSERVE_TRITON_GEMM_TILES SPECSERVE_SPLIT_GEMM_BEST
L=$(( 570 - ($(date +%s) - T0) ))
timeout $L python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain.json \
  --values "SPECSERVE_PDL=1" "$V1" "SPECSERVE_PDL=1" "$V1" > $OUT/sweep_plain.log 2>&1
echo "rc=$?"; grep -A6 "^weight-read floor" $OUT/sweep_plain.log | cut -c1-250
echo "[c3] total $(( $(date +%s) - T0 )) s"
