# shellcheck shell=bash
# Sourced by the scripts: the Open MPI settings this project runs with on one machine.
# Each is explained in mpirun_examples/README.md.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1   # containers and CI run as root
export OMPI_MCA_rmaps_base_oversubscribe=1                         # more ranks than cores
export OMPI_MCA_mpi_yield_when_idle=1                              # oversubscribed ranks must yield
export OMPI_MCA_pml=ob1                                            # no UCX probing at start-up
export OMPI_MCA_btl_vader_single_copy_mechanism=none               # faster shared-memory copies here
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
