# for the next session that gets an H200 (carry [".s28q", ".sNN"] with this file copied to .sNN/): exits at once on
# any other card. The H200's owed A/Bs on the current default (the one-query attention at 8 warps since 4e429d1):
# 4 warps (the form before), qkv over 4 K slices (the H100 setting, with and without pre 32) vs the H200's 8, the plain
# 8B-shaped step at batch 1 interleaved; then step_latency.py plain / DFlash K=15 / EAGLE-3 K=7 at batch 1
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0 ;; esac
T1=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; T=SPECSERVE_TRITON_GEMM_TILES; AW4="SPECSERVE_ATTN_WARPS=4"
Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4"
Q4P="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4:32"
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json \
  --values "$A" "$AW4" "$Q4" "$Q4P" "$A" "$AW4" "$Q4" "$Q4P" "$A" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A12 "^weight-read floor" $OUT/sweep.log | cut -c1-150; grep -i "error\|Traceback" $OUT/sweep.log | tail -3
timeout 130 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
  --skip-hf --skip-eager --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "step rc=$?"; grep -A4 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
echo "[next-h200] total $(( $(date +%s) - T1 )) s"
