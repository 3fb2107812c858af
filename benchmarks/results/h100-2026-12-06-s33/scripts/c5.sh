# session 33, call 5 (carry [".s28", ".s32w", ".s33"], fresh machine; benchmarks/results and the drafters' weights out
# of the tree): SmolLM2's config with random weights + the shipped DFlash drafter, for DFlash K=7 (the demo's new GPU
# default) on the current tree: graphs == --enforce-eager, nothing compiled inside a request, where a step's time goes
T0=$(date +%s)
python -c "import lzma
for n in ('dflash', 'eagle3'): open(f'specserve/assets/smollm2-135m-{n}/model.safetensors', 'wb').write(lzma.open(f'.s32w/{n}.safetensors.xz').read())"
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
DF=$PWD/specserve/assets/smollm2-135m-dflash
timeout 70 python benchmarks/smollm2_gpu.py --config-dir $C --dflash $DF --skip-hf --reps 1 --tokens 64 \
    --only "dflash K=7" --out $OUT/smollm2_gpu-eq.json > $OUT/smollm2_gpu-eq.log 2>&1
echo "rc=$?"; grep "graphs == eager" $OUT/smollm2_gpu-eq.log
echo "[c5] eq $(( $(date +%s) - T0 )) s"
timeout 70 python benchmarks/lazy_compile_gpu.py --config-dir $C --dflash $DF --k 7 --out $OUT/lazy_compile.json > $OUT/lazy_compile.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/lazy_compile.log | tail -10
echo "[c5] lazy $(( $(date +%s) - T0 )) s"
S7="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":7}"
timeout ${PT:-55} python benchmarks/spec_step_profile.py --config-dir $C --spec "$S7" --batches 1 \
    --out $OUT/spec_step_profile.json > $OUT/spec_step_profile.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/spec_step_profile.log | tail -40
echo "[c5] total $(( $(date +%s) - T0 )) s"
