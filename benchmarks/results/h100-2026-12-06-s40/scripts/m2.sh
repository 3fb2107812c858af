# session 40, call m2 (carry [".s28", ".s40"]): where SPECSERVE_FUSED_NORM=3's +1.07 ms a step goes (call m1):
# per-kernel tables (session 20's kprof.py, its random prompt ids cut to randint(1000, 40000) for SmolLM2's vocabulary) of SmolLM2's shape (random weights),
# plain decoding at batch 2, mode 0 vs mode 3
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
for m in 0 3; do
  mkdir -p $OUT/m$m
  OUT=$OUT/m$m SPECSERVE_FUSED_NORM=$m timeout ${KT:-90} python .s40/kprof.py $C 2 > $OUT/m$m/kprof.log 2>&1; echo "rc=$?"
  grep -v "^INFO\|regex" $OUT/m$m/kprof.log | head -16 | cut -c1-140
done
echo "[m2] total $(( $(date +%s) - T0 )) s"
