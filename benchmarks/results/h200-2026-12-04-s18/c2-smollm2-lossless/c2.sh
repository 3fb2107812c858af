set -x
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
export PYTHONPATH=/root/site:$PWD
mkdir -p /root/out2
timeout 240 python benchmarks/lossless_gpu.py --model /root/smollm2.gguf --dflash /root/assets/smollm2-135m-dflash --eagle3 /root/assets/smollm2-135m-eagle3 --out /root/out2/lossless_gpu-h200.json > /root/out2/lossless.log 2>&1; tail -16 /root/out2/lossless.log
timeout 300 python benchmarks/smollm2_gpu.py --gguf /root/smollm2.gguf --dflash /root/assets/smollm2-135m-dflash --eagle3 /root/assets/smollm2-135m-eagle3 --skip-hf --only plain "dflash K=15" "eagle3 K=7" --out /root/out2/smollm2_gpu-h200.json > /root/out2/smol.log 2>&1; tail -16 /root/out2/smol.log
cp .s18b/c2.sh /root/out2/
tar -C /root/out2 -czf $OUT/c2.tgz .
