# session 36, call 5 (carry [".s28", ".s36"]): the engine with the 8192-entry Triton sampler block (the new default)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 170 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash specserve/assets/smollm2-135m-dflash --out $OUT/seeded-auto-b8192.json > $OUT/seeded-auto-b8192.log 2>&1
echo "rc=$?"; grep -v "^INFO\|Warn" $OUT/seeded-auto-b8192.log | grep "seeded top\|seeded temp\|^|\|Error\|error" | tail -14
