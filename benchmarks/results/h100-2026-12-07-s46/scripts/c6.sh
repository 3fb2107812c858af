# session 46, call 6 (carry [".s28q", ".s46"]; exits at once on anything but an H200; lean, for the 284 s of budget
# left): call 4's qkv split A/B on an H200, where qkv keeps 8 slices: the default vs qkv over 4 slices with the
# 128-wide one-row tile (the H100 setting), the plain 8B-shaped step at batch 1 interleaved beside the floor
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
[[ "$N" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"
Q2="SPECSERVE_SPLIT_GEMM=qkv=2,o=8,down=8"
Q2N="SPECSERVE_SPLIT_GEMM=qkv=2,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=64:32:4:4"
Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=128:32:4:4"
Q4W="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=256:32:4:4"
OLD="SPECSERVE_SPLIT_GEMM=qkv=8,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=512:32:3:8"
if [[ "$N" == *H100* ]]; then VALS=("$A" "$Q2" "$Q2N" "$OLD" "$A" "$Q2" "$OLD" "$A"); else VALS=("$A" "$Q4" "$A" "$Q4" "$A"); fi
timeout 150 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_qkv.json --values "${VALS[@]}" > $OUT/sweep_qkv.log 2>&1
echo "rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep_qkv.log | cut -c1-200
echo "[c6] total $(( $(date +%s) - T0 )) s"
