# session 40, call m1 (carry [".s28", ".s28q", ".s40"]): SPECSERVE_FUSED_NORM=3 (qkv and gate_up + SiLU-mul sum the
# partials before them and normalise in one kernel: no add + RMSNorm kernel between layers) against the default, A/B
# in one process per sweep; SmolLM2-135M's shape (random weights) with the shipped DFlash drafter at K=7, plain
# decoding at 2-8 rows, the Qwen3-8B shape at 4 / 8 rows; then float32 greedy tokens 0 vs 3 (DFlash K=7, plain b4)
T0=$(date +%s)
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
DF=$PWD/specserve/assets/smollm2-135m-dflash
S='{"method":"dflash","model":"'$DF'","num_speculative_tokens":7}'
F=SPECSERVE_FUSED_NORM
show() { grep -v "^INFO\|^{\|regex pattern" $1 | tail -${2:-30}; grep -i "Traceback\|Error" $1 | tail -3; }
echo "[m1] setup $(( $(date +%s) - T0 )) s"
timeout ${T1:-240} python benchmarks/decode_env_sweep.py --config-dir $C --env - --spec "$S" --batches 1 2 4 \
  --short-tokens 32 --tokens 160 --out $OUT/smol-dflash7.json \
  --values "$F=0" "$F=3" "$F=3;SPECSERVE_TRITON_GEMM_TILES=qkv@16nk=32:64:2:4" \
  "$F=3;SPECSERVE_TRITON_GEMM_TILES=qkv@16nk=16:64:2:4,gate_up@16nk=16:64:3:4" "$F=0" "$F=3" > $OUT/smol-dflash7.log 2>&1
echo "rc=$?"; show $OUT/smol-dflash7.log 24
echo "[m1] $(( $(date +%s) - T0 )) s"
timeout ${T2:-120} python benchmarks/decode_env_sweep.py --config-dir $C --env $F --batches 2 4 8 \
  --short-tokens 32 --tokens 160 --out $OUT/smol-plain.json --values 0 3 0 3 > $OUT/smol-plain.log 2>&1
echo "rc=$?"; show $OUT/smol-plain.log 16
echo "[m1] $(( $(date +%s) - T0 )) s"
DF=$DF timeout ${T3:-150} python - > $OUT/fp32.log 2>&1 <<'PY'
import os, json
from specserve import LLM, SamplingParams
C = "/root/s28cfg"; DF = os.environ.get("DF", "specserve/assets/smollm2-135m-dflash")
prompts = [[1000 + 37 * i + j for j in range(40 + 9 * i)] for i in range(4)]
sp = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
res = {}
for flag in ("0", "3"):
    os.environ["SPECSERVE_FUSED_NORM"] = flag
    for name, spec in (("plain", None), ("dflash7", {"method": "dflash", "model": DF, "num_speculative_tokens": 7})):
        llm = LLM(C, load_format="dummy", dtype="float32", speculative_config=spec)
        res[(flag, name)] = [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], sp)]
        del llm
for name in ("plain", "dflash7"):
    print(name, "float32 tokens FUSED_NORM 3 == 0:", res[("3", name)] == res[("0", name)])
print("dflash == plain (0):", res[("0", "dflash7")] == res[("0", "plain")], "(3):", res[("3", "dflash7")] == res[("3", "plain")])
PY
echo "rc=$?"; show $OUT/fp32.log 6
echo "[m1] $(( $(date +%s) - T0 )) s"
timeout ${T4:-150} python benchmarks/decode_env_sweep.py --config-dir /root/q3 --env $F --batches 4 8 \
  --short-tokens 32 --tokens 160 --out $OUT/q3-plain.json --values 0 3 0 3 > $OUT/q3-plain.log 2>&1
echo "rc=$?"; show $OUT/q3-plain.log 12
echo "[m1] total $(( $(date +%s) - T0 )) s"
