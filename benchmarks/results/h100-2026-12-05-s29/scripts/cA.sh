# session 29, call A (carry [".s28q", ".s29"]): H100/H200 per-GEMM tile + split sweep of the Qwen3-8B projections
# (triton_gemm.py, extra tiles), then the plain decode step b1 in the engine: default vs the sweep's best (A/B, one run)
T0=$(date +%s)
mkdir -p /root/q3 /root/s29 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
R=$OUT
timeout ${T1:-300} python benchmarks/triton_gemm.py --lean --best-env /root/s29/best.env --out $R/triton_gemm.json \
  --splits "qkv=4/8/16,o=8/16/32,down=8/16/32" \
  --tiles1 128:32:6:4 256:32:6:8 512:32:3:8 --tiles16 128:64:4:4 64:64:6:4 256:64:3:8 > $R/triton_gemm.log 2>&1
echo "rc=$?"; grep -A12 "^best per" $R/triton_gemm.log; cat /root/s29/best.env; cp /root/s29/best.env $R/
echo "[cA] sweep $(( $(date +%s) - T0 )) s"
. /root/s29/best.env
V1="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=$SPECSERVE_SPLIT_GEMM_BEST"
unset SPECSERVE_TRITON_GEMM_TILES
timeout ${T2:-240} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $R/sweep_plain.json \
  --values "SPECSERVE_PDL=1" "$V1" "SPECSERVE_PDL=1" "$V1" > $R/sweep_plain.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $R/sweep_plain.log | cut -c1-250
echo "[cA] total $(( $(date +%s) - T0 )) s"
