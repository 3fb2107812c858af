# session 37, GPU call 1 (no carry): the sort-free sampler with its top-k / top-p radix rounds against torch's form,
# sampling graph alone (benchmarks/sampling_profile.py), then the per-program block swept
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout 330 python benchmarks/sampling_profile.py --shapes 1x1 8x1 1x8 8x8 1x16 32x1 --out $OUT/sampling_profile.json > $OUT/sampling_profile.log 2>&1
echo "rc=$?"; grep -v "^  " $OUT/sampling_profile.log | tail -140
grep "^  " $OUT/sampling_profile.log | head -40
echo "[g1] profile $(( $(date +%s) - T0 )) s"
for blk in 1024 4096 8192; do
  SPECSERVE_SAMPLER_BLOCK=$blk timeout 60 python benchmarks/sampling_profile.py --only "triton" --no-check --shapes 1x1 8x8 32x1 2>&1 | grep "V=" | sed "s/^/[block $blk] /"
done
echo "[g1] total $(( $(date +%s) - T0 )) s"
