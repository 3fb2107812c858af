export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout 100 python benchmarks/decode_env_sweep.py --env - --out $OUT/q3-b1-warps.json --config-dir /root/q3 --batches 1 --tokens 256 --short-tokens 64 --reps 2 --values "SPECSERVE_ATTN_MERGE_WARPS=0" "SPECSERVE_ATTN_MERGE_WARPS=2" "SPECSERVE_ATTN_MAX_SPLITS=8" "SPECSERVE_ATTN_MERGE_WARPS=1" > $OUT/q3-b1-warps.log 2>&1
echo rc=$?; grep -A8 "^weight-read floor" $OUT/q3-b1-warps.log | cut -c1-120
