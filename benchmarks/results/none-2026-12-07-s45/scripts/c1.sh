# session 45, call 1 (carry [".partA", ".whl", ".s28", ".s32w", ".s28q", ".s42", ".s45"]; runs on whatever card
# comes): setup for .s42/c2.sh (GGUF half A, wheels, drafters into /root), then the Qwen3-8B-shaped plain step at
# batch 1 against the weight-read floor measured in the same run: the default three times, interleaved with the
# split merge in o_proj (SPECSERVE_ATTN_MERGE=gemm, new) and two settings not measured on the current tree (the norm
# prologue + the fused split merge together; the split-KV count capped at 4)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
bash .s42/c1s.sh
if [[ "$N" == *H200* ]]; then  # session 43 c1g.sh's one-row split-K tile sweep + engine A/B (no H200 tiles yet)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
R=$OUT; mkdir -p /root/s43
timeout ${T1:-180} python benchmarks/triton_gemm.py --rows 1 --best-env /root/s43/best.env --out $R/triton_gemm.json \
  --splits "qkv=4/8/16,o=8/16,down=8/16" \
  --tiles1 128:32:6:4 128:64:4:4 256:32:6:8 512:32:3:8 256:64:3:8 > $R/triton_gemm.log 2>&1
echo "rc=$?"; grep -A8 "^best per" $R/triton_gemm.log; cat /root/s43/best.env; cp /root/s43/best.env $R/
echo "[c1] sweep $(( $(date +%s) - T0 )) s"
. /root/s43/best.env
V1="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=$SPECSERVE_SPLIT_GEMM_BEST"
unset SPECSERVE_TRITON_GEMM_TILES
timeout ${T2:-300} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $R/sweep_plain.json \
  --values "SPECSERVE_PDL=1" "$V1" "SPECSERVE_ATTN_MERGE=gemm" "SPECSERVE_PDL=1" "$V1" "SPECSERVE_ATTN_MERGE=gemm" > $R/sweep_plain.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $R/sweep_plain.log | cut -c1-250
echo "[c1] total $(( $(date +%s) - T0 )) s"
exit 0
fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
V0="SPECSERVE_PDL=1"; VG="SPECSERVE_ATTN_MERGE=gemm"; VF="SPECSERVE_FUSED_NORM=2;SPECSERVE_ATTN_MERGE=fused"
V4="SPECSERVE_ATTN_MAX_SPLITS=4"
timeout ${T2:-490} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain.json \
  --values "$V0" "$VG" "$V0" "$VG" "$V4" "$VF" "$V0" > $OUT/sweep_plain.log 2>&1
echo "rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep_plain.log | cut -c1-250
echo "[c1] total $(( $(date +%s) - T0 )) s"
