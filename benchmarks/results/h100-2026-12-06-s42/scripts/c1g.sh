# session 42: the setup half of the owed SmolLM2-vs-HF table (.s42/c1s.sh = session 41's: GGUF half A, wheels,
# drafters into /root) only on an H200; then .s40/c2.sh at once. Any other GPU: exit at once.
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) bash .s42/c1s.sh ;; *) echo "not an H200: skipped" ;; esac
