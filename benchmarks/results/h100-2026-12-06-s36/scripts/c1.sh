# session 36, call 1 (carry [".s28", ".s28q", ".s36"]): seeded sampling inside the graphs on the GPU (SmolLM2 shape,
# random bf16 weights, the shipped DFlash drafter at K=7): graphs == eager == host sampler, tok/s; then the bf16
# logits change (85d39f0) A/B: the tree before it (.s36/old = git 7c83c20, specserve + the two scripts) vs this tree,
# interleaved processes, SmolLM2 plain b1/b8 and DFlash K=7 b1
T0=$(date +%s)
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
D=specserve/assets/smollm2-135m-dflash
PYTHONPATH=$PWD timeout 260 python benchmarks/seeded_gpu.py --model /root/s28cfg --dummy --dflash $D --out $OUT/seeded.json > $OUT/seeded.log 2>&1
echo "== seeded rc=$? ($(( $(date +%s) - T0 )) s)"; grep -v "^INFO\|Warn" $OUT/seeded.log | tail -28
ln -sfn $PWD/specserve/assets .s36/old/specserve/assets
OLD=$PWD/.s36/old; NEW=$PWD
ab() {  # name timeout tree args...
  local n=$1 t=$2 tree=$3; shift 3
  PYTHONPATH=$tree timeout $t python $tree/benchmarks/decode_env_sweep.py --env - --values "SPECSERVE_NOOP=1" --out $OUT/$n.json "$@" > $OUT/$n.log 2>&1
  echo "== $n rc=$? ($(( $(date +%s) - T0 )) s)"; grep -A4 "^weight-read floor" $OUT/$n.log | cut -c1-140 | tail -3
}
for i in 1 2; do
  ab sm-new$i 80 $NEW --config-dir /root/s28cfg --batches 1 8 --tokens 256 --short-tokens 64 --reps 2
  ab sm-old$i 80 $OLD --config-dir /root/s28cfg --batches 1 8 --tokens 256 --short-tokens 64 --reps 2
done
for i in 1 2; do
  ab df-new$i 70 $NEW --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 --spec "{\"method\":\"dflash\",\"model\":\"$D\",\"num_speculative_tokens\":7}"
  ab df-old$i 70 $OLD --config-dir /root/s28cfg --batches 1 --tokens 256 --short-tokens 64 --reps 2 --spec "{\"method\":\"dflash\",\"model\":\"$D\",\"num_speculative_tokens\":7}"
done
echo "[c1] total $(( $(date +%s) - T0 )) s"
