export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
timeout 40 python benchmarks/decode_env_sweep.py --env - --out $OUT/q3-p1536-warps.json --config-dir /root/q3 --batches 1 --prompt-len 1536 --tokens 128 --short-tokens 32 --reps 2 --values "SPECSERVE_ATTN_MERGE_WARPS=0" "SPECSERVE_ATTN_MERGE_WARPS=1" > $OUT/q3-p1536-warps.log 2>&1
echo rc=$?; grep -A4 "^weight-read floor" $OUT/q3-p1536-warps.log | cut -c1-120
timeout 30 python benchmarks/decode_env_sweep.py --env - --out $OUT/sm-warps.json --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 --values "SPECSERVE_ATTN_MERGE_WARPS=0" "SPECSERVE_ATTN_MERGE_WARPS=1" > $OUT/sm-warps.log 2>&1
echo rc=$?; grep -A4 "^weight-read floor" $OUT/sm-warps.log | cut -c1-120
