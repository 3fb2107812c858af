# (the tree + staged_gemm.patch applied; .s41/kprof.py = session 20's c1-profile/kprof.py with prompt ids in 1000-40000)
# session 41, call g2 (carry [".s28q", ".s41"]): g1 found the staged kernels slower than splitk_add even alone
# (~25-30 GB/s a program): the consumer side, swept here alone (more warps, 64-column tiles with and without the
# 128-byte swizzle), then the 8B-shaped plain step A/B with the wider-warp forms
T0=$(date +%s)
[ -d /root/q3 ] || { mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz); }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 90 python benchmarks/staged_gemv.py --tiles o=128:64:4:12:4 o=128:64:4:12:8 o=128:64:4:12:16 o=128:32:4:24:8 \
  o=64:64:2:24:4 o=64:64:2:24:8 o=64:64:2:24:16 qkv=64:64:1:24:8 down=64:64:2:24:8 --out $OUT/micro-sw0.json > $OUT/micro-sw0.log 2>&1
echo "rc=$?"; grep -A20 "^tile" $OUT/micro-sw0.log
SPECSERVE_STAGED_SWIZZLE=128 timeout 90 python benchmarks/staged_gemv.py --tiles o=64:64:2:24:4 o=64:64:2:24:8 o=64:64:2:24:16 \
  qkv=64:64:1:24:8 down=64:64:2:24:8 --out $OUT/micro-sw128.json > $OUT/micro-sw128.log 2>&1
echo "rc=$?"; grep -A20 "^tile" $OUT/micro-sw128.log
echo "[g2] $(( $(date +%s) - T0 )) s"
E=SPECSERVE_PDL_EARLY; S=SPECSERVE_STAGED
V=("$S=0" "$S=o=128:64:4:12:8;$E=attn,merge" "$S=o=128:64:4:12:16;$E=attn,merge"
   "$S=o=64:64:2:24:8;SPECSERVE_STAGED_SWIZZLE=128;$E=attn,merge"
   "$S=qkv=64:64:1:24:8,o=64:64:2:24:8,down=64:64:2:24:8;SPECSERVE_STAGED_SWIZZLE=128;$E=attn,merge,norm,silu" "$S=0")
timeout $(( 300 - $(date +%s) + T0 )) python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --values "${V[@]}" \
   --batches 1 --short-tokens 32 --tokens 160 --out $OUT/sweep2.json > $OUT/sweep2.log 2>&1
echo "rc=$?"; grep -v "^INFO\|regex pattern" $OUT/sweep2.log | grep -v "^{" | tail -10; grep -i "error\|Traceback" $OUT/sweep2.log | tail -5
for v in "SPECSERVE_STAGED=0" "SPECSERVE_STAGED=o=128:64:4:12:4 SPECSERVE_PDL_EARLY=attn,merge"; do
  env $v timeout 100 python .s41/kprof.py /root/q3 1 > $OUT/kprof-$(echo $v | tr ' =:,' '____').log 2>&1
  echo "kprof $v rc=$?"; grep -v "^INFO\|regex pattern\|Warning\|_warn" $OUT/kprof-$(echo $v | tr ' =:,' '____').log | head -14
done
echo "[g2] total $(( $(date +%s) - T0 )) s"
