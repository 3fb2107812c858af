set -x
mkdir -p /root/q3 /root/out4 && cp .s19/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s19/q3/tokenizer.json.xz').read())"
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu --format=csv
timeout 220 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 4 --skip-hf --skip-eager --configs plain dflash:15 eagle3:7 --out /root/out4/sl1.json > /root/out4/sl1.log 2>&1; tail -10 /root/out4/sl1.log
timeout 120 python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --skip-hf --skip-eager --configs plain dflash:15 --out /root/out4/sl2.json > /root/out4/sl2.log 2>&1; tail -5 /root/out4/sl2.log
timeout 200 python .s19/lossless8b.py /root/q3 > /root/out4/lossless.log 2>&1; tail -12 /root/out4/lossless.log
cp .s19/c4.sh .s19/lossless8b.py /root/out4/
tar -C /root/out4 -czf $OUT/c4.tgz .
