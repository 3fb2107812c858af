# session 38 (carry [".s28q", ".s38"]): SPECSERVE_FOLD_NORMS=1 on the Qwen3-8B shape (random weights): the bf16 plain
# step at batch 1 A/B/A/B in one process, the kernels alone (checks, us a launch), fp32 tokens folded vs not (4
# layers, random norm weights), then step_latency plain + DFlash K=15 folded in what time is left of CAP s
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s); CAP=${CAP:-370}
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_FOLD_NORMS \
   --values 0 1 0 1 --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep-fold.json > $OUT/sweep-fold.log 2>&1
echo "rc=$?"; grep "^{" $OUT/sweep-fold.log | cut -c1-230; grep -i "error" $OUT/sweep-fold.log | tail -3
echo "[g5] sweep $(( $(date +%s) - T0 )) s"
timeout 60 python .s38/kcheck.py > $OUT/kcheck.log 2>&1; grep -v Warn $OUT/kcheck.log | tail -5
echo "[g5] kcheck $(( $(date +%s) - T0 )) s"
timeout $(( CAP - ($(date +%s) - T0) )) python benchmarks/fold_norms_gpu.py --config-dir /root/q3 --layers 4 --dtype float32 \
   --tokens 48 --out $OUT/fold_norms_gpu-fp32.json > $OUT/fold_norms_gpu-fp32.log 2>&1
echo "rc=$?"; grep "^{" $OUT/fold_norms_gpu-fp32.log; grep -i "error" $OUT/fold_norms_gpu-fp32.log | tail -3
echo "[g5] fp32 $(( $(date +%s) - T0 )) s"
LEFT=$(( CAP - ($(date +%s) - T0) ))
if [ $LEFT -gt 100 ]; then
SPECSERVE_FOLD_NORMS=1 timeout $LEFT python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 \
   --configs plain dflash:15 --skip-eager --skip-hf --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{\|^\[trans" $OUT/step_latency-q3-b1.log | tail -6
fi
echo "[g5] total $(( $(date +%s) - T0 )) s"
