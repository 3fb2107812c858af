# session 27, call A: GGUF half A, the server wheels, the shipped drafters, the held-out sets into /root
# carry [".partA", ".whl", ".s27"] with benchmarks/results moved out of the tree (64 MiB)
T0=$(date +%s)
mkdir -p /root/site /root/assets /root/logs
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
cp -r specserve/assets/smollm2-135m-dflash specserve/assets/smollm2-135m-eagle3 /root/assets/
cp -r .s27 /root/s27
md5sum /root/partA /root/assets/*/model.safetensors
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "[cA] $(( $(date +%s) - T0 )) s"
