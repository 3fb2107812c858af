# session 28, call 1: GGUF half A + wheels + drafters into /root; SmolLM2-shaped step sweeps (random weights):
# the add + RMSNorms folded into the verify's GEMMs (SPECSERVE_FUSED_NORM) and the fused attention merge
# carry [".partA", ".whl", ".s28"] with benchmarks/results moved out of the tree (64 MiB)
T0=$(date +%s)
mkdir -p /root/site /root/assets /root/s28
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
cp -r specserve/assets/smollm2-135m-dflash specserve/assets/smollm2-135m-eagle3 /root/assets/
cp -r .s28/* /root/s28/
C=/root/s28/smollm2cfg
python -c "import lzma,sys; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
R=/root/s28/r1; mkdir -p $R
DF=/root/assets/smollm2-135m-dflash
S='{"method":"dflash","model":"'$DF'","num_speculative_tokens":15}'
echo "[c1] setup $(( $(date +%s) - T0 )) s"
timeout ${T1:-320} python benchmarks/decode_env_sweep.py --config-dir $C --env - --spec "$S" --batches 1 4 \
  --tokens 128 --prompt-len 256 --out $R/sweep_dflash.json \
  --values "SPECSERVE_FUSED_NORM=auto" "SPECSERVE_FUSED_NORM=1" "SPECSERVE_FUSED_NORM=2" \
  "SPECSERVE_FUSED_NORM=2;SPECSERVE_ATTN_MERGE=fused" "SPECSERVE_ATTN_MERGE=fused" "SPECSERVE_FUSED_NORM=auto" \
  > $R/sweep_dflash.log 2>&1
echo "rc=$?"; grep "^{" $R/sweep_dflash.log | cut -c1-260
echo "[c1] dflash sweep $(( $(date +%s) - T0 )) s"
timeout ${T2:-150} python benchmarks/decode_env_sweep.py --config-dir $C --env SPECSERVE_FUSED_NORM \
  --values auto 1 2 auto --batches 2 4 8 --tokens 128 --prompt-len 256 --out $R/sweep_plain.json > $R/sweep_plain.log 2>&1
echo "rc=$?"; grep "^{" $R/sweep_plain.log | cut -c1-200
cp -r $R $OUT/
echo "[c1] total $(( $(date +%s) - T0 )) s"
