# session 32, call 4 (carry [".s28q", ".s32"]; warm, after call 3): a second process timing the Qwen3-8B-shaped plain
# and DFlash K=15 steps at batch 1 (graphs only) for the spread against call 1
T0=$(date +%s)
ls /root/q3/config.json > /dev/null 2>&1 || (mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout ${ST:-180} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 \
   --skip-eager --skip-hf --out $OUT/step_latency-q3-b1-rep.json > $OUT/step_latency-q3-b1-rep.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1-rep.log | tail -8
echo "[c4] total $(( $(date +%s) - T0 )) s"
