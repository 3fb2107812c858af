# session 36, call 2 (carry [".s36"]): what the in-graph random sampler costs (sample_verify captured in a graph)
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch; print(torch.cuda.get_device_name())"
timeout 400 python benchmarks/sampling_profile.py --out $OUT/sampling_profile.json 2>&1 | grep -v "^STAGE\|Warn" | tee $OUT/sampling_profile.log | tail -300
