# Compile-fail tests (label "compile_fail"), included from tests/CMakeLists.txt: each source in
# tests/compile_fail/ is a common slip (a loss returning a float, host Tensors to shard_map, ...)
# that must not compile, whose first error must name the fix (its "// expect-error: " line) and
# whose whole diagnostic stays within 20 lines (tests/compile_fail/check.sh).
file(GLOB _shard_compile_fail CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/*.cpp)
set(_shard_compile_fail_flags -I${PROJECT_SOURCE_DIR}/include)
foreach(_dir IN LISTS MPI_CXX_INCLUDE_DIRS)
  list(APPEND _shard_compile_fail_flags -isystem ${_dir})
endforeach()
foreach(_src IN LISTS _shard_compile_fail)
  get_filename_component(_name ${_src} NAME_WE)
  add_test(NAME compile_fail.${_name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/compile_fail/check.sh ${CMAKE_CXX_COMPILER} ${_src}
                   ${_shard_compile_fail_flags})
  set_tests_properties(compile_fail.${_name} PROPERTIES TIMEOUT 120 LABELS compile_fail)
endforeach()

# scripts.examples: every C++ example in README.md, docs/*.md and the headers' leading
# comments compiles (tests/check_examples.py; "// given: ..." lines name what a fragment assumes).
add_test(NAME scripts.examples
         COMMAND python3 ${CMAKE_CURRENT_SOURCE_DIR}/check_examples.py ${CMAKE_CXX_COMPILER}
                 ${CMAKE_CURRENT_BINARY_DIR}/examples ${_shard_compile_fail_flags})
set_tests_properties(scripts.examples PROPERTIES TIMEOUT 300 LABELS scripts)
