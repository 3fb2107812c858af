# session 35, call 3 (carry [".s28", ".s28q", ".s35"]): calls 1-2: the split cap 4 is the fastest 8B b1 step while
# longer splits (MIN_TILES) and the sparse merge are not: the cost is the 256-CTA grid (two waves of SMs by design).
# The split heuristic filling one wave (SPECSERVE_ATTN_SPLIT_WAVES=1: 16 splits for the 8B shape at b1, 32 for
# SmolLM2) vs two (default) and caps 4 / 8, short and 1.5k contexts; SmolLM2 with the greedy tail on in every row
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
sweep() {  # name, timeout, args...
  local n=$1 t=$2; shift 2
  timeout $t python benchmarks/decode_env_sweep.py --env - --out $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$? ($(( $(date +%s) - T0 )) s)"; grep -A14 "^weight-read floor" $OUT/$n.log | cut -c1-150
  grep -i "error\|Traceback" $OUT/$n.log | head -3
}
W2="SPECSERVE_ATTN_SPLIT_WAVES=2"; W1="SPECSERVE_ATTN_SPLIT_WAVES=1"; C4="SPECSERVE_ATTN_MAX_SPLITS=4"; C8="SPECSERVE_ATTN_MAX_SPLITS=8"
T="SPECSERVE_GREEDY_TAIL=triton"
sweep q3-b1 130 --config-dir /root/q3 --batches 1 --tokens 256 --short-tokens 64 --reps 2 --values "$W2" "$W1" "$C4" "$C8" "$W2" "$W1"
sweep q3-b1-p1536 70 --config-dir /root/q3 --batches 1 --prompt-len 1536 --tokens 128 --short-tokens 32 --reps 2 --values "$W2" "$W1" "$C8"
sweep sm-plain 70 --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 --values "$T;$W2" "$T;$W1" "$T;$C8" "$T;$W2" "$T;$W1"
sweep sm-p1536 50 --config-dir /root/s28cfg --batches 1 --prompt-len 1536 --tokens 128 --short-tokens 32 --reps 2 --values "$T;$W2" "$T;$W1"
sweep sm-dflash7 70 --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 \
  --spec '{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":7}' --values "$T;$W2" "$T;$W1" "$T;$C8"
echo "[c3] total $(( $(date +%s) - T0 )) s"
