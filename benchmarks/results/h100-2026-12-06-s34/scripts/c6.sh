# session 34, call 6 (carry [".s28q", ".s34"]): L2 prefetch of o_proj's weight (SPECSERVE_L2_PREFETCH=SITE:FRACTION,
# the first FRACTION of each of its 8 K slices, prefetch.global.L2::evict_last from the attention / merge kernels) in
# the Qwen3-8B-shaped plain decode step at batch 1 on an H100, interleaved with the default
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
P=SPECSERVE_L2_PREFETCH
timeout ${T1S:-400} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_l2pf.json \
  --values "SPECSERVE_PDL=1" "$P=attn:0.5" "$P=attnend:0.5" "$P=merge:0.5" "$P=mergepre:0.5" "$P=mergepre:0.25" \
  "$P=attn:0.25" "$P=mergepre:1.0" "SPECSERVE_PDL=1" > $OUT/sweep_l2pf.log 2>&1
echo "rc=$?"; grep -A12 "^weight-read floor" $OUT/sweep_l2pf.log; grep -i "error\|Traceback" $OUT/sweep_l2pf.log | head -5
echo "[c6] total $(( $(date +%s) - T0 )) s"
