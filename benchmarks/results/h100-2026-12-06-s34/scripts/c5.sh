# session 34, call 5 (carry [".s34"]): benchmarks/l2_splitk.py: the one-row Triton split-K GEMMs (qkv / o / down of
# the Qwen3-8B shape) and cuBLAS with a cold vs an L2-resident weight, and behind an idle window with / without a
# line prefetch of the weight during it
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 240 python benchmarks/l2_splitk.py --out $OUT/l2_splitk.json > $OUT/l2_splitk.log 2>&1
echo "rc=$?"; cat $OUT/l2_splitk.log | grep -v Warning | tail -12
echo "[c5] total $(( $(date +%s) - T0 )) s"
