set -u
test -s /root/smollm2.gguf || cat /root/partA .partB/part > /root/smollm2.gguf; ls -la /root/smollm2.gguf
export PYTHONPATH=/root/site:$PWD
G=/root/smollm2.gguf; D=/root/assets/smollm2-135m-dflash; E=/root/assets/smollm2-135m-eagle3
timeout 420 python -m specserve eval-acceptance --model $G --dtype bfloat16 \
    -sc "{\"method\": \"dflash\", \"model\": \"$D\", \"num_speculative_tokens\": 15}" \
    -sc "{\"method\": \"dflash\", \"model\": \"$D\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$E\", \"num_speculative_tokens\": 4}" \
    -sc "{\"method\": \"eagle3\", \"model\": \"$E\", \"num_speculative_tokens\": 7}" \
    --dataset .s16/ev/{mt_bench_question,gsm8k_test,math500_test,humaneval,alpaca}.jsonl \
    --num-prompts 24 --max-tokens 256 --batch-size 8 --out $OUT/eval_acceptance-h200.json \
    2>&1 | grep -v '^{' | tee $OUT/eval_acceptance-h200.log | tail -25
