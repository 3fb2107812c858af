# session 47, call 5 (carry [".s28q", ".s47"]): GemmTile.pre (weight rows read before the PDL wait) per projection:
# for qkv and down only (their predecessor is a 1.5 us norm / SiLU-mul kernel, not the attention, which session 47's
# chain profile found slowed by concurrent DRAM traffic); the plain 8B-shaped step at batch 1, interleaved with the
# default; step_latency.py for the default and the best value if it beats the default by 0.3%
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"
T="SPECSERVE_TRITON_GEMM_TILES"
Q="$T=qkv@1=128:32:4:4:64"
Q2="$T=qkv@1=128:32:4:4:128"
D="$T=down@1=128:32:4:4:64"
D2="$T=down@1=128:32:4:4:256"
QD="$T=qkv@1=128:32:4:4:64,down@1=128:32:4:4:64"
QE="$Q;SPECSERVE_PDL_EARLY=norm"
VALS=("$A" "$Q" "$D" "$QD" "$A" "$Q2" "$D2" "$QE" "$A" "$Q" "$D" "$A")
timeout ${SW:-240} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 \
  --tokens 256 --short-tokens 64 --reps 2 --out $OUT/sweep_pre.json --values "${VALS[@]}" > $OUT/sweep_pre.log 2>&1
echo "rc=$?"; grep -A20 "^weight-read floor" $OUT/sweep_pre.log | cut -c1-200
echo "[c5] sweep $(( $(date +%s) - T0 )) s"
BEST=$(python - <<'PY'
import json, os, collections
rows = json.load(open(os.environ["OUT"] + "/sweep_pre.json"))["rows"]
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
  timeout 120 python benchmarks/chain_profile.py --config-dir /root/q3 --top 12 --out $OUT/chain.json \
    --values "" "$BEST" > $OUT/chain.log 2>&1
  echo "chain rc=$?"; grep -v "^INFO\|tokenizer you are\|Warning\|warn" $OUT/chain.log | cut -c1-130 | tail -32
fi
echo "[c5] total $(( $(date +%s) - T0 )) s"
