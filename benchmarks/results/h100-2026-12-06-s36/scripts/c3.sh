# session 36, call 3 (carry [".s28", ".s36"]): the sort-free Triton sampler vs the torch form: per-shape cost of the
# sampling graph (sampling_profile.py), then the engine (seeded_gpu.py: SmolLM2 shape, random bf16 weights, the
# shipped DFlash drafter at K=7) with SPECSERVE_SAMPLER=torch and =triton (the default) in separate processes
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 200 python benchmarks/sampling_profile.py --shapes 1x1 8x1 1x8 8x8 --out $OUT/sampling_profile.json > $OUT/sampling_profile.log 2>&1
echo "== profile rc=$? ($(( $(date +%s) - T0 )) s)"; grep "^V=" $OUT/sampling_profile.log | grep -v "softmax\|sort:\|constraints"
D=specserve/assets/smollm2-135m-dflash
for mode in torch triton; do
  SPECSERVE_SAMPLER=$mode timeout 150 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash $D --out $OUT/seeded-$mode.json > $OUT/seeded-$mode.log 2>&1
  echo "== seeded $mode rc=$? ($(( $(date +%s) - T0 )) s)"; grep -v "^INFO\|Warn" $OUT/seeded-$mode.log | grep "seeded graphs\|^|\|Error\|error" | tail -12
done
echo "[c3] total $(( $(date +%s) - T0 )) s"
