# session 37, GPU call 2 (carry [".s28", ".s37"]): the radix rounds with elementwise one-hot accumulation (one
# reduction a round), sampling graph alone; then the engine (SmolLM2 shape, random weights, DFlash K=7) with
# SPECSERVE_SAMPLER=torch and =triton: seeded graphs == eager == host sampler, tok/s
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python benchmarks/sampling_profile.py --shapes 1x1 8x1 1x8 8x8 1x16 32x1 --only "torch: top_p 0.95" "triton" \
  --out $OUT/sampling_profile2.json > $OUT/sampling_profile2.log 2>&1
echo "rc=$?"; grep "V=" $OUT/sampling_profile2.log | grep -v "10/10"; grep -c "10/10" $OUT/sampling_profile2.log
grep "_kernel\|at::" $OUT/sampling_profile2.log | head -24
echo "[g2] profile $(( $(date +%s) - T0 )) s"
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
for mode in torch triton; do
  SPECSERVE_SAMPLER=$mode timeout 190 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash specserve/assets/smollm2-135m-dflash --out $OUT/seeded-$mode.json > $OUT/seeded-$mode.log 2>&1
  echo "[$mode] rc=$?"; grep -v "^INFO\|Warn" $OUT/seeded-$mode.log | grep "seeded top\|seeded temp\|^|\|Error\|error" | tail -14
  echo "[g2] $mode $(( $(date +%s) - T0 )) s"
done
