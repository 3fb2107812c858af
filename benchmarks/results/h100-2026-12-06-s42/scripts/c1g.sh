# session 42: the setup half of the owed SmolLM2-vs-HF table only on an H200; then scripts/c2.sh at once. Any other
# GPU: exit at once. .s42/c1s.sh = lines 5-20 of results/h100-2026-12-06-s39/scripts/c1.sh (GGUF half A, wheels,
# drafters, configs into /root; copy them out before benchmarks/results leaves the tree for the call)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) bash .s42/c1s.sh ;; *) echo "not an H200: skipped" ;; esac
