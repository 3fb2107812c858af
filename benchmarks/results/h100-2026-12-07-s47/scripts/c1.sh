# session 47, call 1 (carry [".s28q", ".s47"]): the side-stream L2 prefetch of o_proj's weight (SPECSERVE_L2_PREFETCH)
# in the Qwen3-8B-shaped plain decode step at batch 1, interleaved with the default; on an H200 also session 46's qkv
# split A/B; then step_latency.py for the default and the best value if it beats the default by 0.3%
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"
P="SPECSERVE_L2_PREFETCH"
Q4W="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=256:32:4:4"
Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=128:32:4:4"
VALS=("$A" "$P=o=0.01" "$P=o=0.5" "$P=o=1" "$A" "$P=o=0.25" "$P=o=0.75" "$P=o=0.5,evict_last" "$A" "$P=o=0.5" "$P=o=0.5,ctas=64" "$A")
if [[ "$N" == *H200* ]]; then VALS+=("$Q4" "$Q4W" "$A" "$Q4"); fi
timeout ${SW:-240} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_l2.json --values "${VALS[@]}" > $OUT/sweep_l2.log 2>&1
echo "rc=$?"; grep -A20 "^weight-read floor" $OUT/sweep_l2.log | cut -c1-200; tail -3 $OUT/sweep_l2.log | cut -c1-300
echo "[c1] sweep $(( $(date +%s) - T0 )) s"
BEST=$(python - <<'PY'
import json, os, collections
rows = json.load(open(os.environ["OUT"] + "/sweep_l2.json"))["rows"]
ms = collections.defaultdict(list)
for r in rows:
    if "step_ms" in r: ms[r["value"]].append(r["step_ms"])
avg = {k: sum(v) / len(v) for k, v in ms.items()}
base = avg.pop("SPECSERVE_PDL=1")
k = min(avg, key=avg.get)
print(k if avg[k] < base * 0.997 else "")
PY
)
echo "best non-default: ${BEST:-none}"
if [ -n "$BEST" ]; then
  for v in default best; do
    if [ $v = best ]; then IFS=';' read -ra KV <<< "$BEST"; for kv in "${KV[@]}"; do export "$kv"; done; fi
    T1=$(date +%s)
    timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 eagle3:7 \
      --skip-hf --skip-eager --out $OUT/step_latency-$v.json > $OUT/step_latency-$v.log 2>&1
    echo "$v rc=$? $(( $(date +%s) - T1 )) s"; grep -v "^INFO\|^{\|tokenizer you are" $OUT/step_latency-$v.log | grep -A5 "^method"
  done
fi
echo "[c1] total $(( $(date +%s) - T0 )) s"
