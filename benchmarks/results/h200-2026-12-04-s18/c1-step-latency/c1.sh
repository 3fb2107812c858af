set -x
cp .partA/part /root/partA && cp -r specserve/assets /root/assets && ls -la /root/partA /root/assets
mkdir -p /root/q3 /root/out && cp .s18/q3/*.json /root/q3/ && python -c "import lzma; open('/root/q3/tokenizer.json','wb').write(lzma.open('.s18/q3/tokenizer.json.xz').read())"
pip install -q --no-index --no-deps --target /root/site .s18/*.whl
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.sm,temperature.gpu --format=csv
python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 4 --skip-hf --skip-eager --configs plain dflash:15 eagle3:7 --out /root/out/sl1.json > /root/out/sl1.log 2>&1; tail -12 /root/out/sl1.log
python benchmarks/step_latency.py --config-dir /root/q3 --batches 1 --skip-hf --skip-eager --configs plain dflash:15 --out /root/out/sl2.json > /root/out/sl2.log 2>&1; tail -8 /root/out/sl2.log
cp .s18/c1.sh /root/out/
tar -C /root/out -czf $OUT/c1.tgz .
