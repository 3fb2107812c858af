# session 32, call 5 (carry [".s32"]; warm, /root/q3 from call 1): the per-kernel step-advance table (kprof.py) of the
# default plain Qwen3-8B-shaped step at batch 1 vs gate_up + SiLU-mul split over K (S=4, the Triton kernel at one row)
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/kdef /root/ksplit
OUT=/root/kdef timeout ${KT:-60} python .s32/kprof.py /root/q3 1 > $OUT/kprof-default.log 2>&1; echo "rc=$?"; head -14 $OUT/kprof-default.log | cut -c1-125
OUT=/root/ksplit SPECSERVE_SPLIT_GEMM=qkv=8,o=8,down=8,gate_up=4 SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1 timeout ${KT:-60} \
   python .s32/kprof.py /root/q3 1 > $OUT/kprof-split-gate-up.log 2>&1; echo "rc=$?"; head -14 $OUT/kprof-split-gate-up.log | cut -c1-125
tar -C /root -czf $OUT/kprof.tgz kdef ksplit
echo "[c5] total $(( $(date +%s) - T0 )) s"
