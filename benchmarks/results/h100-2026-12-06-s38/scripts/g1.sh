# session 38, call 1 (carry [".s28q", ".s38"]): SPECSERVE_FOLD_NORMS on the Qwen3-8B shape (random weights):
# fp32 greedy tokens folded vs not (4 layers, random norm weights), then the 36-layer bf16 plain step at batch 1
# A/B/A/B in one process (decode_env_sweep, step_latency's timing), then step_latency plain + DFlash K=15 (default)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout ${FT:-150} python benchmarks/fold_norms_gpu.py --config-dir /root/q3 --layers 4 --dtype float32 --tokens 48 \
   --out $OUT/fold_norms_gpu-fp32.json > $OUT/fold_norms_gpu-fp32.log 2>&1
echo "rc=$?"; grep "^{" $OUT/fold_norms_gpu-fp32.log; grep -i "error\|Traceback" $OUT/fold_norms_gpu-fp32.log | tail -5
echo "[g1] fp32 check $(( $(date +%s) - T0 )) s"
timeout ${ST:-300} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_FOLD_NORMS \
   --values 0 auto 0 auto --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep-fold.json > $OUT/sweep-fold.log 2>&1
echo "rc=$?"; grep "^{" $OUT/sweep-fold.log; grep -i "error\|Traceback" $OUT/sweep-fold.log | tail -5
echo "[g1] total $(( $(date +%s) - T0 )) s"
