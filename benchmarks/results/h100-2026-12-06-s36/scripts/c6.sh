# session 36, call 6 (carry [".s28q", ".s36"]): the Qwen3-8B-shaped step at batch 1 on the current tree (graphs only,
# no eager / HF rows): plain vs the weight-read floor, DFlash K=15 and EAGLE-3 K=7 vs plain
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 --skip-hf --skip-eager \
   --out $OUT/step_latency-q3-b1.json 2>&1 | grep -v "^INFO\|^{" | tail -25
echo "[c6] total $(( $(date +%s) - T0 )) s"
