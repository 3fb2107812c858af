# (needs l2_prefetch.patch applied: git apply benchmarks/results/h100-2026-12-06-s39/l2_prefetch.patch; copy this script to .s39/)
# session 39, call p3 (carry [".s28q", ".s39"]): the persistent L2 prefetcher (SPECSERVE_L2_PREFETCH) on the
# Qwen3-8B shape (random bf16 weights), plain decode at batch 1, A/B in one process (fresh engine per value)
# site=attn: extra programs of each layer's attention kernel prefetch o_proj (early=1: before their PDL wait, during qkv)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout ${ST:-520} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_L2_PREFETCH \
   --values 0 "o=1,site=attn,ctas=32" "o=1,site=attn,ctas=128" "o=1,site=attn,ctas=32,early=1" "o=1,site=attn,ctas=128,early=1" "o=1,site=attn,ctas=128,early=1,policy=last" "o=0.5,site=attn,ctas=128,early=1,policy=last" "o=1,site=attn,ctas=512,early=1,policy=last" 0 \
   --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep-l2pf4.json > $OUT/sweep-l2pf4.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/sweep-l2pf4.log | grep -v "^{" | tail -20; grep -i "error\|Traceback" $OUT/sweep-l2pf4.log | tail -5
grep "^{" $OUT/sweep-l2pf4.log | head -3
echo "[p3] total $(( $(date +%s) - T0 )) s"
