set -x
mkdir -p /root/q3 /root/out3 && cp .s19/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s19/q3/tokenizer.json.xz').read())"
export PYTHONPATH=$PWD
timeout 150 python benchmarks/fused_norm_check.py --replays 50 --out /root/out3/fused_norm_check.json > /root/out3/check.log 2>&1; tail -3 /root/out3/check.log
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_FUSED_NORM --batches 1 4 --tokens 192 --values 0 1 2 --out /root/out3/sweep.json > /root/out3/sweep.log 2>&1; tail -9 /root/out3/sweep.log
for m in 0 1 2; do SPECSERVE_FUSED_NORM=$m timeout 150 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --skip-hf --skip-eager --configs plain dflash:15 --out /root/out3/sl-m$m.json > /root/out3/sl-m$m.log 2>&1; tail -6 /root/out3/sl-m$m.log; done
cp .s19/c3.sh /root/out3/
tar -C /root/out3 -czf $OUT/c3.tgz .
