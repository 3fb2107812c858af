# session 38, one call (carry [".s28q", ".s38"]): g1.sh (fp32 tokens folded vs not; the bf16 plain step A/B/A/B)
# then step_latency plain + DFlash K=15 at batch 1 on the new default, in what time is left of ~570 s
T0=$(date +%s)
FT=${FT:-110} ST=${ST:-210} bash .s38/g1.sh
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "[g3] step_latency with ${LEFT} s"
timeout $LEFT python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --configs plain dflash:15 \
   --skip-eager --skip-hf --out $OUT/step_latency-q3-b1.json > $OUT/step_latency-q3-b1.log 2>&1
echo "rc=$?"; grep -v "^INFO\|^{" $OUT/step_latency-q3-b1.log | tail -12
echo "[g3] total $(( $(date +%s) - T0 )) s"
