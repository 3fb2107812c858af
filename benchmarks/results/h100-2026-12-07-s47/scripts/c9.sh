# session 47, call 9 (carry [".s47"]): the greedy tail's vocabulary split on the SmolLM2-135M shape (random bf16
# weights, 49152 entries: 12 programs a row vs 1): plain decode at batch 1 and 8, and the DFlash K=15 step with the
# bundled drafter, each interleaved with SPECSERVE_GREEDY_TAIL_PROGRAMS=1
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
C=/root/smol; mkdir -p $C && cp .s47/smol/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
A="SPECSERVE_PDL=1"; P1="SPECSERVE_GREEDY_TAIL_PROGRAMS=1"
timeout 100 python benchmarks/decode_env_sweep.py --config-dir $C --env - --batches 1 8 --tokens 256 \
  --short-tokens 64 --reps 2 --out $OUT/smol_plain.json --values "$A" "$P1" "$A" "$P1" "$A" > $OUT/smol_plain.log 2>&1
echo "rc=$?"; grep -A12 "^weight-read floor" $OUT/smol_plain.log | cut -c1-130
DS='{"method": "dflash", "model": "specserve/assets/smollm2-135m-dflash", "num_speculative_tokens": 15}'
timeout 100 python benchmarks/decode_env_sweep.py --config-dir $C --env - --batches 1 --tokens 256 --spec "$DS" \
  --short-tokens 64 --reps 2 --out $OUT/smol_dflash.json --values "$A" "$P1" "$A" "$P1" "$A" > $OUT/smol_dflash.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $OUT/smol_dflash.log | cut -c1-130
echo "[c9] total $(( $(date +%s) - T0 )) s"
