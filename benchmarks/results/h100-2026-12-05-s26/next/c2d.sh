# next session, call 2: round M = round L trained on the carried data for the whole call (no generation), one LR schedule (peak 2e-4) fitted by --max-time; carry [".partB", ".s23s"]; then `CALL=200 N=/root/new2 bash .s23s/c2e.sh`
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
G=/root/smollm2.gguf; L=/root/logs
TR="python -m specserve.train.cli"
MT=$(( ${CALL:-590} - 45 ))
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl /root/g/latex8/data.jsonl)
$TR dflash --target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 2e-4 --warmup-ratio 0.02 \
    --log-every 20 --seed 6 --no-progress --weight-decay 0 --save-every 0 \
    --init-from /root/new/smollm2-135m-dflash --work-dir /root/wM/dflash --export-format int8 \
    --num-layers 5 --intermediate-size 1536 --target-layer-ids 1 7 14 20 27 --block-size 16 --num-anchors 256 --max-steps 1500 --labels target \
    --max-time $MT --output /root/new2/smollm2-135m-dflash > $L/trainM-dflash.log 2>&1
tail -n 3 $L/trainM-dflash.log; grep -h "time budget\|exported\|params" $L/trainM-dflash.log | tail -5
mkdir -p $OUT/df2 /root/logs/new2-dflash && split -b 15000000 -d /root/new2/smollm2-135m-dflash/model.safetensors $OUT/df2/model.safetensors.part
cp /root/new2/smollm2-135m-dflash/config.json /root/new2/smollm2-135m-dflash/training.json /root/logs/new2-dflash/
tar -C /root -czf $OUT/logs.tgz logs
echo "[c2d] total $(( $(date +%s) - T0 )) s"
