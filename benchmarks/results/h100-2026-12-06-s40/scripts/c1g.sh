# session 40: run .s40/c1.sh only on an H200 (an H100 answers at once, so a probe costs only the start)
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in *H200*) bash .s40/c1.sh ;; *) echo "not an H200: skipped" ;; esac
