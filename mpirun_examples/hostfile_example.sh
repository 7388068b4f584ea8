#!/usr/bin/env bash
# Multi-node training with an Open MPI hostfile: RANKS_PER_NODE ranks on every node of
# HOSTFILE (mpirun --hostfile, --map-by ppr:N:node), each rank bound to its own cores, the
# MPI and OpenBLAS settings exported to every node with -x, and a ('data', 'model') mesh
# with 'model' inside a node (tensor parallel over shared memory) and 'data' across nodes
# (only the gradient all-reduce crosses the network). Runs on one machine too: the default
# hostfile, mpirun_examples/hosts.example, names only localhost.
#   [VAR=value ...] ./mpirun_examples/hostfile_example.sh [train_mlp or train_gpt flags...]
# Settings (environment variables, defaults in brackets):
#   HOSTFILE          Open MPI hostfile [mpirun_examples/hosts.example]
#   RANKS_PER_NODE    ranks started on every node [2]
#   DEVICES_PER_RANK  Shard logical devices per rank [1]
#   MODEL             size of the 'model' axis; must divide RANKS_PER_NODE * DEVICES_PER_RANK
#                     so that model groups never span nodes [RANKS_PER_NODE * DEVICES_PER_RANK]
#                     ('data' is all devices / MODEL)
#   OPENBLAS_NUM_THREADS  OpenBLAS threads of a rank with one device [1] (with more devices
#                     per rank Shard runs one OpenBLAS thread per device thread)
#   CPUS_PER_RANK     cores bound to each rank (--map-by ppr:N:node:pe=K), the threads it
#                     computes with [DEVICES_PER_RANK if > 1, else OPENBLAS_NUM_THREADS]
#   BIND              1: bind ranks to CPUS_PER_RANK cores, 0: --bind-to none [1]
#   OVERSUBSCRIBE     1: allow more ranks than slots (adds --oversubscribe, no binding, and
#                     mpi_yield_when_idle=1); for trying it out on a small machine [0]
#   NET_IF            network for MPI and Open MPI's own traffic between nodes, an interface
#                     or CIDR (btl_tcp_if_include, oob_tcp_if_include), e.g. eth0 or
#                     10.0.0.0/24 [unset: Open MPI's default, every non-loopback interface]
#   APP               train_mlp or train_gpt (the transformer: 'model' splits its heads and
#                     sequence, so MODEL must divide --heads and --context) [train_mlp]
#   SHARD_BUILD_DIR   build directory holding apps/$APP [build/release]
#   TRAIN_MLP         the app's binary itself [SHARD_BUILD_DIR/apps/$APP]
#   EPOCHS            --epochs of train_mlp [2]
#   MAX_STEPS         --max-steps, stop after this many steps (0: no limit) [0]
#   DRY_RUN           1: print the mpirun command and exit [0]
# Example: the transformer on 2 nodes x 2 ranks, mesh data=2,model=2:
#   APP=train_gpt HOSTFILE=~/hosts NET_IF=10.0.0.0/24 ./mpirun_examples/hostfile_example.sh --steps 2000
# Example: 2 nodes x 4 ranks x 2 devices, mesh data=2,model=8:
#   HOSTFILE=~/hosts RANKS_PER_NODE=4 DEVICES_PER_RANK=2 NET_IF=10.0.0.0/24 \
#     ./mpirun_examples/hostfile_example.sh --epochs 12
set -euo pipefail
# HOSTFILE and TRAIN_MLP are relative to the caller's directory, SHARD_BUILD_DIR to the
# repository root (as in the other scripts).
[ -z "${HOSTFILE:-}" ] || [[ $HOSTFILE = /* ]] || HOSTFILE=$PWD/$HOSTFILE
[ -z "${TRAIN_MLP:-}" ] || [[ $TRAIN_MLP = /* ]] || TRAIN_MLP=$PWD/$TRAIN_MLP
cd "$(dirname "${BASH_SOURCE[0]}")/.."

HOSTFILE=${HOSTFILE:-mpirun_examples/hosts.example}
RANKS_PER_NODE=${RANKS_PER_NODE:-2}
DEVICES_PER_RANK=${DEVICES_PER_RANK:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$OPENBLAS_NUM_THREADS}
# Threads a rank computes with: one per device, or OpenBLAS's with a single device (the
# Runtime sets one OpenBLAS thread when a rank has several devices).
if [ "$DEVICES_PER_RANK" = 1 ]; then threads=$OPENBLAS_NUM_THREADS; else threads=$DEVICES_PER_RANK; fi
CPUS_PER_RANK=${CPUS_PER_RANK:-$threads}
BIND=${BIND:-1}
OVERSUBSCRIBE=${OVERSUBSCRIBE:-0}
NET_IF=${NET_IF:-}
SHARD_BUILD_DIR=${SHARD_BUILD_DIR:-build/release}
APP=${APP:-train_mlp}
EPOCHS=${EPOCHS:-2}
MAX_STEPS=${MAX_STEPS:-0}
DRY_RUN=${DRY_RUN:-0}

die() { echo "hostfile_example: $*" >&2; exit 1; }
is_count() { [[ $1 =~ ^[1-9][0-9]*$ ]]; }

[ -r "$HOSTFILE" ] || die "cannot read hostfile '$HOSTFILE' (set HOSTFILE; see mpirun_examples/hosts.example)"
for v in RANKS_PER_NODE DEVICES_PER_RANK OPENBLAS_NUM_THREADS CPUS_PER_RANK; do
  is_count "${!v}" || die "$v must be a positive integer, got '${!v}'"
done
# Nodes: the distinct first words of the hostfile's non-comment lines.
mapfile -t nodes < <(sed -e 's/#.*//' "$HOSTFILE" | awk 'NF { print $1 }' | awk '!seen[$0]++')
[ ${#nodes[@]} -gt 0 ] || die "no hosts in '$HOSTFILE'"

per_node=$((RANKS_PER_NODE * DEVICES_PER_RANK))
MODEL=${MODEL:-$per_node}
is_count "$MODEL" || die "MODEL must be a positive integer, got '$MODEL'"
[ $((per_node % MODEL)) -eq 0 ] ||
  die "MODEL=$MODEL must divide RANKS_PER_NODE x DEVICES_PER_RANK = $per_node, or model groups would span nodes"
ranks=$((${#nodes[@]} * RANKS_PER_NODE))
data=$((ranks * DEVICES_PER_RANK / MODEL))

# Absolute, so that every node finds the same path whatever its working directory.
case $APP in train_mlp | train_gpt) ;; *) die "APP must be train_mlp or train_gpt, got '$APP'" ;; esac
app=${TRAIN_MLP:-$SHARD_BUILD_DIR/apps/$APP}
[[ $app = /* ]] || app=$PWD/$app
[ -x "$app" ] || [ "$DRY_RUN" = 1 ] ||
  die "no $app: build it (cmake --preset release && cmake --build --preset release) or set SHARD_BUILD_DIR or TRAIN_MLP"

# Open MPI settings (mpirun_examples/README.md explains each). Set as defaults, so that the
# caller's environment wins; all OMPI_* variables reach every node, the -x below say so.
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1}                  # containers run as root
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}                                     # no UCX probing at start-up
export OMPI_MCA_btl=${OMPI_MCA_btl:-tcp,vader,self}                          # TCP between nodes, shared memory inside
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
if [ -n "$NET_IF" ]; then
  export OMPI_MCA_btl_tcp_if_include=$NET_IF OMPI_MCA_oob_tcp_if_include=$NET_IF
fi

map="ppr:$RANKS_PER_NODE:node"
extra=()
if [ "$OVERSUBSCRIBE" = 1 ]; then
  export OMPI_MCA_mpi_yield_when_idle=1   # ranks sharing a core must yield, or collectives take ms
  extra+=(--oversubscribe --bind-to none)
elif [ "$BIND" = 1 ]; then
  map+=":pe=$CPUS_PER_RANK"               # pe=K binds each rank to K cores of its own
  extra+=(--bind-to core)
else
  extra+=(--bind-to none)
fi
for var in $(compgen -e); do
  case $var in OMPI_MCA_* | OMPI_ALLOW_*) extra+=(-x "$var") ;; esac
done
extra+=(-x OPENBLAS_NUM_THREADS -x OMP_NUM_THREADS)

steps=(--max-steps "$MAX_STEPS")
[ "$APP" = train_mlp ] && steps=(--epochs "$EPOCHS" --max-steps "$MAX_STEPS")
cmd=(mpirun --hostfile "$HOSTFILE" -n "$ranks" --map-by "$map" "${extra[@]}"
     "$app" --devices-per-rank "$DEVICES_PER_RANK" --mesh "data=$data,model=$MODEL"
     "${steps[@]}" "$@")
echo "hostfile_example: ${#nodes[@]} node(s) (${nodes[*]}) x $RANKS_PER_NODE ranks x $DEVICES_PER_RANK devices, mesh data=$data,model=$MODEL"
echo "+ ${cmd[*]}"
[ "$DRY_RUN" = 1 ] && exit 0
exec "${cmd[@]}"
