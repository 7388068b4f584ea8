# shard_add_mpi_test(<target> [RANKS n...] [DEVICES k...] [TIMEOUT s] [ARGS a...] [ENV VAR=value...]
#                    [SUFFIX s])
#
# Registers the test binary <target> under mpiexec once per (rank count, devices per rank)
# pair, as ctest tests named <target>.np<n>.dpr<k>, each with a TIMEOUT (a deadlock is a
# failure, never a stuck run) and the Open MPI settings this project needs:
#   - running as root is allowed, and more ranks than cores (--oversubscribe);
#   - mpi_yield_when_idle=1: oversubscribed ranks yield instead of spinning (without it a
#     collective took ~8 ms instead of ~5 us here);
#   - pml ob1 (no UCX probing: start-up 0.33 s -> 0.12 s), no single-copy mechanism in
#     vader (1.2-2.4x faster 64 KiB-16 MiB transfers here);
#   - one OpenBLAS thread per process;
#   - SHARD_CHECK_COLLECTIVES=1: every collective is checked for consistency across ranks.

set(SHARD_TEST_RANKS 1 2 3 4 CACHE STRING "Rank counts every MPI test runs at")
set(SHARD_TEST_DEVICES 1 2 CACHE STRING "Devices per rank every MPI test runs at")

set(SHARD_MPIEXEC_FLAGS "")
execute_process(COMMAND ${MPIEXEC_EXECUTABLE} --version OUTPUT_VARIABLE _shard_mpiexec_version ERROR_QUIET)
if(_shard_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(SHARD_MPIEXEC_FLAGS --oversubscribe)
endif()

set(SHARD_MPI_TEST_ENV
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_pml=ob1
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  OMPI_MCA_rmaps_base_oversubscribe=1
  OPENBLAS_NUM_THREADS=1
  SHARD_CHECK_COLLECTIVES=1)

function(shard_add_mpi_test target)
  cmake_parse_arguments(ARG "" "TIMEOUT;SUFFIX" "RANKS;DEVICES;ARGS;ENV" ${ARGN})
  if(NOT ARG_RANKS)
    set(ARG_RANKS ${SHARD_TEST_RANKS})
  endif()
  if(NOT ARG_DEVICES)
    set(ARG_DEVICES ${SHARD_TEST_DEVICES})
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 120)
  endif()
  foreach(n IN LISTS ARG_RANKS)
    foreach(k IN LISTS ARG_DEVICES)
      set(name ${target}${ARG_SUFFIX}.np${n}.dpr${k})
      # Each test its own Open MPI session folder: two mpiexec of `ctest -j` starting at once
      # otherwise race to create /tmp/ompi.<host>.<uid> ("mkdir ... File exists", orte_init fails).
      # A short path: PMIx puts its Unix sockets there (108-byte limit).
      get_property(_shard_test_no GLOBAL PROPERTY SHARD_MPI_TEST_COUNT)
      if(NOT _shard_test_no)
        set(_shard_test_no 0)
      endif()
      math(EXPR _shard_test_no "${_shard_test_no} + 1")
      set_property(GLOBAL PROPERTY SHARD_MPI_TEST_COUNT ${_shard_test_no})
      string(MD5 _shard_build_tag "${CMAKE_BINARY_DIR}")
      string(SUBSTRING "${_shard_build_tag}" 0 6 _shard_build_tag)
      add_test(NAME ${name}
        COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${SHARD_MPIEXEC_FLAGS} ${MPIEXEC_PREFLAGS}
                $<TARGET_FILE:${target}> ${MPIEXEC_POSTFLAGS} ${ARG_ARGS})
      set_tests_properties(${name} PROPERTIES
        TIMEOUT ${ARG_TIMEOUT}
        LABELS "mpi"
        ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k};OMPI_MCA_orte_tmpdir_base=/tmp/shard-${_shard_build_tag}-${_shard_test_no};${ARG_ENV}")
    endforeach()
  endforeach()
endfunction()
