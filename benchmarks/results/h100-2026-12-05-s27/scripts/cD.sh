# session 27, call D: held-out acceptance of round M (K=15, K=4) beside the shipped DFlash (K=15), side by side
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; L=$OUT/eval; mkdir -p $L
SETS=(/root/ev/{math500_test,gsm8k_test,mt_bench_question,humaneval,alpaca}.jsonl)
sc() { echo "{\"method\": \"$1\", \"model\": \"$2\", \"num_speculative_tokens\": $3}"; }
ET=${CALL:-200}
timeout $ET python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "$(sc dflash /root/new2/smollm2-135m-dflash 15)" -sc "$(sc dflash /root/new2/smollm2-135m-dflash 4)" \
    --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-dflashM.json > $L/eval_acceptance-dflashM.log 2>&1 &
timeout $ET python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "$(sc dflash /root/assets/smollm2-135m-dflash 15)" \
    --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-dflashShipped.json > $L/eval_acceptance-dflashShipped.log 2>&1 &
wait
for w in dflashM dflashShipped; do echo "== $w"; grep -v "^INFO" $L/eval_acceptance-$w.log | grep -v "^{" | tail -9; done
echo "[cD] total $(( $(date +%s) - T0 )) s"
