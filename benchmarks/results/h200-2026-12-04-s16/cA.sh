set -u
cp .partA/part /root/partA && rm -rf /root/assets && cp -r specserve/assets /root/assets
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARNING | tail -2
ls -la /root/partA /root/assets/* | head; ls /root/site | head -30; nvidia-smi --query-gpu=name --format=csv
