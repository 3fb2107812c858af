# session 47, call 2 (carry [".s28q", ".s47"]): where the L2 prefetch's time goes: benchmarks/chain_profile.py (each
# kernel's advance of the serial chain, by its place in the layer) for the default and o=0.5 / o=1
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
timeout ${PT:-300} python benchmarks/chain_profile.py --config-dir /root/q3 --top 16 --out $OUT/chain.json \
  --values "" "SPECSERVE_L2_PREFETCH=o=0.5" "SPECSERVE_L2_PREFETCH=o=1" > $OUT/chain.log 2>&1
echo "rc=$?"; grep -v "^INFO\|tokenizer you are\|Warning\|warn" $OUT/chain.log | cut -c1-130 | tail -70
echo "[c2] total $(( $(date +%s) - T0 )) s"
