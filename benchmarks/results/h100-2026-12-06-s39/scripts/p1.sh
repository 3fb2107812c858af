# session 39, call p1 (carry [".s28q", ".s39"]): the persistent L2 prefetcher (SPECSERVE_L2_PREFETCH) on the
# Qwen3-8B shape (random bf16 weights), plain decode at batch 1, A/B in one process (fresh engine per value)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout ${ST:-520} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_L2_PREFETCH \
   --values 0 o=1 0 o=1 o=0.5 "o=1@3" "o=1,ctas=32" "o=1,ctas=64" "o=1,policy=last" "o=1,gate_up=0.1@8" \
   --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep-l2pf.json > $OUT/sweep-l2pf.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/sweep-l2pf.log | grep -v "^{" | tail -20; grep -i "error\|Traceback" $OUT/sweep-l2pf.log | tail -5
grep "^{" $OUT/sweep-l2pf.log | head -3
echo "[p1] total $(( $(date +%s) - T0 )) s"
