# session 40, call m3 (carry [".s28", ".s40"]; the tree + ../fused_norm3.patch, with its SPECSERVE_SUMIN_DEBUG knob):
# which part of mode 3's SumIn prologue makes its GEMMs ~30 us (call m2): SmolLM2 shape, plain batch 2, debug
# variants (1 no stream store, 2 no sums of squares, 3 no partial loads, 4 no norm weight, 5 no prologue at all;
# 1-4 compute wrong values, timing only)
T0=$(date +%s)
C=/root/s28cfg; [ -f $C/tokenizer.json ] || { mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
F=SPECSERVE_FUSED_NORM; D=SPECSERVE_SUMIN_DEBUG
timeout ${T1:-150} python benchmarks/decode_env_sweep.py --config-dir $C --env - --batches 2 \
  --short-tokens 32 --tokens 128 --out $OUT/smol-dbg.json \
  --values "$F=0" "$F=3" "$F=3;$D=1" "$F=3;$D=2" "$F=3;$D=3" "$F=3;$D=4" "$F=3;$D=5" > $OUT/smol-dbg.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{\|regex" $OUT/smol-dbg.log | tail -12
echo "[m3] total $(( $(date +%s) - T0 )) s"
