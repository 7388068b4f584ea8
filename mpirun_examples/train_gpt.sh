#!/usr/bin/env bash
# The transformer on one host: a byte-level GPT on Debian's fortunes (apt-get install fortunes;
# cmake/install-deps.sh does), trained with autodiff and AdamW. MESH picks the parallelism:
# data=2 (the default: the batch split over 2 ranks), model=2 (Megatron heads + sequence
# parallel), or data=D,model=M on D*M ranks x devices.
#   ./mpirun_examples/train_gpt.sh [train_gpt flags...]
#   RANKS=4 MESH=data=2,model=2 ./mpirun_examples/train_gpt.sh --steps 500 --checkpoint-dir ckpt
#   ./mpirun_examples/train_gpt.sh --checkpoint-dir ckpt --sample --prompt "The " --temperature 0.8
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source-path=SCRIPTDIR source=../cmake/mpi-env.sh
source cmake/mpi-env.sh
RANKS=${RANKS:-2}
MESH=${MESH:-data=$RANKS}
bind=(--bind-to core)
[ "$RANKS" -le "$(nproc)" ] || bind=(--oversubscribe --bind-to none)
set -x
mpirun -n "$RANKS" "${bind[@]}" build/release/apps/train_gpt --mesh "$MESH" "$@"
