# session 29, call B (carry [".s28q", ".s29"]; right after cA on the warm machine: /root/q3, /root/s29/best.env):
# DFlash K=15 step b1 (Qwen3-8B-DFlash-b16 shape, random weights): default vs the sweep's best, one run
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import sys; sys.path.insert(0,'benchmarks'); from step_latency import write_drafters; from pathlib import Path; print(write_drafters(Path('/root/dr')))"
. /root/s29/best.env
V1="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=$SPECSERVE_SPLIT_GEMM_BEST"
unset SPECSERVE_TRITON_GEMM_TILES
S='{"method":"dflash","model":"/root/dr/dflash-b16","num_speculative_tokens":15}'
timeout ${T1:-300} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --spec "$S" \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_dflash.json \
  --values "SPECSERVE_PDL=1" "$V1" "SPECSERVE_PDL=1" "$V1" > $OUT/sweep_dflash.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $OUT/sweep_dflash.log | cut -c1-250
timeout ${T2:-200} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain2.json \
  --values "SPECSERVE_PDL=1" "SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1" "$V1;SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1" > $OUT/sweep_plain2.log 2>&1
echo "rc=$?"; grep -A6 "^weight-read floor" $OUT/sweep_plain2.log | cut -c1-250
echo "[cB] total $(( $(date +%s) - T0 )) s"
