# call 2: GGUF assembled; data regenerated (session 21's three sets + a fourth LaTeX set at T=0.8);
# DFlash round L: the shipped drafter grown to 5 taps x intermediate 1536, one LR schedule fitted by --max-time;
# then held-out acceptance of the new DFlash and the int8 EAGLE-3 (two processes side by side)
T0=$(date +%s)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
cat /root/partA .partB/part > /root/smollm2.gguf && md5sum /root/smollm2.gguf
G=/root/smollm2.gguf; D=/root/data; L=/root/logs
TR="python -m specserve.train.cli"
# 11 generator processes, each with a KV cache for its whole batch (256 x 1408 tokens: 8.3 GB): on a card under
# 100 GB (an H100) half the batch
GBS=${GBS:-$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1 | awk '{print ($1 < 100000) ? 128 : 256}')}
echo "[c2] generator batch $GBS"
GEN=(--target $G --generate-only --max-new-tokens 384 --max-prompt-length 1024 --generator engine --gen-batch-size $GBS --no-progress)
$TR dflash "${GEN[@]}" --gen-procs 3 --output /root/g/mix --prompts $D/gsm8k_train.jsonl:1000 $D/mbpp_sanitized.json $D/spec_bench_question.jsonl \
    $D/corpus/tinyshakespeare.txt:800 $D/extra_math_train.jsonl:1500 --self-prompts 600 --gen-temperature 0 --seed 0 > $L/gen-mix.log 2>&1 &
P1=$!
$TR dflash "${GEN[@]}" --gen-procs 3 --output /root/g/latexg --self-prompts 3000 --self-grid latex --gen-temperature 0 --seed 21 > $L/gen-latexg.log 2>&1 &
P2=$!
$TR dflash "${GEN[@]}" --gen-procs 3 --output /root/g/latexs --self-prompts 3000 --self-grid latex --gen-temperature 0.6 --seed 22 --gen-seed 22000 > $L/gen-latexs.log 2>&1 &
P3=$!
$TR dflash "${GEN[@]}" --gen-procs 2 --output /root/g/latex8 --self-prompts 1500 --self-grid latex --gen-temperature 0.8 --seed 23 --gen-seed 23000 > $L/gen-latex8.log 2>&1 &
P5=$!
wait $P1 $P2 $P3 $P5
for f in $L/gen-*.log; do echo "== $f"; grep "wrote\|rror" $f | tail -3; done
T1=$(date +%s); echo "[c2] data in $((T1 - T0)) s"
# the generated data back to the dev VM (for later sessions: carried instead of regenerated), xz in 15 MB parts
# ($OUT takes files of at most 16 MiB, 8 in all), packed while the drafter trains
mkdir -p $OUT && (cd /root/g && tar -cf - */data.jsonl */data.jsonl.meta.json | xz -T8 -6 | split -b 15000000 -d - $OUT/data.tar.xz.part) &
PK=$!
EVT=${EVT:-150}; [ -n "$NOEVAL" ] && EVT=0
MT=$(( ${CALL:-600} - (T1 - T0) - EVT - 45 ))
echo "[c2] train max-time $MT"
DATA=(/root/g/mix/data.jsonl /root/g/latexg/data.jsonl /root/g/latexs/data.jsonl /root/g/latex8/data.jsonl)
$TR dflash --target $G --data "${DATA[@]}" --batch-size 32 --max-length 1536 --epochs 100 --lr 3e-4 --warmup-ratio 0.04 \
    --log-every 20 --seed 5 --no-progress --weight-decay 0 --save-every 0 \
    --init-from /root/assets/smollm2-135m-dflash --work-dir /root/wL/dflash --export-format int8 \
    --num-layers 5 --intermediate-size 1536 --target-layer-ids 1 7 14 20 27 --block-size 16 --num-anchors 256 --max-steps 1500 --labels target \
    --max-time $MT --output /root/new/smollm2-135m-dflash > $L/trainL-dflash.log 2>&1
tail -n 3 $L/trainL-dflash.log; grep -h "time budget\|exported\|params" $L/trainL-dflash.log | tail -5
python - <<'PY'
import shutil
from specserve.train.export import load_drafter, export_drafter
src = "/root/assets/smollm2-135m-eagle3"
export_drafter(load_drafter(src), "/root/new/smollm2-135m-eagle3", weight_format="int8")
shutil.copy(src + "/training.json", "/root/new/smollm2-135m-eagle3/training.json")
PY
md5sum /root/new/*/model.safetensors
# the new DFlash weights (19.5 MB: over $OUT's 16 MiB a file) in two parts (cat model.safetensors.part* > ...),
# its config.json / training.json inside logs.tgz (logs/new-dflash/)
mkdir -p $OUT/df /root/logs/new-dflash && split -b 15000000 -d /root/new/smollm2-135m-dflash/model.safetensors $OUT/df/model.safetensors.part
cp /root/new/smollm2-135m-dflash/config.json /root/new/smollm2-135m-dflash/training.json /root/logs/new-dflash/
cp /root/new/smollm2-135m-eagle3/model.safetensors $OUT/eagle3-int8.safetensors
wait $PK; ls -la $OUT $OUT/df
T2=$(date +%s); echo "[c2] trained at $((T2 - T0)) s"
if [ -n "$NOEVAL" ]; then tar -C /root -czf $OUT/logs.tgz logs; echo "[c2] total $(( $(date +%s) - T0 )) s"; exit 0; fi
# the held-out evaluation: c2e.sh (also a call of its own) in the time left
CALL=$(( ${CALL:-600} - (T2 - T0) )) bash "$(dirname "$0")/c2e.sh"
echo "[c2] total $(( $(date +%s) - T0 )) s"
