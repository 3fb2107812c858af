set -x
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out3 && ls -la /root/smollm2.gguf
timeout 520 python benchmarks/smollm2_gpu.py --gguf /root/smollm2.gguf --dflash /root/assets/smollm2-135m-dflash --eagle3 /root/assets/smollm2-135m-eagle3 --hf-timeout 230 --no-eager --only plain "dflash K=15" "eagle3 K=7" --out /root/out3/smollm2_gpu-hf-h200.json > /root/out3/smol-hf.log 2>&1; tail -14 /root/out3/smol-hf.log
cp .s18b/c3.sh /root/out3/
tar -C /root/out3 -czf $OUT/c3.tgz .
