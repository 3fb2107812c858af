# session 35, call 1 (carry [".s28", ".s28q", ".s35"]): the split-KV merge with empty splits skipped
# (SPECSERVE_ATTN_MERGE=sparse: empty splits store only lse -inf, the merge kernel loads only used splits' partials)
# and the one-launch greedy tail (SPECSERVE_GREEDY_TAIL=triton) vs the defaults and the split cap 4, interleaved; 8B shape b1 / b8 / 1.5k context,
# SmolLM2 shape plain b1 / b8 and DFlash K=7 b1 (shipped drafter)
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
K="SPECSERVE_ATTN_MERGE=kernel"; S="SPECSERVE_ATTN_MERGE=sparse"
sweep() {  # name, timeout, args...
  local n=$1 t=$2; shift 2
  timeout $t python benchmarks/decode_env_sweep.py --env - --out $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$? ($(( $(date +%s) - T0 )) s)"; grep -A12 "^weight-read floor" $OUT/$n.log | cut -c1-150
  grep -i "error\|Traceback" $OUT/$n.log | head -3
}
T="SPECSERVE_GREEDY_TAIL=triton"; ST="$S;$T"
sweep q3-b1 170 --config-dir /root/q3 --batches 1 --tokens 256 --short-tokens 64 --reps 2 \
  --values "$K" "$S" "$T" "$ST" "SPECSERVE_ATTN_MAX_SPLITS=4" "$K" "$ST" "$S"
sweep q3-b8 100 --config-dir /root/q3 --batches 8 --tokens 128 --short-tokens 32 --reps 2 --values "$K" "$ST" "$K" "$ST"
sweep q3-b1-p1536 70 --config-dir /root/q3 --batches 1 --prompt-len 1536 --tokens 128 --short-tokens 32 --reps 2 --values "$K" "$ST"
sweep sm-plain 100 --config-dir /root/s28cfg --batches 1 8 --tokens 256 --short-tokens 64 --reps 2 --values "$K" "$S" "$ST" "$K" "$S" "$ST"
sweep sm-dflash7 100 --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 \
  --spec '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":7}' --values "$K" "$S" "$ST" "$K" "$ST"
echo "[c1] total $(( $(date +%s) - T0 )) s"
