# session 41: .s40/c1.sh without its step table (setup only: GGUF half A, wheels, drafters into /root)
# session 40 (= session 39), call 1 (carry [".partA", ".whl", ".s28", ".s32w", ".s28q", ".s39"]; benchmarks/results and the
# drafters' model.safetensors moved out of the tree, .s32w holds them xz'd): GGUF half A, wheels, drafters, SmolLM2
# config into /root; then the Qwen3-8B-shaped step at batch 1 (graphs only): plain vs the weight-read floor,
# DFlash K=15, EAGLE-3 K=7
T0=$(date +%s)
mkdir -p /root/site /root/assets
cp .partA/part /root/partA
pip install -q --no-index --no-deps --target /root/site .whl/*.whl 2>&1 | grep -v WARN | tail -2
python -c "import lzma
for n in ('dflash', 'eagle3'): open(f'specserve/assets/smollm2-135m-{n}/model.safetensors', 'wb').write(lzma.open(f'.s32w/{n}.safetensors.xz').read())"
cp -r specserve/assets/smollm2-135m-dflash specserve/assets/smollm2-135m-eagle3 /root/assets/
md5sum /root/assets/*/model.safetensors
C=/root/s28cfg; mkdir -p $C && cp .s28/smollm2cfg/* $C/ && python -c "import lzma; open('$C/tokenizer.json','wb').write(lzma.open('$C/tokenizer.json.xz').read())" && rm $C/tokenizer.json.xz
mkdir -p /root/q3 && cp .s28q/q3/* /root/q3/ && (cd /root/q3 && python -c "import lzma,glob
for f in glob.glob('*.xz'): open(f[:-3],'wb').write(lzma.open(f).read())" && rm -f *.xz)
export PYTHONPATH=/root/site:$PWD PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
python -c "import torch, triton, fastapi, gguf; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,power.limit --format=csv,noheader
git rev-parse HEAD 2>/dev/null
echo "[c1] setup $(( $(date +%s) - T0 )) s"
