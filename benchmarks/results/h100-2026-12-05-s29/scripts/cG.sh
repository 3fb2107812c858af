# session 29, call G (carry [".s28", ".s29"]): float32 lossless on the GPU after this session's changes (eager block
# tables at the graphs' width, split buffers padded, warmed catch-up passes): SmolLM2 shape, random target weights,
# the shipped drafters, batch 8 x 128 greedy tokens, graphs on
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout ${LT:-150} python benchmarks/lossless_gpu.py --model $C --dummy --dflash specserve/assets/smollm2-135m-dflash \
   --eagle3 specserve/assets/smollm2-135m-eagle3 --dtypes float32 --out $OUT/lossless.json > $OUT/lossless.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/lossless.log | tail -12
echo "[cG] total $(( $(date +%s) - T0 )) s"
