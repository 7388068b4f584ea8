# The seed programs (mpirun_examples/seeds/) under mpiexec on the tutorials' 8 devices, their
# printed values and layouts checked against the seeds where the seeds determine them
# (mpirun_examples/seeds/expected/*.txt, lines that must appear in order).
if(SHARD_BUILD_APPS)
  set(_seed_dir ${PROJECT_SOURCE_DIR}/mpirun_examples/seeds)
  foreach(cfg "seed_000_parallelism;2;4" "seed_000_parallelism;4;2" "seed_001_distributed_arrays;2;4"
              "seed_001_distributed_arrays;8;1" "seed_002_collectives;2;4" "seed_003_pmap;3;1" "seed_003_pmap;2;2"
              "seed_004_sharded_matrices;2;4" "seed_004_sharded_matrices;4;2" "seed_001_mlp_training;2;4"
              "seed_001_mlp_training;8;1" "seed_004_training_loop;2;4" "seed_004_training_loop;4;2")
    list(GET cfg 0 seed)
    list(GET cfg 1 n)
    list(GET cfg 2 k)
    if(TARGET ${seed})
      add_test(NAME seeds.${seed}.np${n}.dpr${k}
               COMMAND ${_seed_dir}/check_output.sh ${_seed_dir}/expected/${seed}.txt
                       ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${SHARD_MPIEXEC_FLAGS}
                       $<TARGET_FILE:${seed}> --devices-per-rank ${k})
      set_tests_properties(seeds.${seed}.np${n}.dpr${k} PROPERTIES TIMEOUT 180 LABELS "mpi;seeds"
                           ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
    endif()
  endforeach()
endif()

# The README's first program, as a newcomer runs it (2 ranks x 2 devices).
if(TARGET first_program)
  add_test(NAME examples.first_program.np2.dpr2
           COMMAND ${PROJECT_SOURCE_DIR}/mpirun_examples/seeds/check_output.sh
                   ${PROJECT_SOURCE_DIR}/mpirun_examples/seeds/expected/first_program.txt
                   ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS}
                   $<TARGET_FILE:first_program> --devices-per-rank 2)
  set_tests_properties(examples.first_program.np2.dpr2 PROPERTIES TIMEOUT 120 LABELS "mpi;seeds"
                       ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
endif()
