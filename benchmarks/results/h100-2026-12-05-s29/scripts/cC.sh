# session 29, call C (carry [".s28q", ".s29"]): gate_up + SiLU-mul split over K slices (new): per-GEMM sweep, then
# the engine's plain decode and DFlash K=15 steps b1 (Qwen3-8B shape, random bf16): default vs H100 tiles + gate_up split
T0=$(date +%s)
mkdir -p /root/q3 /root/s29 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
python -c "import sys; sys.path.insert(0,'benchmarks'); from step_latency import write_drafters; from pathlib import Path; print(write_drafters(Path('/root/dr')))"
timeout ${T1:-200} python benchmarks/triton_gemm.py --lean --best-env /root/s29/best2.env --out $OUT/triton_gemm2.json \
  --splits "qkv=8,o=8,down=8,gate_up=1/2/4/8" --tiles1 512:32:3:8 \
  --gate-up-tiles1 256:32:4:8 128:32:6:4 128:64:4:4 64:64:4:4 --tiles16 128:64:4:4 > $OUT/triton_gemm2.log 2>&1
echo "rc=$?"; grep "gate_up" $OUT/triton_gemm2.log | grep -v chain | sort -k6 -n | head -8; grep -A12 "^best per" $OUT/triton_gemm2.log
cat /root/s29/best2.env; cp /root/s29/best2.env $OUT/
echo "[cC] sweep $(( $(date +%s) - T0 )) s"
. /root/s29/best2.env
GU=$(echo $SPECSERVE_SPLIT_GEMM_BEST | tr ',' '\n' | grep gate_up || echo gate_up=2)
V1="SPECSERVE_TRITON_GEMM_TILES=qkv@1=512:32:3:8,gate_up@16=128:64:3:4"
V2="SPECSERVE_TRITON_GEMM_TILES=$SPECSERVE_TRITON_GEMM_TILES;SPECSERVE_SPLIT_GEMM=qkv=8,o=8,down=8,$GU;SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1"
echo "V2=$V2"
unset SPECSERVE_TRITON_GEMM_TILES
timeout ${T2:-170} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_plain3.json \
  --values "SPECSERVE_PDL=1" "$V1" "$V2" "SPECSERVE_PDL=1" "$V1" "$V2" > $OUT/sweep_plain3.log 2>&1
echo "rc=$?"; grep -A8 "^weight-read floor" $OUT/sweep_plain3.log | cut -c1-60,200-260
S='{"method":"dflash","model":"/root/dr/dflash-b16","num_speculative_tokens":15}'
timeout ${T3:-200} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --spec "$S" \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_dflash3.json \
  --values "SPECSERVE_PDL=1" "$V1" "$V2" "$V2" > $OUT/sweep_dflash3.log 2>&1
echo "rc=$?"; grep -A6 "^weight-read floor" $OUT/sweep_dflash3.log | cut -c1-60,200-260
echo "[cC] total $(( $(date +%s) - T0 )) s"
