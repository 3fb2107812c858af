# session 41: on an H200 the owed #6 tables' first call (.s40/c1.sh: GGUF half A to /root, the 8B-shaped step table;
# then .s40/c2.sh at once); on any other GPU the staged-GEMM sweep g2 on the tree + the session's staged code
N=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $N"
case "$N" in
  *H200*) bash .s40/c1.sh ;;
  *) cp .s41/keep/gluon_staged.py specserve/layers/ && cp .s41/keep/llama.py specserve/models/llama.py \
       && cp .s41/keep/staged_gemv.py benchmarks/ && bash .s41/g2.sh ;;
esac
