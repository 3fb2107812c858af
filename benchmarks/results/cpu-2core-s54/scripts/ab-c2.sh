# #5 A/B, call 2 (carry [".s55b"]; right after call 1): the GGUF assembled, ~2.5k prompts answered by the target
# (gsm8k_train and LaTeX math problems it writes itself, greedy), then the shipped DFlash drafter trained on them
# twice side by side, identical but for --position-weight (decay, the default, vs prefix), each for the same wall
# clock. Drafters in /root/ab/{decay,prefix}; logs + training.json come back in $OUT.
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .s55b/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
mkdir -p /root/ab/data /root/ev && cp .s55b/data/*.jsonl /root/ev/
xz -dc .s55b/data/gsm8k_train.jsonl.xz > /root/ab/gsm8k_train.jsonl
G=/root/smollm2.gguf; TRAIN="python -m specserve.train.cli"
$TRAIN dflash --target $G --output /root/ab/data --work-dir /root/ab/data --generate-only \
    --prompts /root/ab/gsm8k_train.jsonl:${GSM:-1500} --self-prompts ${SELF:-1000} --self-grid latex \
    --max-new-tokens 384 --max-prompt-length 1024 --gen-temperature 0 --generator engine --gen-procs 4 \
    --gen-batch-size 512 --seed 11 > $OUT/gen.log 2>&1
echo "gen rc=$? $(( $(date +%s) - T0 )) s"; tail -n 2 $OUT/gen.log
MT=$(( ${CALL:-590} - 40 - ($(date +%s) - T0) ))
for ARM in decay prefix; do
  $TRAIN dflash --target $G --data /root/ab/data/data.jsonl --batch-size 32 --max-length 1536 --epochs 100 \
      --lr 2e-4 --warmup-ratio 0.02 --log-every 20 --seed 7 --no-progress --weight-decay 0 --save-every 0 \
      --init-from /root/assets/smollm2-135m-dflash --work-dir /root/ab/w-$ARM --export-format int8 \
      --num-layers 5 --intermediate-size 1024 --block-size 16 --num-anchors 256 --max-steps 2000 \
      --position-weight $ARM --max-time $MT --output /root/ab/$ARM > $OUT/train-$ARM.log 2>&1 &
done
wait
for ARM in decay prefix; do
  echo "== $ARM"; grep -h "time budget\|exported" $OUT/train-$ARM.log | tail -2
  cp /root/ab/$ARM/training.json $OUT/training-$ARM.json 2>/dev/null
done
echo "[ab-c2] total $(( $(date +%s) - T0 )) s"
