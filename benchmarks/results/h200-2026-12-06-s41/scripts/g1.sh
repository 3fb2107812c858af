# (the tree + staged_gemm.patch applied: git apply benchmarks/results/h200-2026-12-06-s41/staged_gemm.patch)
# session 41, call g1 (carry [".s28q", ".s41"]): the shared-memory staged one-row o_proj / down_proj (Gluon, TMA
# before the PDL wait; SPECSERVE_STAGED) checked and timed alone, then the Qwen3-8B-shaped plain step at batch 1,
# A/B in one process (fresh engine per value)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
timeout 100 python benchmarks/staged_gemv.py --tiles qkv=128:64:2:12:4 o=128:64:4:12:4 o=128:64:4:6:4 gate_up=128:64:1:6:8 down=128:64:4:12:4 --out $OUT/staged_gemv.json > $OUT/staged_gemv.log 2>&1
RC=$?; echo "check rc=$RC"; tail -12 $OUT/staged_gemv.log
echo "[g1] $(( $(date +%s) - T0 )) s"
E=SPECSERVE_PDL_EARLY
if [ $RC = 0 ] || [ $RC = 1 ]; then  # 1: a tolerance failed (the sweep shows its tokens); else a crash
O=o=128:64:4:12:4; D=down=128:64:4:12:4; Q=qkv=128:64:2:12:4; G=gate_up=128:64:1:6:8
V=("SPECSERVE_STAGED=0" "SPECSERVE_STAGED=$O;$E=attn,merge" "SPECSERVE_STAGED=$Q,$O,$G,$D;$E=attn,merge,norm"
   "SPECSERVE_STAGED=$O,$D;$E=attn,merge,silu" "$E=attn,merge" "SPECSERVE_STAGED=0")
else
V=("SPECSERVE_STAGED=0" "$E=attn,merge" "SPECSERVE_STAGED=0")
fi
timeout $(( 500 - $(date +%s) + T0 )) python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --values "${V[@]}" \
   --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep.json > $OUT/sweep.log 2>&1
echo "rc=$?"; grep -v "^INFO" $OUT/sweep.log | grep -v "^{" | tail -20; grep -i "error\|Traceback" $OUT/sweep.log | tail -5
echo "[g1] total $(( $(date +%s) - T0 )) s"
