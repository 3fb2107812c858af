# session 48, call 3 (carry [".s28q", ".s48"]): on an H200 .s48/c2.sh (its H200 branch); on an H100 the split-KV
# merge fused into the attention (SPECSERVE_ATTN_MERGE=fused: the last split of a head group merges, no merge kernel)
# and split caps (SPECSERVE_ATTN_MAX_SPLITS 8 / 4) vs the default (16 splits at --max-model-len 2048, a merge
# kernel), the plain 8B-shaped step at batch 1 interleaved, at 128- and 1536-token prompts
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
if [[ "$N" == *H200* ]]; then bash .s48/c2.sh; exit; fi
T0=$(date +%s)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
A="SPECSERVE_PDL=1"; F="SPECSERVE_ATTN_MERGE=fused"; S8="SPECSERVE_ATTN_MAX_SPLITS=8"; S4="SPECSERVE_ATTN_MAX_SPLITS=4"
for P in 128 1536; do
  timeout 150 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 --tokens 256 \
    --short-tokens 64 --reps 2 --prompt-len $P --out $OUT/sweep-p$P.json \
    --values "$A" "$F" "$S8" "$S4" "$A" "$F" "$S8" "$A" > $OUT/sweep-p$P.log 2>&1
  echo "p$P rc=$?"; grep -A10 "^weight-read floor" $OUT/sweep-p$P.log | cut -c1-100; grep -i "error\|Traceback" $OUT/sweep-p$P.log | tail -3
done
echo "[c3] total $(( $(date +%s) - T0 )) s"
