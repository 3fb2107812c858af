# session 43, call 1 (carry [".partA", ".whl", ".s28", ".s32w", ".s28q", ".s42", ".s43"]; H200 only, else exit):
# setup for .s42/c2.sh (GGUF half A, wheels, drafters into /root), then the one-row split-K tile sweep on the H200
# (session 29's cA on the H100 found other tiles there) and the 8B-shaped plain step A/B: default vs the best tiles
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0 ;; esac
T0=$(date +%s)
bash .s42/c1s.sh
[ "${SWEEP:-1}" = 1 ] || { echo "[c1] setup only"; exit 0; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=$OUT; mkdir -p /root/s43
timeout ${T1:-200} python benchmarks/triton_gemm.py --rows 1 --best-env /root/s43/best.env --out $R/triton_gemm.json \
  --splits "qkv=4/8/16,o=8/16,down=8/16" \
  --tiles1 128:32:6:4 128:64:4:4 256:32:6:8 512:32:3:8 256:64:3:8 > $R/triton_gemm.log 2>&1
echo "rc=$?"; grep -A8 "^best per" $R/triton_gemm.log; cat /root/s43/best.env; cp /root/s43/best.env $R/
echo "[c1] sweep $(( $(date +%s) - T0 )) s"
. /root/s43/best.env
V1="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=$SPECSERVE_SPLIT_GEMM_BEST"
unset SPECSERVE_TRITON_GEMM_TILES
timeout ${T2:-200} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $R/sweep_plain.json \
  --values "SPECSERVE_PDL=1" "$V1" "SPECSERVE_PDL=1" "$V1" > $R/sweep_plain.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $R/sweep_plain.log | cut -c1-250
echo "[c1] total $(( $(date +%s) - T0 )) s"
