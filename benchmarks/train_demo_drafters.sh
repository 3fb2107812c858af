#!/usr/bin/env bash
# Train the bundled demo drafters for SmolLM2-135M-Instruct on one GPU (budget: ~8 minutes on an H200).
#
#   SMOLLM2_GGUF=/path/SmolLM2-135M-Instruct.Q4_1.gguf DATA_DIR=/path/shared/data \
#       bash benchmarks/train_demo_drafters.sh
#
# 1. data: the target itself answers (greedy, <= 384 new tokens, chat template) the allowed prompt sets only:
#    gsm8k_train, MBPP minus its test split, Spec-Bench translation/summarization/qa/rag (the loader drops the
#    MT-Bench and math_reasoning records), tinyshakespeare continuation prompts, and ~1000 questions the target
#    writes itself (topic x style grid). Never mt_bench / gsm8k_test / math500 / HumanEval / eagle/* (the loader
#    refuses them). 4 engine processes share the GPU: the engine is host-bound at this model size.
# 2. train DFlash (5 layers, intermediate 1024, block 16, taps [1,14,27] -> ~14.4 MB int8) and EAGLE-3 (1 layer,
#    intermediate 1280, taps (2,15,27), LM head shared -> ~9.7 MB) at the same time on the same GPU.
# 3. export to specserve/assets/smollm2-135m-{dflash,eagle3}/ (config.json, model.safetensors, training.json);
#    copies also land in $OUT when set (the device runner brings $OUT back).
#
# Env overrides: WORK_DIR, ASSETS_DIR, GENERATOR (engine|hf|auto), GEN_PROCS, DFLASH_STEPS, EAGLE_STEPS,
# BUDGET (seconds for the whole script, default 540: training gets what data generation leaves, via --max-time),
# DATA_FILE (a data.jsonl[.gz] from an earlier run: skips generation; every run leaves data.jsonl.gz in $OUT),
# INIT_FROM_ASSETS=1 (continue training the drafters already in $ASSETS instead of starting from scratch),
# EAGLE_TIME_PCT (EAGLE-3's share of the training time in percent, default 100: both train side by side for the
# whole budget; less stops EAGLE-3 early and leaves the GPU to DFlash for the rest; 0 leaves EAGLE-3 as it is),
# VAL_DATA (a samples .jsonl[.gz] of prompts never trained on, e.g. the target's answers to gsm8k_train prompts
# the demo data does not use: validated before, every EVAL_EVERY (default 200) steps and after training; its
# chain_tau is the acceptance length the engine would report on those answers),
# EXTRA_PROMPTS (more prompt files for the data generation, e.g. the rest of gsm8k_train minus VAL_DATA's),
# SELF_PROMPTS (how many questions / math problems the target writes itself, default 1000; past the ~1300
# instructions of the topic grids they repeat with other sampling seeds), WEIGHT_DECAY (AdamW weight decay,
# default 0), LR (peak learning rate, default 6e-4), DFLASH_LAYERS /
# DFLASH_INTERMEDIATE (the DFlash drafter's shape, default 5 / 1024, the shipped one: ~14.4 MB in int8; the bundled drafters
# together may take 25 MB, EAGLE-3's head 9.7 of them; with INIT_FROM_ASSETS=1 a larger shape grows the shipped
# drafter without changing its function: appended layers and widened MLPs start at zero output),
# EXPORT_FORMAT (both drafters' storage, bfloat16 or int8: weight-only int8 with a scale per output row, half the
# size, for specserve only, validated within 0.001 chain_tau of bf16; unset: DFlash int8 and EAGLE-3 bfloat16, as
# shipped),
# DFLASH_STOP_AFTER / DFLASH_RESUME (one DFlash LR schedule of DFLASH_STEPS steps split over several time-limited
# runs, as the shipped drafter's last round was: DFLASH_STOP_AFTER=N stops after step N with a checkpoint in WORK_DIR
# and exports that partial drafter to $WORK/dflash-part, not the assets (no --max-time: the schedule stays
# DFLASH_STEPS long); DFLASH_RESUME=1 with the same WORK_DIR, data files and settings continues it to the end, or
# to another DFLASH_STOP_AFTER; restarting with INIT_FROM_ASSETS instead re-warms the LR, which costs ground),
# SEED (data order and anchors, default 0), DFLASH_EXTRA (more `specserve train dflash` flags, e.g.
# "--position-weight prefix"),
# BATCH_SIZE (sequences per step, default 32), EXTRA_DATA (more samples files to train on beside DATA_FILE's, e.g.
# an earlier run's sampled set),
# SAMPLED_REPEATS (R > 0 adds a second data set of sampled answers, appended to the greedy one: the gsm8k_train
# prompts (the first 3500 + EXTRA_PROMPTS) without the answer-format suffix, as gsm8k_test asks them, each
# answered R times at SAMPLED_TEMPERATURE (default 0.6) with its own seed, plus SAMPLED_SELF_PROMPTS (default 0)
# self-written questions answered at that temperature (SAMPLED_SEED, default 0: the base of the sampling seeds;
# another value gives another sampled set from the same prompts); cross-entropy on samples of the target's
# distribution keeps the argmax the greedy verifier checks, and the sampled prefixes cover more of what it writes).
set -euo pipefail
: "${SMOLLM2_GGUF:?set SMOLLM2_GGUF to SmolLM2-135M-Instruct.Q4_1.gguf}"
: "${DATA_DIR:?set DATA_DIR to the shared data directory (gsm8k_train.jsonl, corpus/, ...)}"
cd "$(dirname "$0")/.."
case "$SMOLLM2_GGUF" in *.gguf)
    python -c "import gguf" 2>/dev/null || { echo "the gguf package is needed to read $SMOLLM2_GGUF (pip install gguf)" >&2; exit 2; }
esac

WORK=${WORK_DIR:-/tmp/specserve-train-demo}
ASSETS=${ASSETS_DIR:-specserve/assets}
GENERATOR=${GENERATOR:-engine}
GEN_PROCS=${GEN_PROCS:-4}
DFLASH_STEPS=${DFLASH_STEPS:-3000}  # upper bounds: the time budget decides (both train side by side)
EAGLE_STEPS=${EAGLE_STEPS:-3000}
BUDGET=${BUDGET:-540}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$(date +%s)
TRAIN="python -m specserve.train.cli"

# ---- 1. data (~5.8k prompts, ~1.3M response tokens)
if [ -n "${DATA_FILE:-}" ]; then
    mkdir -p "$WORK/data"
    case "$DATA_FILE" in *.gz) gunzip -c "$DATA_FILE" > "$WORK/data/data.jsonl" ;; *) cp "$DATA_FILE" "$WORK/data/data.jsonl" ;; esac
    rm -f "$WORK/data/data.jsonl.meta.json"  # how it was generated, when known
    [ ! -f "$DATA_FILE.meta.json" ] || cp "$DATA_FILE.meta.json" "$WORK/data/data.jsonl.meta.json"
else
$TRAIN dflash --target "$SMOLLM2_GGUF" --output "$WORK/data" --work-dir "$WORK/data" --generate-only \
    --prompts "$DATA_DIR/gsm8k_train.jsonl:3500" "$DATA_DIR/mbpp_sanitized.json" \
              "$DATA_DIR/spec_bench_question.jsonl" "$DATA_DIR/corpus/tinyshakespeare.txt:800" ${EXTRA_PROMPTS:-} \
    --self-prompts "${SELF_PROMPTS:-1000}" --max-new-tokens 384 --max-prompt-length 1024 --gen-temperature 0 \
    --generator "$GENERATOR" --gen-procs "$GEN_PROCS" --gen-batch-size 512 --seed 0
fi
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT" && gzip -c "$WORK/data/data.jsonl" > "$OUT/data.jsonl.gz"
    [ ! -f "$WORK/data/data.jsonl.meta.json" ] || cp "$WORK/data/data.jsonl.meta.json" "$OUT/data.jsonl.gz.meta.json"
fi
DATA=("$WORK/data/data.jsonl")
for f in ${EXTRA_DATA:-}; do DATA+=("$f"); done  # more samples files of earlier runs (e.g. a sampled set)
if [ "${SAMPLED_REPEATS:-0}" -gt 0 ]; then
    $TRAIN dflash --target "$SMOLLM2_GGUF" --output "$WORK/sampled" --work-dir "$WORK/sampled" --generate-only \
        --prompts "$DATA_DIR/gsm8k_train.jsonl:3500" ${EXTRA_PROMPTS:-} --gsm8k-suffix none \
        --prompt-repeats "$SAMPLED_REPEATS" --self-prompts "${SAMPLED_SELF_PROMPTS:-0}" \
        --gen-temperature "${SAMPLED_TEMPERATURE:-0.6}" --gen-seed "${SAMPLED_SEED:-0}" --max-new-tokens 384 --max-prompt-length 1024 \
        --generator "$GENERATOR" --gen-procs "$GEN_PROCS" --gen-batch-size 512 --seed 0
    DATA+=("$WORK/sampled/data.jsonl")
    if [ -n "${OUT:-}" ]; then  # with how it was generated, so a later run's training.json records it
        gzip -c "$WORK/sampled/data.jsonl" > "$OUT/data-sampled.jsonl.gz"
        cp "$WORK/sampled/data.jsonl.meta.json" "$OUT/data-sampled.jsonl.gz.meta.json"
    fi
fi
T1=$(date +%s); echo "[demo] data generated in $((T1 - T0)) s" >&2

# ---- 2. train both drafters concurrently, for what is left of the budget (75 s kept for start-up and export)
TRAIN_TIME=$((BUDGET - (T1 - T0) - 75))
[ "$TRAIN_TIME" -gt 30 ] || { echo "[demo] no time left to train ($TRAIN_TIME s)" >&2; exit 1; }
EAGLE_TIME=$((TRAIN_TIME * ${EAGLE_TIME_PCT:-100} / 100))
echo "[demo] training budget $TRAIN_TIME s (EAGLE-3: $EAGLE_TIME s)" >&2
COMMON=(--target "$SMOLLM2_GGUF" --data "${DATA[@]}" --batch-size "${BATCH_SIZE:-32}" --max-length 1536
        --epochs 100 --lr "${LR:-6e-4}" --warmup-ratio 0.04 --save-every 0 --log-every 20 --seed "${SEED:-0}" --no-progress
        --weight-decay "${WEIGHT_DECAY:-0}")
[ -z "${VAL_DATA:-}" ] || COMMON+=(--val-data "$VAL_DATA" --eval-every "${EVAL_EVERY:-200}")
INIT_D=(); INIT_E=()
if [ "${INIT_FROM_ASSETS:-0}" = 1 ]; then
    rm -rf "$WORK/init-dflash" "$WORK/init-eagle3"  # a reused WORK_DIR: cp -r would nest the copies
    cp -r "$ASSETS/smollm2-135m-dflash" "$WORK/init-dflash"; INIT_D=(--init-from "$WORK/init-dflash")
    if [ "$EAGLE_TIME" -gt 0 ]; then
        cp -r "$ASSETS/smollm2-135m-eagle3" "$WORK/init-eagle3"; INIT_E=(--init-from "$WORK/init-eagle3")
    fi
fi
D_OUT="$ASSETS/smollm2-135m-dflash"; D_RUN=(--max-time "$TRAIN_TIME")
if [ -n "${DFLASH_STOP_AFTER:-}" ]; then  # part of one schedule: no time fit (it would shorten the schedule)
    D_OUT="$WORK/dflash-part"; D_RUN=(--stop-after "$DFLASH_STOP_AFTER")
fi
[ "${DFLASH_RESUME:-0}" != 1 ] || D_RUN+=(--resume)
$TRAIN dflash "${D_RUN[@]}" "${COMMON[@]}" "${INIT_D[@]}" --output "$D_OUT" --work-dir "$WORK/dflash" \
    --export-format "${EXPORT_FORMAT:-int8}" \
    --num-layers "${DFLASH_LAYERS:-5}" --intermediate-size "${DFLASH_INTERMEDIATE:-1024}" --block-size 16 --num-anchors 256 --max-steps "$DFLASH_STEPS" \
    ${DFLASH_EXTRA:-} > "$WORK/dflash.log" 2>&1 &
PID_D=$!
PID_E=
if [ "$EAGLE_TIME" -gt 0 ]; then
    $TRAIN eagle3 --max-time "$EAGLE_TIME" "${COMMON[@]}" "${INIT_E[@]}" --output "$ASSETS/smollm2-135m-eagle3" --work-dir "$WORK/eagle3" \
        --export-format "${EXPORT_FORMAT:-bfloat16}" --intermediate-size 1280 --ttt-steps 7 --max-steps "$EAGLE_STEPS" \
        > "$WORK/eagle3.log" 2>&1 &
    PID_E=$!
fi
RC=0
wait $PID_D || RC=$?
[ -z "$PID_E" ] || wait $PID_E || RC=$?
LOGS=("$WORK/dflash.log"); [ -z "$PID_E" ] || LOGS+=("$WORK/eagle3.log")
tail -n 3 "${LOGS[@]}" >&2
grep -h "validation at step" "${LOGS[@]}" >&2 || true
T2=$(date +%s); echo "[demo] trained in $((T2 - T1)) s; total $((T2 - T0)) s" >&2
[ "$RC" -eq 0 ] || { echo "[demo] training failed (rc $RC); logs in $WORK" >&2; exit "$RC"; }

# ---- 3. results
ls -l "$ASSETS"/smollm2-135m-*/ >&2
if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT/assets/smollm2-135m-dflash" && cp -r "$D_OUT"/. "$OUT/assets/smollm2-135m-dflash/"
    [ "$EAGLE_TIME" -eq 0 ] || cp -r "$ASSETS"/smollm2-135m-eagle3 "$OUT/assets/"
    cp "$WORK"/*.log "$OUT/" 2>/dev/null || true
fi
