# session 29, call E (carry [".s28q", ".s29"]): the Qwen3-8B-shaped step latency on the current tree (H100 tiles by
# device name: qkv@1 512:32:3:8, gate_up@16 128:64:3:4), plain / DFlash K=15 / EAGLE-3 K=7 at batch 1, graphs and
# --enforce-eager, HF's forward, the floor; then plain + DFlash K=15 with the previous tiles forced (A/B, same machine)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
timeout ${ST:-330} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
   --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1.log | tail -22
echo "[cE] part 1 $(( $(date +%s) - T0 )) s"
SPECSERVE_TRITON_GEMM_TILES=qkv@1=256:32:4:4,gate_up@16=64:64:4:4 timeout ${ST2:-200} python benchmarks/step_latency.py \
   --config-dir /root/q3 --batches 1 --configs plain dflash:15 --skip-eager --skip-hf \
   --out $OUT/step_latency-q3-b1-oldtiles.json > $OUT/step_latency-q3-b1-oldtiles.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1-oldtiles.log | tail -8
echo "[cE] total $(( $(date +%s) - T0 )) s"
