# #5 A/B, call 1 (carry [".s55a", ".whl"]): GGUF part A, the server wheels and the shipped DFlash drafter into /root
T0=$(date +%s)
mkdir -p /root/site /root/assets
cp .s55a/part /root/partA
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
cp -r specserve/assets/smollm2-135m-dflash /root/assets/
md5sum /root/partA /root/assets/*/model.safetensors
python -c "import torch; print(torch.__version__, torch.cuda.get_device_name())"
echo "[ab-c1] $(( $(date +%s) - T0 )) s"
