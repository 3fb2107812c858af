# next session, call 1: GGUF half A, round L's weights + config, the data generated in session 26, the eval sets
# carry [".partA", ".s26d", ".s21a", ".s23e", ".s23s"] with benchmarks/results and specserve/assets/*/model.safetensors
# moved out of the tree (64 MiB); .s26d = data.tar.xz + model.safetensors.part00/01 (session 26's call 2 outputs)
# + config.json / training.json (train/roundL-*.json); rebuild it from the dev VM's .s26d if lost: it is not in git
T0=$(date +%s)
mkdir -p /root/site /root/g /root/new/smollm2-135m-dflash /root/logs
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .s21a/gguf-*.whl 2>&1 | tail -1
xz -dc .s26d/data.tar.xz | tar -C /root/g -xf -
cat .s26d/model.safetensors.part* > /root/new/smollm2-135m-dflash/model.safetensors
cp .s26d/config.json /root/new/smollm2-135m-dflash/config.json  # = train/roundL-config.json
cp .s26d/training.json /root/new/smollm2-135m-dflash/training.json
cp -r .s23s /root/s23s; cp -r .s23e /root/ev
md5sum /root/new/smollm2-135m-dflash/model.safetensors; wc -l /root/g/*/data.jsonl
echo "c1d $(( $(date +%s) - T0 )) s"
