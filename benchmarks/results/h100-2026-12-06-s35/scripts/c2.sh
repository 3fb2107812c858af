# session 35, call 2 (carry [".s28", ".s28q", ".s35"]): call 1 found the split cap 4 the fastest 8B b1 step (1.149x the
# floor) while the sparse merge alone gained 0.2%: fewer, longer used splits (SPECSERVE_ATTN_MIN_TILES=N: each used
# split gets >= N KV tiles, the grid keeps its splits for long contexts) with and without the sparse merge, vs the
# default and the cap; the greedy tail (SPECSERVE_GREEDY_TAIL=triton) alone at 8B b8; SmolLM2 plain / DFlash K=7
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
sweep() {  # name, timeout, args...
  local n=$1 t=$2; shift 2
  timeout $t python benchmarks/decode_env_sweep.py --env - --out $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$? ($(( $(date +%s) - T0 )) s)"; grep -A14 "^weight-read floor" $OUT/$n.log | cut -c1-150
  grep -i "error\|Traceback" $OUT/$n.log | head -3
}
K="SPECSERVE_ATTN_MERGE=kernel"; C4="SPECSERVE_ATTN_MAX_SPLITS=4"; T="SPECSERVE_GREEDY_TAIL=triton"
M2="SPECSERVE_ATTN_MERGE=sparse;SPECSERVE_ATTN_MIN_TILES=2"; M3="SPECSERVE_ATTN_MERGE=sparse;SPECSERVE_ATTN_MIN_TILES=3"
M4="SPECSERVE_ATTN_MERGE=sparse;SPECSERVE_ATTN_MIN_TILES=4"; M2K="SPECSERVE_ATTN_MERGE=kernel;SPECSERVE_ATTN_MIN_TILES=2"
sweep q3-b1 160 --config-dir /root/q3 --batches 1 --tokens 256 --short-tokens 64 --reps 2 \
  --values "$K" "$C4" "$M2" "$M3" "$M4" "$M2K" "$K" "$M3"
sweep q3-b8 90 --config-dir /root/q3 --batches 8 --tokens 128 --short-tokens 32 --reps 2 --values "$K" "$T" "$M2" "$M4"
sweep q3-b1-p1536 70 --config-dir /root/q3 --batches 1 --prompt-len 1536 --tokens 128 --short-tokens 32 --reps 2 --values "$K" "$M2" "$M4"
sweep sm-plain 80 --config-dir /root/s28cfg --batches 1 8 --tokens 256 --short-tokens 64 --reps 2 --values "$K" "$T" "$T;$M2" "$T;$M4"
sweep sm-dflash7 90 --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 \
  --spec '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":7}' --values "$K" "$T" "$T;$M2" "$T;$M4"
echo "[c2] total $(( $(date +%s) - T0 )) s"
