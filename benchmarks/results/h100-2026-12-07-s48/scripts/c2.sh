# session 48, call 2 (carry [".s28q", ".s48"]): o_proj's one-row split-K tile reading its first weight rows before
# its PDL wait (GemmTile.pre 64 / 128; with the merge kernel releasing it early) vs the default, the plain
# 8B-shaped step at batch 1 interleaved; on an H200 instead: qkv over 4 slices (the H100 setting, with and without
# pre 32) and o pre 128 vs the H200's default, then step_latency.py plain / DFlash K=15 / EAGLE-3 K=7
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; T=SPECSERVE_TRITON_GEMM_TILES
if [[ "$N" == *H200* ]]; then
  Q4P="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4:32"
  Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4"
  O="$T=o@1=128:32:4:4:128"
  VALS=("$A" "$Q4" "$Q4P" "$O" "$A" "$Q4" "$Q4P" "$O" "$A")
else
  O6="$T=qkv@1=128:32:4:4:32,o@1=128:32:4:4:64"; O12="$T=qkv@1=128:32:4:4:32,o@1=128:32:4:4:128"
  VALS=("$A" "$O6" "$O12" "$O12;SPECSERVE_PDL_EARLY=merge" "$A" "$O6" "$O12" "$A")
fi
timeout 170 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json --values "${VALS[@]}" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A12 "^weight-read floor" $OUT/sweep.log | cut -c1-150; grep -i "error\|Traceback" $OUT/sweep.log | tail -3
if [[ "$N" == *H200* ]]; then
  timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
    --skip-hf --skip-eager --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
  echo "step rc=$?"; grep -A4 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
fi
echo "[c2] total $(( $(date +%s) - T0 )) s"
