# Bad command lines for every app: an unknown flag, a malformed or mismatched mesh or spec,
# zero or negative sizes. Each runs at 2 ranks under mpiexec with a TIMEOUT and passes only
# if the job exits non-zero with the message (tests/expect_failure.sh). The regexes match
# "[rank 1] error: ...": the check ran on a rank other than 0 too (every rank parses the same
# argv and raises the same error; apps::run_app lets every rank print before any exits).
# Errors of the Runtime's start-up (--devices-per-rank) come before run_app's body and end in
# guarded_main's MPI_Abort, so those match the message from whichever rank printed first.
if(SHARD_BUILD_APPS)
  set(_shard_app_fail ${CMAKE_CURRENT_SOURCE_DIR}/expect_failure.sh)
  set(_shard_app_run ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 2 ${SHARD_MPIEXEC_FLAGS})

  # shard_app_error(<name> <regex> <app> [args...]): test app.error.<name>.
  function(shard_app_error name regex app)
    add_test(NAME app.error.${name}
             COMMAND ${_shard_app_fail} "rank 1\\] error: ${regex}" ${_shard_app_run} $<TARGET_FILE:${app}> ${ARGN})
    set_tests_properties(app.error.${name} PROPERTIES TIMEOUT 60 LABELS "mpi;app"
                         ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
  endfunction()

  function(shard_app_startup_error name regex app)
    add_test(NAME app.error.${name}
             COMMAND ${_shard_app_fail} "\\] error: ${regex}" ${_shard_app_run} $<TARGET_FILE:${app}> ${ARGN})
    set_tests_properties(app.error.${name} PROPERTIES TIMEOUT 60 LABELS "mpi;app"
                         ENVIRONMENT "${SHARD_MPI_TEST_ENV}")
  endfunction()

  set(_bad_flag "bad command line: unrecognised option '--no-such-flag'")

  # shard_info
  shard_app_error(info_bad_flag "${_bad_flag}" shard_info --no-such-flag)
  shard_app_error(info_positional "bad command line: too many positional options" shard_info devices-per-rank)
  shard_app_startup_error(info_zero_devices "devices per rank from --devices-per-rank must be an integer in \\[1, 4096\\], got '0'"
                  shard_info --devices-per-rank 0)
  shard_app_startup_error(info_negative_devices "devices per rank from --devices-per-rank must be an integer in \\[1, 4096\\], got '-2'"
                  shard_info --devices-per-rank=-2)

  # sharding_tour (app.error.bad_flag, bad_spec, unknown_axis and wrong_device_count are in CMakeLists.txt)
  shard_app_error(tour_size_zero "--size must be >= 1, got 0" sharding_tour --devices-per-rank 4 --size 0)
  shard_app_error(tour_size_negative "--size must be >= 1, got -3" sharding_tour --devices-per-rank 4 --size=-3)
  shard_app_error(tour_size_malformed "bad command line: the argument \\('12q'\\) for option '--size' is invalid"
                  sharding_tour --size 12q)

  # collectives_bench
  shard_app_error(coll_bad_flag "${_bad_flag}" collectives_bench --no-such-flag)
  shard_app_error(coll_bad_mesh "bad --mesh '2x': write the shape like 4x2" collectives_bench --mesh 2x)
  shard_app_error(coll_mesh_devices "--mesh 2x2 has 4 devices, but the job has 2" collectives_bench --mesh 2x2)
  shard_app_error(coll_zero_size "bad size '0'" collectives_bench --sizes 8,0)
  shard_app_error(coll_negative_size "bad size '-8'" collectives_bench --sizes=-8)
  shard_app_error(coll_fraction_size "bad size '0.5'" collectives_bench --sizes 0.5)
  shard_app_error(coll_no_sizes "--sizes ',' names no size" collectives_bench --sizes ,)
  shard_app_error(coll_negative_repeats "--repeats must be >= 0 \\(0: by size\\), got -1" collectives_bench --repeats=-1)
  shard_app_error(coll_unknown_axis "unknown mesh axis 'zz'" collectives_bench --sizes 8 --axes zz)
  shard_app_error(coll_unknown_collective "--collectives 'bcast': choose psum, all_gather" collectives_bench --sizes 8 --collectives psum,bcast)
  shard_app_error(coll_dtype "--dtype 'f16': choose float32, float64, int32 or int64" collectives_bench --sizes 8 --dtype f16)

  # reshard_bench
  shard_app_error(reshard_bad_flag "${_bad_flag}" reshard_bench --no-such-flag)
  shard_app_error(reshard_bad_mesh "bad --mesh '0x2'" reshard_bench --mesh 0x2)
  shard_app_error(reshard_mesh_devices "--mesh 2x2 has 4 devices, but the job has 2" reshard_bench --mesh 2x2)
  shard_app_error(reshard_mesh_axes "--mesh 1x1x1x2: reshard_bench takes a mesh of 1 to 3 axes, got 4"
                  reshard_bench --mesh 1x1x1x2)
  shard_app_error(reshard_size "--size must be >= 2, got 1" reshard_bench --size 1)
  shard_app_error(reshard_negative_size "--size must be >= 2, got -4" reshard_bench --size=-4)
  shard_app_error(reshard_repeats "--repeats must be >= 1, got 0" reshard_bench --repeats 0)

  # elementwise_bench
  shard_app_error(elem_bad_flag "${_bad_flag}" elementwise_bench --no-such-flag)
  shard_app_error(elem_zero_n "--n must be >= 1, got 0" elementwise_bench --n 0)
  shard_app_error(elem_negative_n "--n must be >= 1, got -5" elementwise_bench --n=-5)
  shard_app_error(elem_malformed_n "bad command line: the argument \\('1M'\\) for option '--n' is invalid" elementwise_bench --n 1M)
  shard_app_error(elem_repeats "--repeats must be >= 1, got 0" elementwise_bench --repeats 0)

  # jit_bench
  shard_app_error(jit_bad_flag "${_bad_flag}" jit_bench --no-such-flag)
  shard_app_error(jit_zero_n "--n must be >= 1, got 0" jit_bench --n 0)
  shard_app_error(jit_ops "--ops must be >= 1, got 0" jit_bench --ops 0)
  shard_app_error(jit_small "--small must be >= 1, got -3" jit_bench --small=-3)

  # matmul_bench (cannon_not_square, mesh, sizes and algorithm are in CMakeLists.txt)
  shard_app_error(matmul_bad_flag "${_bad_flag}" matmul_bench --no-such-flag)
  shard_app_error(matmul_bad_mesh "bad --mesh '2by1'" matmul_bench --mesh 2by1)
  shard_app_error(matmul_trailing_mesh "bad --mesh '1x2x'" matmul_bench --mesh 1x2x)
  shard_app_error(matmul_negative_size "bad --n '-64': write sizes like 1024,4096" matmul_bench --n=-64)
  shard_app_error(matmul_repeats "--repeats must be >= 1, got 0" matmul_bench --n 64 --repeats 0)
  shard_app_error(matmul_panel "--summa-panel must be >= 0 \\(0: 256\\), got -1" matmul_bench --n 64 --summa-panel=-1)
  shard_app_error(matmul_dtype "--dtype 'int8': choose float64, f64, double, float32, f32 or float" matmul_bench --n 64 --dtype int8)

  # train_mlp (train_mesh, train_batch, train_hidden and train_data_dir are in CMakeLists.txt)
  set(_tiny --dataset synthetic --layers 16,8,4 --epochs 1)
  shard_app_error(train_bad_flag "${_bad_flag}" train_mlp ${_tiny} --no-such-flag)
  shard_app_error(train_bad_mesh "bad --mesh 'data=two': write it like data=4,model=2" train_mlp ${_tiny} --mesh data=two)
  shard_app_error(train_negative_batch "--batch must be >= 1, got -16" train_mlp ${_tiny} --samples 64 --batch=-16)
  shard_app_error(train_zero_samples "--samples must be >= 1, got 0" train_mlp ${_tiny} --batch 16 --samples 0)
  shard_app_error(train_zero_layer "bad --layers '16,0,4'" train_mlp --dataset synthetic --epochs 1 --layers 16,0,4)
  shard_app_error(train_one_layer "--layers needs at least an input and an output size"
                  train_mlp --dataset synthetic --epochs 1 --layers 16)
  shard_app_error(train_negative_lr "--lr must be a finite number > 0, got -1" train_mlp ${_tiny} --lr=-1)
  shard_app_error(train_log_every "--log-every must be >= 0, got -1" train_mlp ${_tiny} --log-every=-1)
  # Impossible sizes: a clear error on every rank (never a heap corruption or a hang); the
  # TIMEOUT is 10 s here, the bound the issue sets.
  foreach(case "elementwise_huge;array creation: shape \\(4611686018427387904,\\) needs more bytes than int64 can count;elementwise_bench;--n;4611686018427387904"
               "matmul_huge;array creation: shape \\(3037000500, 3037000500\\) has more elements than int64 can count;matmul_bench;--n;3037000500"
               "reshard_huge;array creation: shape \\(3037000500, 3037000500\\) has more elements than int64 can count;reshard_bench;--size;3037000500"
               "train_huge_layer;cannot allocate 194368032000 bytes for a float32\\(16, 3037000500\\) array;train_mlp;--dataset;synthetic;--layers;16,3037000500,4;--samples;64;--batch;16;--epochs;1"
               "train_huge_samples;Tensor: shape \\(4611686018427387904, 16\\) has more elements than int64;train_mlp;--dataset;synthetic;--layers;16,8,4;--samples;4611686018427387904;--batch;16;--epochs;1")
    list(GET case 0 name)
    list(GET case 1 regex)
    list(GET case 2 app)
    list(SUBLIST case 3 -1 args)
    shard_app_error(${name} "${regex}" ${app} ${args})
    set_tests_properties(app.error.${name} PROPERTIES TIMEOUT 10)
  endforeach()
endif()
