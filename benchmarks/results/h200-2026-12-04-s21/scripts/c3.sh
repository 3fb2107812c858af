# call 3: round J part 2 (--resume, fitted to the time left), export, held-out acceptance old vs new in one call
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; L=/root/logs; TR="python -m specserve.train.cli"
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl)
COMMON=(--target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 3e-4 --warmup-ratio 0.04
        --log-every 20 --seed 3 --no-progress --weight-decay 0 --val-data /root/g/val/data.jsonl --eval-every 400 --save-every 0)
MT=${MT:-290}
$TR dflash "${COMMON[@]}" --init-from /root/assets/smollm2-135m-dflash --work-dir /root/wJ/dflash --export-format int8 \
    --num-layers 5 --intermediate-size 1024 --block-size 16 --num-anchors 256 --max-steps 1800 \
    --resume --max-time $MT --output /root/new/smollm2-135m-dflash > $L/trainJ-dflash-part2.log 2>&1 &
PD=$!
$TR eagle3 "${COMMON[@]}" --init-from /root/assets/smollm2-135m-eagle3 --work-dir /root/wJ/eagle3 --export-format bfloat16 \
    --intermediate-size 1280 --ttt-steps 7 --max-steps 1800 \
    --resume --max-time $MT --output /root/new/smollm2-135m-eagle3 > $L/trainJ-eagle3-part2.log 2>&1 &
PE=$!
wait $PD $PE
tail -n 3 $L/trainJ-*-part2.log; grep -h "validation at step\|resumed\|time budget" $L/trainJ-*-part2.log | tail -10
ls -la /root/new/*/
T1=$(date +%s); echo "[c3] trained at $((T1 - T0)) s"
EV=.s21b
for which in old new; do
  A=/root/assets; [ $which = new ] && A=/root/new
  timeout ${ET:-200} python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "{\"method\": \"dflash\", \"model\": \"$A/smollm2-135m-dflash\", \"num_speculative_tokens\": 15}" \
    -sc "{\"method\": \"dflash\", \"model\": \"$A/smollm2-135m-dflash\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$A/smollm2-135m-eagle3\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$A/smollm2-135m-eagle3\", \"num_speculative_tokens\": 7}" \
    --dataset $EV/{mt_bench_question,gsm8k_test,math500_test,humaneval,alpaca}.jsonl \
    --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-$which.json > $L/eval_acceptance-$which.log 2>&1 &
done
wait
for which in old new; do echo "== $which"; grep -v '^{' $L/eval_acceptance-$which.log | grep -v "^INFO" | tail -30; done
mkdir -p $OUT && cp -r /root/new/smollm2-135m-dflash /root/new/smollm2-135m-eagle3 $OUT/ 2>/dev/null
tar -C /root -czf $OUT/logs.tgz logs g/mix/data.jsonl.meta.json g/latexg/data.jsonl.meta.json g/latexs/data.jsonl.meta.json g/val/data.jsonl.meta.json wJ/dflash-mid/training.json wJ/eagle3-mid/training.json 2>/dev/null
ls -la $OUT
echo "[c3] total $(( $(date +%s) - T0 )) s"
