set -x
mkdir -p /root/q3 /root/out && cp .s19/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s19/q3/tokenizer.json.xz').read())"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu --format=csv
timeout 150 python benchmarks/fused_norm_check.py --replays 100 --out /root/out/fused_norm_check.json > /root/out/check.log 2>&1; tail -4 /root/out/check.log
timeout 330 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env - --batches 1 4 8 --tokens 192 --values "SPECSERVE_FUSED_NORM=0;SPECSERVE_TRITON_GATE_UP_MIN_ROWS=2" "SPECSERVE_FUSED_NORM=0;SPECSERVE_TRITON_GATE_UP_MIN_ROWS=1" "SPECSERVE_FUSED_NORM=1" --out /root/out/sweep.json > /root/out/sweep.log 2>&1; tail -13 /root/out/sweep.log
cp .s19/c1.sh /root/out/
tar -C /root/out -czf $OUT/c1.tgz .
