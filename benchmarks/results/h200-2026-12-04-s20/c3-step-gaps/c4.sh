export PYTHONPATH=$PWD
python .s20/glaunch.py 2>&1 | grep -v -i warn
S='{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":15}'
for p in 1 0; do
SPECSERVE_PDL=$p python .s20/gap.py .bench/smollm2 - 2>&1 | grep -v -i warn | head -3
SPECSERVE_PDL=$p python .s20/gap.py .bench/smollm2 "$S" 2>&1 | grep -v -i warn | head -3
done
