# session 47, call 7 (carry [".s28q", ".s47"]): the committed default (42656e5: the H100's one-row qkv tile with pre
# 32) vs the tile without it, the plain 8B-shaped step at batch 1 interleaved, then step_latency.py plain / DFlash K=15
# / EAGLE-3 K=7 on the default; on an H200 instead: qkv over 4 slices (the H100 setting, with and without pre 32) vs
# the H200's default 8 slices
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"
T=SPECSERVE_TRITON_GEMM_TILES
if [[ "$N" == *H200* ]]; then
  Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4"
  Q4P="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;$T=qkv@1=128:32:4:4:32"
  VALS=("$A" "$Q4" "$Q4P" "$A" "$Q4" "$Q4P" "$A")
else
  VALS=("$A" "$T=qkv@1=128:32:4:4" "$A" "$T=qkv@1=128:32:4:4" "$A")
fi
timeout 150 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/sweep.json --values "${VALS[@]}" > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep.log | cut -c1-130
timeout 110 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
  --skip-hf --skip-eager --out $OUT/step_latency.json > $OUT/step_latency.log 2>&1
echo "step rc=$?"; grep -A4 "^method" $OUT/step_latency.log; grep -o "weight-read floor [0-9.]* ms" $OUT/step_latency.log
echo "[c7] total $(( $(date +%s) - T0 )) s"
