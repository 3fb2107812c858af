# session 34, call 7 (carry [".s28q", ".s34"]): the Qwen3-8B-shaped plain decode step at batch 1 on an H100 with the
# kernels between the GEMMs folded differently: the RMSNorms in the GEMM prologues (SPECSERVE_FUSED_NORM=2), gate_up +
# SiLU-mul as the Triton kernel at one row (SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1; with =2 its prologue holds the norm
# too: two kernels fewer a layer), the fused split merge, the epilogues off; interleaved with the default
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
timeout ${T1S:-400} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_fold.json \
  --values "SPECSERVE_PDL=1" "SPECSERVE_FUSED_NORM=2" "SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1" \
  "SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1;SPECSERVE_FUSED_NORM=2" "SPECSERVE_ATTN_MERGE=fused" \
  "SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1;SPECSERVE_FUSED_NORM=2;SPECSERVE_ATTN_MERGE=fused" "SPECSERVE_FUSED_NORM=0" \
  "SPECSERVE_PDL=1" > $OUT/sweep_fold.log 2>&1
echo "rc=$?"; grep -A12 "^weight-read floor" $OUT/sweep_fold.log; grep -i "error\|Traceback" $OUT/sweep_fold.log | head -5
echo "[c7] total $(( $(date +%s) - T0 )) s"
