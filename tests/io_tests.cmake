# .npy IO and checkpoints: every rank count and devices per rank of the default matrix.
shard_mpi_test_binary(test_io mpi/test_io.cpp)
shard_add_mpi_test(test_io TIMEOUT 120)

shard_mpi_test_binary(test_checkpoint mpi/test_checkpoint.cpp)
shard_add_mpi_test(test_checkpoint TIMEOUT 120)

# Open MPI has two MPI-IO components that fail differently (OMPIO, the default, can drop a
# write error; ROMIO reports it but keeps stale datatype state): run both suites under ROMIO too.
find_program(SHARD_OMPI_INFO ompi_info)
if(SHARD_OMPI_INFO)
  execute_process(COMMAND ${SHARD_OMPI_INFO} OUTPUT_VARIABLE _shard_ompi_info ERROR_QUIET)
  if(_shard_ompi_info MATCHES "MCA io: romio")
    string(REGEX MATCH "MCA io: (romio[0-9]*)" _ "${_shard_ompi_info}")
    foreach(t test_io test_checkpoint)
      foreach(cfg "1;2" "3;1" "4;2")
        list(GET cfg 0 n)
        list(GET cfg 1 k)
        add_test(NAME ${t}.romio.np${n}.dpr${k}
                 COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${SHARD_MPIEXEC_FLAGS} $<TARGET_FILE:${t}>)
        set_tests_properties(${t}.romio.np${n}.dpr${k} PROPERTIES TIMEOUT 120 LABELS "mpi"
          ENVIRONMENT "${SHARD_MPI_TEST_ENV};SHARD_DEVICES_PER_RANK=${k};OMPI_MCA_io=${CMAKE_MATCH_1}")
      endforeach()
    endforeach()
  endif()
endif()
