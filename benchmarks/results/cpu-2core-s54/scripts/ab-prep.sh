#!/usr/bin/env bash
# On the dev VM, from the repo root: the ignored carry folders for the #5 A/B of `--position-weight prefix`
# (ab-c1.sh .. ab-c3.sh, three device calls made back to back so /root survives). The whole transfer of a call is
# 64 MiB (tracked files included), so the GGUF (95 MB) is split 43 / 52 MB:
#   call 1: carry [".s55a", ".whl"], with benchmarks/results and the EAGLE-3 drafter's model.safetensors moved out of
#           the tree (tracked ~16 MB: code + the DFlash drafter, which call 1 copies to /root/assets);
#   call 2: carry [".s55b"], with benchmarks/results and both drafters' model.safetensors moved out of the tree;
#   call 3: carry [".s55c"] (scripts only), tree as in call 2.
# Restore the moved files after the calls (git checkout -- specserve/assets benchmarks/results).
set -euo pipefail
G=${SMOLLM2_GGUF:-$HOME/.cache/specserve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
D=${DATA_DIR:-../shared/data}
S=benchmarks/results/cpu-2core-s54/scripts
rm -rf .s55a .s55b .s55c && mkdir -p .s55a .s55b/data .s55c
head -c 43000000 "$G" > .s55a/part
tail -c +43000001 "$G" > .s55b/part
cp "$S/ab-c1.sh" .s55a/ && cp "$S/ab-c2.sh" .s55b/ && cp "$S/ab-c3.sh" .s55c/
xz -9c "$D/gsm8k_train.jsonl" > .s55b/data/gsm8k_train.jsonl.xz
for f in math500_test gsm8k_test mt_bench_question; do cp ".s23e/$f.jsonl" .s55b/data/ 2>/dev/null || cp "$D/$f.jsonl" .s55b/data/; done
md5sum "$G"; du -sh .s55a .s55b .s55c
