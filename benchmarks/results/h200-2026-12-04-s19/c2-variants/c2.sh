set -x
mkdir -p /root/q3 /root/out2 && cp .s19/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s19/q3/tokenizer.json.xz').read())"
export PYTHONPATH=$PWD
timeout 200 python benchmarks/fused_norm_check.py --replays 50 --out /root/out2/fused_norm_check.json > /root/out2/check.log 2>&1; tail -4 /root/out2/check.log
timeout 300 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_FUSED_NORM --batches 1 4 --tokens 192 --values 0 1 2 --out /root/out2/sweep.json > /root/out2/sweep.log 2>&1; tail -9 /root/out2/sweep.log
cp .s19/c2.sh /root/out2/
tar -C /root/out2 -czf $OUT/c2.tgz .
