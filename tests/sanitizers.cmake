# Sanitizer runs (the `asan` preset: -fsanitize=address,undefined, see CMakePresets.json).
# Included from tests/CMakeLists.txt after the test files it includes: when the build is
# instrumented, every test registered so far gets the sanitizer environment, so a plain `ctest`
# in build/asan behaves as `ctest --preset asan` does (which only selects the 2-rank MPI tests).
#   ASAN_OPTIONS   detect_leaks=1: LeakSanitizer at exit. halt_on_error=1, exitcode=1: the first
#                  error ends the rank non-zero, so mpiexec fails the test and ends the other
#                  ranks; abort_on_error=0: no core dumps. fast_unwind_on_malloc=0: full
#                  allocation stacks through Open MPI, which has no frame pointers (see
#                  tests/sanitizers/lsan.supp). Also use-after-return and init-order checks.
#   LSAN_OPTIONS   tests/sanitizers/lsan.supp: Open MPI's (and BLACS's) own allocations that
#                  live until exit. Never Shard's: a leak with a Shard frame must be fixed.
#   UBSAN_OPTIONS  a stack trace for every report and stop at the first (the build also has
#                  -fno-sanitize-recover=undefined, so the rank exits non-zero). No suppressions:
#                  only Shard and the tests are instrumented, Open MPI is not.
# And every test fails on a sanitizer's SUMMARY line, also those passed by a regex on their
# output (PASS_REGULAR_EXPRESSION ignores the exit code) or expected to fail (expect_failure.sh).
if(NOT CMAKE_CXX_FLAGS MATCHES "-fsanitize=[^ ]*(address|undefined)")
  return()
endif()

set(SHARD_SANITIZER_ENV
  "ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:abort_on_error=0:exitcode=1:fast_unwind_on_malloc=0:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
  "LSAN_OPTIONS=suppressions=${CMAKE_CURRENT_SOURCE_DIR}/sanitizers/lsan.supp:print_suppressions=0"
  "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1")

get_property(_shard_sanitizer_tests DIRECTORY PROPERTY TESTS)
if(_shard_sanitizer_tests)
  set_property(TEST ${_shard_sanitizer_tests} APPEND PROPERTY ENVIRONMENT ${SHARD_SANITIZER_ENV})
  set_property(TEST ${_shard_sanitizer_tests} APPEND PROPERTY FAIL_REGULAR_EXPRESSION
               "SUMMARY: (Address|Leak|UndefinedBehavior)Sanitizer")
endif()
