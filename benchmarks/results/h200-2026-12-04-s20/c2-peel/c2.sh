#!/bin/bash
# session 20 call 2: SPECSERVE_ATTN_PEEL A/B (interleaved, one process per sweep)
export PYTHONPATH=$PWD
S='{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":15}'
python benchmarks/decode_env_sweep.py --config-dir .bench/qwen3-8b --env SPECSERVE_ATTN_PEEL --values 0 1 0 1 --batches 1 4 --tokens 256 --out $OUT/peel-8b.json 2>&1 | grep -v -i warn | tail -12
python benchmarks/decode_env_sweep.py --config-dir .bench/smollm2 --env SPECSERVE_ATTN_PEEL --values 0 1 0 1 --batches 1 8 --tokens 256 --out $OUT/peel-smol.json 2>&1 | grep -v -i warn | tail -12
python benchmarks/decode_env_sweep.py --config-dir .bench/smollm2 --env SPECSERVE_ATTN_PEEL --values 0 1 0 1 --batches 1 --tokens 256 --spec "$S" --out $OUT/peel-smol-dflash.json 2>&1 | grep -v -i warn | tail -8
python benchmarks/decode_env_sweep.py --config-dir .bench/qwen3-8b --env SPECSERVE_ATTN_PEEL --values 0 1 --batches 1 --tokens 128 --prompt-len 1536 --out $OUT/peel-8b-long.json 2>&1 | grep -v -i warn | tail -6
SPECSERVE_ATTN_PEEL=1 python .s20/kprof.py .bench/qwen3-8b 1 2>&1 | grep -v -i warn | head -14
