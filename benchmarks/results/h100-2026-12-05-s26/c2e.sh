# call 2e: held-out acceptance of the new DFlash and the int8 EAGLE-3 (two processes side by side)
T0=$(date +%s); T2=$T0
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; L=/root/logs
SETS=(/root/ev/{math500_test,gsm8k_test,mt_bench_question,humaneval,alpaca}.jsonl)
sc() { echo "{\"method\": \"$1\", \"model\": \"$2\", \"num_speculative_tokens\": $3}"; }
N=${N:-/root/new}; ET=$(( ${CALL:-600} - 8 - (T2 - T0) ))
timeout $ET python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "$(sc dflash $N/smollm2-135m-dflash 15)" -sc "$(sc dflash $N/smollm2-135m-dflash 4)" \
    --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-dflashL.json > $L/eval_acceptance-dflashL.log 2>&1 &
timeout $ET python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "$(sc eagle3 $N/smollm2-135m-eagle3 4)" -sc "$(sc eagle3 $N/smollm2-135m-eagle3 7)" \
    --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-eagle3int8.json > $L/eval_acceptance-eagle3int8.log 2>&1 &
timeout $ET python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "$(sc dflash /root/assets/smollm2-135m-dflash 15)" \
    --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 --out $L/eval_acceptance-dflashOld.json > $L/eval_acceptance-dflashOld.log 2>&1 &
wait
for w in dflashL eagle3int8 dflashOld; do echo "== $w"; grep -v "^INFO" $L/eval_acceptance-$w.log | grep -v "^{" | tail -9; grep "^{" $L/eval_acceptance-$w.log | cut -c1-200; done
tar -C /root -czf $OUT/logs.tgz logs g/mix/data.jsonl.meta.json g/latexg/data.jsonl.meta.json g/latexs/data.jsonl.meta.json g/latex8/data.jsonl.meta.json 2>/dev/null
echo "[c2] total $(( $(date +%s) - T0 )) s"
