# session 34, call 2 (carry [".partB", ".s23e", ".s34"], made at once after call 1): the GGUF; the row-loop GEMV
# (SPECSERVE_GEMV_CFG=...,rows) for SmolLM2's multi-row steps vs the default (split-K GEMMs + RMSNorm kernels) and the
# old multi-row GEMV tile: random-weight step sweeps (DFlash K=7 b1/b2, plain b1-b8), then the real weights at batch 1
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
cp -r .s23e /root/ev
C=/root/s28cfg; DF=/root/assets/smollm2-135m-dflash; G=/root/smollm2.gguf
S7="{\"method\":\"dflash\",\"model\":\"$DF\",\"num_speculative_tokens\":7}"
R8="8,1024,4,1,1pass,rows"; R16="16,1024,8,1,1pass,rows"; R4="4,1024,4,1,1pass,rows"; RD="8,1024,4,1,1pass,rows;4,2048,4,1,1pass,rows"
timeout 220 python benchmarks/decode_env_sweep.py --config-dir $C --env - --spec "$S7" --batches 1 2 --tokens 128 \
  --values "SPECSERVE_TRITON_GEMV=auto" "SPECSERVE_TRITON_GEMV=1" "SPECSERVE_TRITON_GEMV=1;SPECSERVE_GEMV_CFG=$R8" \
  "SPECSERVE_TRITON_GEMV=1;SPECSERVE_GEMV_CFG=$R16" "SPECSERVE_TRITON_GEMV=1;SPECSERVE_GEMV_CFG=$R4" \
  "SPECSERVE_TRITON_GEMV=1;SPECSERVE_GEMV_CFG=$RD" "SPECSERVE_TRITON_GEMV=auto" \
  --out $OUT/sweep-dflash7.json > $OUT/sweep-dflash7.log 2>&1
echo "rc=$?"; sed -n '/weight-read floor/,$p' $OUT/sweep-dflash7.log; grep -i "error\|Traceback" $OUT/sweep-dflash7.log | head -5
echo "[c2] sweep dflash $(( $(date +%s) - T0 )) s"
timeout 120 python benchmarks/decode_env_sweep.py --config-dir $C --env - --batches 1 2 4 8 --tokens 128 \
  --values "SPECSERVE_TRITON_GEMV=auto" "SPECSERVE_TRITON_GEMV=1;SPECSERVE_GEMV_CFG=$R8" "SPECSERVE_TRITON_GEMV=auto" \
  --out $OUT/sweep-plain.json > $OUT/sweep-plain.log 2>&1
echo "rc=$?"; sed -n '/weight-read floor/,$p' $OUT/sweep-plain.log
echo "[c2] sweep plain $(( $(date +%s) - T0 )) s"
for V in auto rows; do
  if [ $V = rows ]; then export SPECSERVE_TRITON_GEMV=1 SPECSERVE_GEMV_CFG=$R8; fi
  timeout 110 python benchmarks/smollm2_gpu.py --gguf $G --dflash $DF --skip-hf --no-eager --reps 3 \
    --only plain "dflash K=7" --timed-file /root/ev/gsm8k_test.jsonl:2 --timed-file /root/ev/mt_bench_question.jsonl:2 \
    --out $OUT/smollm2-$V.json > $OUT/smollm2-$V.log 2>&1
  echo "== $V rc=$?"; grep -v "^INFO" $OUT/smollm2-$V.log | grep -v "^{" | tail -12
done
echo "[c2] total $(( $(date +%s) - T0 )) s"
