# session 31, call 1 (carry [".s28q", ".s28"]; never ran: no machine could be started): (1) the Qwen3-8B-shaped step on the H200 with the current
# tree (the owed re-run with the fixed step_latency.py): plain / DFlash K=15 / EAGLE-3 K=7 at batch 1, graphs and
# --enforce-eager, HF's forward, the floor; (2) kernels compiled inside requests after session 30's eager-path changes
# (SmolLM2 shape, random weights, the shipped drafters); (3) the per-kernel advance table (kprof.py) of the default
# plain 8B step and with gate_up + SiLU-mul split over K (S=4, on the Triton kernel at one row)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout ${ST:-260} python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
   --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1.log | tail -22
echo "[c1] part 1 $(( $(date +%s) - T0 )) s"
timeout ${LT:-220} python benchmarks/lazy_compile_gpu.py --config-dir $C --dflash specserve/assets/smollm2-135m-dflash \
   --eagle3 specserve/assets/smollm2-135m-eagle3 --draft-model $C --out $OUT/lazy_compile.json > $OUT/lazy_compile.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/lazy_compile.log | grep -v "^{" | tail -24
echo "[c1] part 2 $(( $(date +%s) - T0 )) s"
mkdir -p /root/kdef /root/ksplit
OUT=/root/kdef timeout ${KT:-70} python benchmarks/results/h200-2026-12-04-s20/c1-profile/kprof.py /root/q3 1 > $OUT/kprof-default.log 2>&1; echo "rc=$?"; head -16 $OUT/kprof-default.log | cut -c1-125
OUT=/root/ksplit SPECSERVE_SPLIT_GEMM=qkv=8,o=8,down=8,gate_up=4 SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1 timeout ${KT:-70} \
   python benchmarks/results/h200-2026-12-04-s20/c1-profile/kprof.py /root/q3 1 > $OUT/kprof-split-gate-up.log 2>&1; echo "rc=$?"; head -16 $OUT/kprof-split-gate-up.log | cut -c1-125
echo "[c1] total $(( $(date +%s) - T0 )) s"
