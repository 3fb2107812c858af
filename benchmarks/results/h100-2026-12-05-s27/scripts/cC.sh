# session 27, call C: DFlash round M = round L (session 26) trained on session 26's carried data for the whole call
# carry [".s26d", ".s27"] with benchmarks/results and the drafters' model.safetensors moved out of the tree;
# /root/smollm2.gguf, /root/site from calls A-B. Then call D: `bash .s27/cD.sh` (carry [".s27"])
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p /root/g /root/new/smollm2-135m-dflash /root/logs
xz -dc .s26d/data.tar.xz | tar -C /root/g -xf -
cat .s26d/model.safetensors.part* > /root/new/smollm2-135m-dflash/model.safetensors
cp .s26d/config.json .s26d/training.json /root/new/smollm2-135m-dflash/
md5sum /root/new/smollm2-135m-dflash/model.safetensors; wc -l /root/g/*/data.jsonl
G=/root/smollm2.gguf; L=/root/logs
MT=$(( ${CALL:-590} - 45 - ($(date +%s) - T0) ))
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl /root/g/latex8/data.jsonl)
python -m specserve.train.cli dflash --target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 2e-4 --warmup-ratio 0.02 \
    --log-every 20 --seed 6 --no-progress --weight-decay 0 --save-every 0 \
    --init-from /root/new/smollm2-135m-dflash --work-dir /root/wM/dflash --export-format int8 \
    --num-layers 5 --intermediate-size 1536 --target-layer-ids 1 7 14 20 27 --block-size 16 --num-anchors 256 --max-steps 1500 --labels target \
    --max-time $MT --output /root/new2/smollm2-135m-dflash > $L/trainM-dflash.log 2>&1
tail -n 3 $L/trainM-dflash.log; grep -h "time budget\|exported\|params" $L/trainM-dflash.log | tail -5
mkdir -p $OUT/df2 && split -b 15000000 -d /root/new2/smollm2-135m-dflash/model.safetensors $OUT/df2/model.safetensors.part
cp /root/new2/smollm2-135m-dflash/config.json /root/new2/smollm2-135m-dflash/training.json $OUT/df2/
cp $L/trainM-dflash.log $OUT/
echo "[cC] total $(( $(date +%s) - T0 )) s"
