# session 46, call 1 (carry [".s28q", ".s46"]; whatever card comes): the Qwen3-8B-shaped plain step at batch 1 against
# the weight-read floor measured in the same run: the default interleaved with the split merge in o_proj
# (SPECSERVE_ATTN_MERGE=gemm; VS also skips empty splits), then two settings not measured on the current tree;
# on an H200 with time left, session 43's one-row split-K tile sweep (no H200 tiles yet)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
V0="SPECSERVE_PDL=1"; VG="SPECSERVE_ATTN_MERGE=gemm"; VS="SPECSERVE_ATTN_MERGE=gemm;SPECSERVE_ATTN_MERGE_SKIP_EMPTY=1"
timeout ${T2:-330} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain.json \
  --values "$V0" "$VG" "$VS" "$V0" "$VG" "$VS" "SPECSERVE_ATTN_MAX_SPLITS=4" \
  "SPECSERVE_FUSED_NORM=2;SPECSERVE_ATTN_MERGE=fused" "$V0" > $OUT/sweep_plain.log 2>&1
echo "rc=$?"; grep -A11 "^weight-read floor" $OUT/sweep_plain.log | cut -c1-250
echo "[c1] sweep $(( $(date +%s) - T0 )) s"
L=$(( 560 - ($(date +%s) - T0) ))
if [[ "$N" == *H200* && $L -gt 90 ]]; then
  mkdir -p /root/s43
  timeout $L python benchmarks/triton_gemm.py --rows 1 --best-env /root/s43/best.env --out $OUT/triton_gemm.json \
    --splits "qkv=4/8/16,o=8/16,down=8/16" \
    --tiles1 128:32:6:4 128:64:4:4 256:32:6:8 512:32:3:8 256:64:3:8 > $OUT/triton_gemm.log 2>&1
  echo "rc=$?"; grep -A8 "^best per" $OUT/triton_gemm.log; cat /root/s43/best.env; cp /root/s43/best.env $OUT/ 2>/dev/null
fi
echo "[c1] total $(( $(date +%s) - T0 )) s"
