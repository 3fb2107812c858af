# Rebuild, on a fresh checkout of the dev VM, the ignored folders session 33's calls carried (run from the repo root
# with the venv active): .partA / .partB / .whl / .s23e by session 23's prep.sh, .s28 / .s28q by session 28's, then
#   .s32w  the shipped drafters' model.safetensors, xz'd (24.1 -> 19.8 MB: half A of the GGUF, the wheels, SmolLM2's
#          config and the drafters then fit one call's 64 MiB with benchmarks/results and the two model.safetensors
#          moved out of the tree; c1.sh / c5.sh unpack them into the tree on the device)
#   .s33   this session's scripts: call 1 `bash .s33/c1.sh` carrying [".partA", ".whl", ".s28", ".s32w", ".s33"], call 2
#          at once `bash .s33/c2.sh` carrying [".partB", ".s23e", ".s33"], then c3.sh [".s28q", ".s33"], c4.sh
#          [".s33"]; c5.sh [".s28", ".s32w", ".s33"] on its own (random target weights)
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
bash benchmarks/results/h200-2026-12-05-s23/prep.sh
bash benchmarks/results/h100-2026-12-05-s28/prep.sh
rm -rf .s32w .s33 && mkdir -p .s32w .s33
for n in dflash eagle3; do xz -9 -c specserve/assets/smollm2-135m-$n/model.safetensors > .s32w/$n.safetensors.xz; done
cp "$HERE"/scripts/c*.sh .s33/
du -sh .s32w .s33
