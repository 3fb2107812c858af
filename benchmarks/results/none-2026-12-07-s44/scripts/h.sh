# session 44, one call on whatever card comes (carry [".s28q", ".s44"]): the Qwen3-8B-shaped plain step at batch 1
# vs the weight-read floor measured in the same run, the default settings three times in one process
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${T2:-170} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain.json \
  --values "SPECSERVE_PDL=1" "SPECSERVE_PDL=1" "SPECSERVE_PDL=1" > $OUT/sweep_plain.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/sweep_plain.log | tail -14 | cut -c1-250
echo "[h] total $(( $(date +%s) - T0 )) s"
