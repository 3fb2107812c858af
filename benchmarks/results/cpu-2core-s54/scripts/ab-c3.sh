# #5 A/B, call 3 (carry [".s55c"]; right after call 2): held-out greedy acceptance of both arms and the shipped
# drafter, K=15, bf16, batch 8, 24 prompts x 256 tokens of math500 / gsm8k_test / mt_bench (three processes)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
G=/root/smollm2.gguf; SETS=(/root/ev/{math500_test,gsm8k_test,mt_bench_question}.jsonl)
sc() { echo "{\"method\": \"dflash\", \"model\": \"$1\", \"num_speculative_tokens\": 15}"; }
for W in decay:/root/ab/decay prefix:/root/ab/prefix shipped:/root/assets/smollm2-135m-dflash; do
  timeout ${ET:-240} python -m specserve eval-acceptance --model $G --dtype bfloat16 -sc "$(sc ${W#*:})" \
      --dataset "${SETS[@]}" --num-prompts 24 --max-tokens 256 --batch-size 8 \
      --out $OUT/eval-${W%%:*}.json > $OUT/eval-${W%%:*}.log 2>&1 &
done
wait
for W in decay prefix shipped; do echo "== $W"; grep -v "^INFO" $OUT/eval-$W.log | grep -v "^{" | tail -6; done
echo "[ab-c3] total $(( $(date +%s) - T0 )) s"
