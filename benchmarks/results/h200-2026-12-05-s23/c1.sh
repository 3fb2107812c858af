# call 1: GGUF half A, gguf wheel, training prompts, the shipped drafters -> /root
T0=$(date +%s)
mkdir -p /root/site /root/data /root/assets /root/logs
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .s21a/gguf-*.whl 2>&1 | tail -2
tar -C /root/data -xJf .s21a/traindata.tar.xz
cp -r specserve/assets/smollm2-135m-dflash specserve/assets/smollm2-135m-eagle3 /root/assets/
cp -r .s23s /root/s23s; cp -r .s23e /root/ev
ls -la /root/data /root/assets/* /root/partA
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)"
echo "call1 $(( $(date +%s) - T0 )) s"
