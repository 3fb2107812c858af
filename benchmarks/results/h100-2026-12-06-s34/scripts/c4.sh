# session 34, call 4 (carry [".s28q", ".s34"]): the Qwen3-8B-shaped plain decode step at batch 1 on an H100: GemmTile.pre
# (each one-row split-K program reads its first weight rows before its PDL wait; session 15 on the H200: -0.7%) and the
# merge's early release, interleaved with the default; then the default step's per-kernel table (kprof.py)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
T1="SPECSERVE_TRITON_GEMM_TILES=qkv@1=512:32:3:8:64,o@1=128:32:4:4:128,down@1=128:32:4:4:128"
T2="SPECSERVE_TRITON_GEMM_TILES=qkv@1=512:32:3:8:32,o@1=128:32:4:4:64,down@1=128:32:4:4:64"
timeout ${T1S:-330} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_pre.json \
  --values "SPECSERVE_PDL=1" "$T1" "$T2" "$T1;SPECSERVE_PDL_EARLY=merge" "SPECSERVE_PDL=1" "$T1" > $OUT/sweep_pre.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $OUT/sweep_pre.log | cut -c1-60,200-260
echo "[c4] sweep $(( $(date +%s) - T0 )) s"
mkdir -p /root/kdef; OUT2=$OUT; OUT=/root/kdef timeout ${KT:-80} python .s34/kprof.py /root/q3 1 > $OUT2/kprof-default.log 2>&1
echo "rc=$?"; grep -v "^\[transformers\]\|UserWarning\|_warn_once" $OUT2/kprof-default.log | head -16 | cut -c1-125
cp /root/kdef/*.json $OUT2/ 2>/dev/null
echo "[c4] total $(( $(date +%s) - T0 )) s"
