# session 28, call 6 (carry [".s28"]): Triton kernels compiled inside requests (SmolLM2 shape, random weights,
# the shipped drafters): plain, DFlash K=15 with the async step's warm-up off (before the fix) and on, EAGLE-3 K=7
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
timeout ${LT:-190} python benchmarks/lazy_compile_gpu.py --config-dir $C --dflash specserve/assets/smollm2-135m-dflash \
   --eagle3 specserve/assets/smollm2-135m-eagle3 --out $OUT/lazy_compile.json > $OUT/lazy_compile.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/lazy_compile.log | grep -v "^{" | tail -12
echo "[c6] total $(( $(date +%s) - T0 )) s"
