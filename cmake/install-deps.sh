#!/usr/bin/env bash
# Installs the Debian packages Shard needs to build, test and run, if any is missing
# (apt-get; sudo when not root). Extra package names given as arguments are added.
# On a system without apt-get it only lists what it would need.
set -euo pipefail

packages=(
  cmake g++ ninja-build pkg-config
  openmpi-bin libopenmpi-dev            # Open MPI: mpirun, MPI::MPI_CXX
  libopenblas-dev                       # BLAS (OpenBLAS) for local block products
  libscalapack-openmpi-dev              # ScaLAPACK + BLACS on Open MPI
  libdnnl-dev                           # oneDNN: bfloat16 products (matmul, bf16 in, float32 accumulation)
  libboost-program-options-dev          # the apps' command lines
  libgtest-dev                          # the tests
  zlib1g-dev                            # train_mlp reads the gzipped IDX files
  dataset-fashion-mnist                 # train_mlp's default data set
  fortunes                              # train_gpt's text (/usr/share/games/fortunes)
  python3-numpy                         # tests check that numpy.load reads Shard's .npy files
  shellcheck                            # the scripts.lint test
  iproute2                              # ip: the multinode tests look up network interfaces
  slurmctld slurmd munge                # Slurm 22.05 (and slurm-client) for the multinode.slurm test
  clang libclang-rt-14-dev              # clang and libFuzzer for the parser fuzz targets (tests/fuzz.sh)
  clang-format                          # the scripts.format test (tests/check_format.sh)
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-deps: no apt-get here; please install the equivalents of: ${missing[*]}" >&2
  exit 0
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
