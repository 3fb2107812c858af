# session 37, GPU call 4 (carry [".s28", ".s37"]): the round index as a runtime argument (one compiled round kernel
# instead of 16): the engine with SPECSERVE_SAMPLER=auto (SmolLM2 shape, random weights, DFlash K=7), then the b1
# sampling graph rows again
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name --format=csv,noheader
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
SPECSERVE_SAMPLER=auto timeout 170 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash specserve/assets/smollm2-135m-dflash --out $OUT/seeded-auto.json > $OUT/seeded-auto.log 2>&1
echo "[auto] rc=$?"; grep -v "Warn" $OUT/seeded-auto.log | grep "seeded top\|seeded temp\|^|\|Error\|error" | tail -14
grep -i "captured\|capture" $OUT/seeded-auto.log | head -8
echo "[g4] auto $(( $(date +%s) - T0 )) s"
timeout 45 python benchmarks/sampling_profile.py --vocab 49152 --shapes 1x1 1x8 --only "triton: top_p 0.95" "triton sort-free" --no-check 2>&1 | grep "V="
echo "[g4] total $(( $(date +%s) - T0 )) s"
