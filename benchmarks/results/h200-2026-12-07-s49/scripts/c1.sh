# session 49, call 1 (carry [".partA", ".whl", ".s28", ".s32w", ".s28q", ".s49"]; benchmarks/results and the drafters'
# model.safetensors moved out of the tree, .s32w holds them xz'd): exits at once on any card but an H200. GGUF half A,
# wheels, drafters, SmolLM2 config into /root for call 2; then next-h200.sh's A/Bs (the one-query attention at 8 warps
# vs 4, qkv over 4 K slices with / without pre 32 vs the H200's 8) and step_latency.py plain / DFlash K=15 / EAGLE-3 K=7.
# .s49/next-h200.sh was results/h100-2026-12-07-s48/scripts/next-h200.sh with its timer variable T0 renamed T1.
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) ;; *) echo "not an H200: skipped"; exit 0 ;; esac
T0=$(date +%s)
mkdir -p /root/site /root/assets
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
python -c "import lzma
for n in ('dflash', 'eagle3'): open(f'specserve/assets/smollm2-135m-{n}/model.safetensors', 'wb').write(lzma.open(f'.s32w/{n}.safetensors.xz').read())"
cp -r specserve/assets/smollm2-135m-dflash specserve/assets/smollm2-135m-eagle3 /root/assets/
md5sum /root/assets/*/model.safetensors
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
echo "[c1] setup $(( $(date +%s) - T0 )) s"
bash .s49/next-h200.sh
echo "[c1] total $(( $(date +%s) - T0 )) s"
