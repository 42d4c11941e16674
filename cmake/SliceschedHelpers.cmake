# Small helpers that give every component the same shape:
#
#   slicesched_library(NAME gmg SRCS a.cc b.cc DEPS slicesched::common absl::status)
#     -> static library slicesched_gmg, alias slicesched::gmg, exporting only
#        its own public headers (include/slicesched/gmg/), private headers
#        beside its sources.
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

# The public headers a library exports, as symbolic links under
# build/hdrs/<target>/slicesched/..., so its consumers see exactly those
# headers and no others: an include of a header from a component that is not
# among a target's (transitive) dependencies fails to compile. HDRS lists
# headers relative to include/slicesched/; HDRS_DIR adds every header of one
# folder there (the default: the folder named like the library).
# SOURCE_HDRS names headers beside the library's sources that its dependants
# may include under slicesched/<first HDRS_DIR>/: the LibTorch headers that
# the torch libraries of executor/ share. They stay out of include/, and
# LibTorch's own include directories reach only the libraries that link it
# privately, so a component outside executor/ cannot compile them.
function(_slicesched_export_headers target)
  cmake_parse_arguments(ARG "" "" "HDRS;HDRS_DIR;SOURCE_HDRS" ${ARGN})
  set(root ${PROJECT_SOURCE_DIR}/include/slicesched)
  set(headers ${ARG_HDRS})
  foreach(dir ${ARG_HDRS_DIR})
    file(GLOB found CONFIGURE_DEPENDS RELATIVE ${root} ${root}/${dir}/*.h)
    if(NOT found)
      message(FATAL_ERROR "${target}: no headers in include/slicesched/${dir}")
    endif()
    list(APPEND headers ${found})
  endforeach()
  set(out ${CMAKE_BINARY_DIR}/hdrs/${target})
  file(REMOVE_RECURSE ${out})
  foreach(h ${headers})
    if(NOT EXISTS ${root}/${h})
      message(FATAL_ERROR "${target}: header include/slicesched/${h} does not exist")
    endif()
    get_filename_component(dir ${out}/slicesched/${h} DIRECTORY)
    file(MAKE_DIRECTORY ${dir})
    file(CREATE_LINK ${root}/${h} ${out}/slicesched/${h} SYMBOLIC)
  endforeach()
  if(ARG_SOURCE_HDRS)
    list(GET ARG_HDRS_DIR 0 dir)
    file(MAKE_DIRECTORY ${out}/slicesched/${dir})
    foreach(h ${ARG_SOURCE_HDRS})
      if(NOT EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/${h})
        message(FATAL_ERROR "${target}: source header ${h} does not exist")
      endif()
      file(CREATE_LINK ${CMAKE_CURRENT_SOURCE_DIR}/${h} ${out}/slicesched/${dir}/${h} SYMBOLIC)
    endforeach()
  endif()
  set_property(GLOBAL APPEND PROPERTY SLICESCHED_EXPORTED_HEADERS ${headers})
  set(${target}_HDRS_ROOT ${out} PARENT_SCOPE)
endfunction()

#   slicesched_library(NAME gmg SRCS a.cc DEPS ... [PRIVATE_DEPS ...]
#                      [HDRS dir/a.h ...] [HDRS_DIR dir ...] [SOURCE_HDRS a.h ...]
#                      [INTERFACE])
# A static library (an INTERFACE library with INTERFACE and no SRCS) whose
# private headers are those beside its sources.
function(slicesched_library)
  cmake_parse_arguments(ARG "INTERFACE" "NAME" "SRCS;DEPS;PRIVATE_DEPS;HDRS;HDRS_DIR;SOURCE_HDRS" ${ARGN})
  set(target slicesched_${ARG_NAME})
  if(NOT ARG_HDRS AND NOT ARG_HDRS_DIR AND IS_DIRECTORY ${PROJECT_SOURCE_DIR}/include/slicesched/${ARG_NAME})
    set(ARG_HDRS_DIR ${ARG_NAME})
  endif()
  _slicesched_export_headers(${target} HDRS ${ARG_HDRS} HDRS_DIR ${ARG_HDRS_DIR} SOURCE_HDRS ${ARG_SOURCE_HDRS})
  if(ARG_INTERFACE)
    add_library(${target} INTERFACE)
    target_include_directories(${target} INTERFACE ${${target}_HDRS_ROOT})
    target_link_libraries(${target} INTERFACE ${ARG_DEPS})
  else()
    add_library(${target} STATIC ${ARG_SRCS})
    target_include_directories(${target}
      PUBLIC ${${target}_HDRS_ROOT}
      PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
    target_link_libraries(${target} PUBLIC ${ARG_DEPS} PRIVATE ${ARG_PRIVATE_DEPS})
    slicesched_apply_warnings(${target})
  endif()
  add_library(slicesched::${ARG_NAME} ALIAS ${target})
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
