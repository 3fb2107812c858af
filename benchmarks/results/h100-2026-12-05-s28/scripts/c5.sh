# session 28, call 5 (carry [".s28q"]): the Qwen3-8B-shaped step latency on the current tree (random bf16 weights):
# plain, DFlash K=15, EAGLE-3 K=7 at batch 1, graphs and --enforce-eager, HF transformers' forward, the floor
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz) && ls /root/q3
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
timeout ${ST:-520} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
   --out $OUT/step_latency-q3-b1-fixed.json > $OUT/step_latency-q3-b1-fixed.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1-fixed.log | tail -25
echo "[c5] total $(( $(date +%s) - T0 )) s"
