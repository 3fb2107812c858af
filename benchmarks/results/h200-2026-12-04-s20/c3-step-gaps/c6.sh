export PYTHONPATH=$PWD
S='{"method":"dflash","model":"specserve/assets/smollm2-135m-dflash","num_speculative_tokens":15}'
python .s20/hostgap.py .bench/smollm2 - 2>&1 | grep -v -i warn | tail -2
python .s20/hostgap.py .bench/smollm2 "$S" 2>&1 | grep -v -i warn | tail -2
python .s20/hostgap.py .bench/qwen3-8b - 2>&1 | grep -v -i warn | tail -2
