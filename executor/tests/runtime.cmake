# Tests of the torch-free executor runtime (included from executor/CMakeLists.txt).
slicesched_test(NAME executor_runtime_test SRCS ${CMAKE_CURRENT_LIST_DIR}/runtime_test.cc
  DEPS slicesched::executor_runtime slicesched::sim LABELS unit executor)
set_target_properties(executor_runtime_test PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/tests)
