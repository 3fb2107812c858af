# session 41, call g3 (carry [".s41"]): the staged kernels' consumer alone (staged_gemv.py), more warps and 64-column
# tiles with / without the 128-byte swizzle; the tree + the session's staged code copied in on the device
cp .s41/keep/gluon_staged.py specserve/layers/ && cp .s41/keep/llama.py specserve/models/llama.py && cp .s41/keep/staged_gemv.py benchmarks/
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 90 python benchmarks/staged_gemv.py --tiles o=128:64:4:12:4 o=128:64:4:12:8 o=128:64:4:12:16 o=128:32:4:24:8 \
  o=64:64:2:24:4 o=64:64:2:24:8 o=64:64:2:24:16 qkv=64:64:1:24:8 down=64:64:2:24:8 --out $OUT/micro-sw0.json > $OUT/micro-sw0.log 2>&1
echo "rc=$?"; grep -A20 "^tile" $OUT/micro-sw0.log
SPECSERVE_STAGED_SWIZZLE=128 timeout 60 python benchmarks/staged_gemv.py --tiles o=64:64:2:24:4 o=64:64:2:24:8 o=64:64:2:24:16 \
  qkv=64:64:1:24:8 down=64:64:2:24:8 --out $OUT/micro-sw128.json > $OUT/micro-sw128.log 2>&1
echo "rc=$?"; grep -A20 "^tile" $OUT/micro-sw128.log
