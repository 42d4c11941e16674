# Small helpers that give every component the same shape:
#
#   slicesched_library(NAME gmg SRCS a.cc b.cc DEPS slicesched::common absl::status)
#     -> static library slicesched_gmg, alias slicesched::gmg, public headers
#        from include/, private headers from src/.
#   slicesched_test(NAME gmg_test SRCS test.cc DEPS slicesched::gmg [LABELS l])
#     -> gtest executable registered with ctest (one ctest entry per test case).
#   slicesched_benchmark(NAME gmg_bench SRCS bench.cc DEPS slicesched::gmg)
#     -> Google Benchmark executable (not run by ctest).

function(slicesched_apply_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter
                                           -Wno-missing-field-initializers)
  if(SLICESCHED_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()

function(slicesched_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;PRIVATE_DEPS" ${ARGN})
  set(target slicesched_${ARG_NAME})
  add_library(${target} STATIC ${ARG_SRCS})
  add_library(slicesched::${ARG_NAME} ALIAS ${target})
  target_include_directories(${target}
    PUBLIC ${PROJECT_SOURCE_DIR}/include
    PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
  slicesched_apply_warnings(${target})
endfunction()

function(slicesched_test)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS;LABELS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src
                                                 ${PROJECT_SOURCE_DIR}/tests)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  slicesched_apply_warnings(${ARG_NAME})
  set(labels ${ARG_LABELS})
  if(NOT labels)
    set(labels unit)
  endif()
  gtest_discover_tests(${ARG_NAME}
    WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
    PROPERTIES LABELS "${labels}"
               ENVIRONMENT "SLICESCHED_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
    DISCOVERY_TIMEOUT 60)
endfunction()

function(slicesched_benchmark)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} benchmark::benchmark)
  slicesched_apply_warnings(${ARG_NAME})
endfunction()

# Embeds a text file into a generated C++ source as a std::string_view.
#   slicesched_embed_text(OUT_VAR var FILE path SYMBOL kName NAMESPACE ns)
function(slicesched_embed_text)
  cmake_parse_arguments(ARG "" "OUT_VAR;FILE;SYMBOL;NAMESPACE" "" ${ARGN})
  get_filename_component(base ${ARG_FILE} NAME_WE)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/embedded_${ARG_SYMBOL}.cc)
  file(READ ${ARG_FILE} content)
  set(delim "SLICESCHED_EMBED")
  file(GENERATE OUTPUT ${out} CONTENT
"// Generated from ${ARG_FILE}; do not edit.
#include <string_view>
namespace ${ARG_NAMESPACE} {
extern const std::string_view ${ARG_SYMBOL};
const std::string_view ${ARG_SYMBOL} = R\"${delim}(${content})${delim}\";
}  // namespace ${ARG_NAMESPACE}
")
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${ARG_FILE})
  set(${ARG_OUT_VAR} ${out} PARENT_SCOPE)
endfunction()
