# call 2: GGUF assembled; data: the data-s5 greedy mix again + the target's LaTeX math problems (greedy and sampled)
# + the 64-prompt gsm8k validation answers; then DFlash and EAGLE-3 round J part 1 (stops by the clock)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && ls -la /root/smollm2.gguf && md5sum /root/smollm2.gguf
G=/root/smollm2.gguf; D=/root/data; L=/root/logs
TR="python -m specserve.train.cli"
GEN=(--target $G --generate-only --max-new-tokens 384 --max-prompt-length 1024 --generator engine --gen-procs 3 --gen-batch-size 256 --no-progress)
$TR dflash "${GEN[@]}" --output /root/g/mix --prompts $D/gsm8k_train.jsonl:3500 $D/mbpp_sanitized.json $D/spec_bench_question.jsonl \
    $D/corpus/tinyshakespeare.txt:800 $D/extra_math_train.jsonl --self-prompts 1000 --gen-temperature 0 --seed 0 > $L/gen-mix.log 2>&1 &
P1=$!
$TR dflash "${GEN[@]}" --output /root/g/latexg --self-prompts 5000 --self-grid latex --gen-temperature 0 --seed 21 > $L/gen-latexg.log 2>&1 &
P2=$!
$TR dflash "${GEN[@]}" --output /root/g/latexs --self-prompts 5000 --self-grid latex --gen-temperature 0.6 --seed 22 --gen-seed 22000 > $L/gen-latexs.log 2>&1 &
P3=$!
$TR dflash --target $G --generate-only --max-new-tokens 384 --max-prompt-length 1024 --generator engine --gen-procs 2 --gen-batch-size 32 --no-progress \
    --output /root/g/val --prompts $D/val-prompts.jsonl --gen-temperature 0 --seed 0 > $L/gen-val.log 2>&1 &
P4=$!
wait $P1 $P2 $P3 $P4
for f in $L/gen-*.log; do echo "== $f"; grep -v "^INFO\|Warning\|warn" $f | tail -3; done
ls -la /root/g/*/
T1=$(date +%s); echo "[c2] data in $((T1 - T0)) s"
for f in mix latexg latexs val; do python - <<PY
import json
n=t=0; dollar=0
for l in open("/root/g/$f/data.jsonl"):
    d=json.loads(l); n+=1
print("$f", n, "samples")
PY
done
head -c 1500 /root/g/latexg/data.jsonl.meta.json; echo
# training: both drafters side by side, one LR schedule each, split over this call and the next
TT=$(( 600 - (T1 - T0) - 95 ))
echo "[c2] train stop-after-time $TT"
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl)
COMMON=(--target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 3e-4 --warmup-ratio 0.04
        --log-every 20 --seed 3 --no-progress --weight-decay 0 --val-data /root/g/val/data.jsonl --eval-every 400 --save-every 0)
$TR dflash "${COMMON[@]}" --init-from /root/assets/smollm2-135m-dflash --work-dir /root/wJ/dflash --export-format int8 \
    --num-layers 5 --intermediate-size 1024 --block-size 16 --num-anchors 256 --max-steps 1800 \
    --stop-after-time $TT --output /root/wJ/dflash-mid > $L/trainJ-dflash-part1.log 2>&1 &
PD=$!
$TR eagle3 "${COMMON[@]}" --init-from /root/assets/smollm2-135m-eagle3 --work-dir /root/wJ/eagle3 --export-format bfloat16 \
    --intermediate-size 1280 --ttt-steps 7 --max-steps 1800 \
    --stop-after-time $TT --output /root/wJ/eagle3-mid > $L/trainJ-eagle3-part1.log 2>&1 &
PE=$!
wait $PD $PE
tail -n 4 $L/trainJ-*-part1.log; grep -h "validation at step\|s/step\|stopp" $L/trainJ-*-part1.log | tail -8
echo "[c2] total $(( $(date +%s) - T0 )) s"
