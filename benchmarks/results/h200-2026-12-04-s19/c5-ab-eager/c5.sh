set -x
mkdir -p /root/q3 /root/out5 && cp .s19/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s19/q3/tokenizer.json.xz').read())"
export PYTHONPATH=$PWD
timeout 200 python .s19/eager8b.py /root/q3 > /root/out5/eager.log 2>&1; tail -3 /root/out5/eager.log
timeout 200 python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env SPECSERVE_FUSED_NORM --batches 1 --tokens 256 --values 0 auto 0 auto --out /root/out5/sweep.json > /root/out5/sweep.log 2>&1; tail -7 /root/out5/sweep.log
cp .s19/c5.sh .s19/eager8b.py /root/out5/
tar -C /root/out5 -czf $OUT/c5.tgz .
