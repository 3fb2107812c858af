# session 46, call 2 (carry [".s28q", ".s46"], right after c1 on the warm machine; prefix the knob that won in c1, e.g.
# `SPECSERVE_ATTN_MERGE=gemm bash .s46/c2.sh`): the Qwen3-8B-shaped step latency, plain / DFlash K=15 / EAGLE-3 K=7
# at batch 1, graphs only, against the floor measured in the same run
T0=$(date +%s)
env | grep '^SPECSERVE_' || echo "(default settings)"
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout ${ST:-500} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
   --skip-hf --skip-eager --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1.log | tail -25
echo "[c2] total $(( $(date +%s) - T0 )) s"
