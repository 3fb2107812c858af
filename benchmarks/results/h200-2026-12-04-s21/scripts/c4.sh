T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; L=/root/logs; TR="python -m specserve.train.cli"
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl)
$TR dflash --target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 2e-4 --warmup-ratio 0.04 \
  --log-every 20 --seed 4 --no-progress --weight-decay 0 --val-data /root/g/val/data.jsonl --eval-every 200 --save-every 0 \
  --init-from /root/new/smollm2-135m-dflash --work-dir /root/wK/dflash --export-format int8 --num-layers 5 --intermediate-size 1024 \
  --block-size 16 --num-anchors 256 --max-steps 1500 --max-time ${MT:-300} --output /root/k/smollm2-135m-dflash > $L/trainK-dflash.log 2>&1
grep -h "validation at step\|time budget\|exported" $L/trainK-dflash.log | tail -8
timeout ${ET:-150} python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "{\"method\": \"dflash\", \"model\": \"/root/k/smollm2-135m-dflash\", \"num_speculative_tokens\": 15}" \
    -sc "{\"method\": \"dflash\", \"model\": \"/root/k/smollm2-135m-dflash\", \"num_speculative_tokens\": 4}" \
    --dataset .s21b/{mt_bench_question,gsm8k_test,math500_test,humaneval,alpaca}.jsonl \
    --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-K.json > $L/eval_acceptance-K.log 2>&1
grep -v '^{' $L/eval_acceptance-K.log | grep -v "^INFO" | tail -12
mkdir -p $OUT && cp -r /root/k/smollm2-135m-dflash $OUT/ && tar -C /root -czf $OUT/logsK.tgz logs/trainK-dflash.log logs/eval_acceptance-K.json logs/eval_acceptance-K.log
echo "[c4] total $(( $(date +%s) - T0 )) s"
