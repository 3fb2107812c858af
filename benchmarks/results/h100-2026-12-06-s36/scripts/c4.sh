# session 36, call 4 (carry [".s28", ".s36"]): SPECSERVE_SAMPLER=auto (the default): sort-free batches on the Triton
# sampler graphs, the others on torch's; the Triton kernels' loop block 2048 vs 8192 (sampling_profile.py, the
# "triton, top_p 1" rows); the engine (seeded_gpu.py, SmolLM2 shape, random bf16 weights, DFlash K=7) with the
# default and with SPECSERVE_SAMPLER=torch, separate processes
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
for blk in 2048 8192; do
  SPECSERVE_SAMPLER_BLOCK=$blk timeout 150 python benchmarks/sampling_profile.py --shapes 1x1 8x1 1x8 8x8 --out $OUT/profile-b$blk.json > $OUT/profile-b$blk.log 2>&1
  echo "== profile block $blk rc=$? ($(( $(date +%s) - T0 )) s)"; grep "^V=" $OUT/profile-b$blk.log | grep "triton\|sample_verify + seeds"
done
D=specserve/assets/smollm2-135m-dflash
for mode in auto torch; do
  SPECSERVE_SAMPLER=$mode timeout 170 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash $D --out $OUT/seeded-$mode.json > $OUT/seeded-$mode.log 2>&1
  echo "== seeded $mode rc=$? ($(( $(date +%s) - T0 )) s)"; grep -v "^INFO\|Warn" $OUT/seeded-$mode.log | grep "seeded top\|seeded temp\|^|\|Error\|error" | tail -14
done
echo "[c4] total $(( $(date +%s) - T0 )) s"
