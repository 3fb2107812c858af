# session 46, call 5 (carry [".s28q", ".s46"]; exits at once on anything but an H200): call 4's qkv split A/B on an
# H200, where qkv keeps 8 slices: the default vs qkv over 4 slices with the 128- and 256-wide one-row tiles, the plain
# 8B-shaped step at batch 1 interleaved beside the floor; then step_latency.py for the default and the winner (if any)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
[[ "$N" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"
Q2="SPECSERVE_SPLIT_GEMM=qkv=2,o=8,down=8"
Q2N="SPECSERVE_SPLIT_GEMM=qkv=2,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=64:32:4:4"
Q4="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=128:32:4:4"
Q4W="SPECSERVE_SPLIT_GEMM=qkv=4,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=256:32:4:4"
OLD="SPECSERVE_SPLIT_GEMM=qkv=8,o=8,down=8;SPECSERVE_TRITON_GEMM_TILES=qkv@1=512:32:3:8"
if [[ "$N" == *H100* ]]; then VALS=("$A" "$Q2" "$Q2N" "$OLD" "$A" "$Q2" "$OLD" "$A"); else VALS=("$A" "$Q4" "$Q4W" "$A" "$Q4" "$Q4W" "$A"); fi
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_qkv.json --values "${VALS[@]}" > $OUT/sweep_qkv.log 2>&1
echo "rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep_qkv.log | cut -c1-200
echo "[c4] sweep $(( $(date +%s) - T0 )) s"
BEST=$(python - <<'PY'
import json, os, collections
rows = json.load(open(os.environ["OUT"] + "/sweep_qkv.json"))["rows"]
ms = collections.defaultdict(list)
for r in rows: ms[r["value"]].append(r["step_ms"])
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
echo "[c4] total $(( $(date +%s) - T0 )) s"
