# session 29, call D (carry [".s28", ".s29"]): kernels compiled inside requests (SmolLM2 shape, random weights, the
# shipped drafters; EAGLE-3 and the draft model's eager first pass now warmed at start)
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout ${LT:-500} python benchmarks/lazy_compile_gpu.py --config-dir $C --dflash specserve/assets/smollm2-135m-dflash \
   --eagle3 specserve/assets/smollm2-135m-eagle3 --draft-model $C --out $OUT/lazy_compile.json > $OUT/lazy_compile.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/lazy_compile.log | grep -v "^{" | tail -30
grep "warmed\|captured" $OUT/lazy_compile.log | head -5
echo "[cD] total $(( $(date +%s) - T0 )) s"
