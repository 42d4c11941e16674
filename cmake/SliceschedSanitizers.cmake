# Sanitizer builds, for every target of the project:
#
#   cmake -S . -B build-asan -DSLICESCHED_SANITIZE=address
#       AddressSanitizer + LeakSanitizer + UndefinedBehaviorSanitizer, with
#       float-cast-overflow (a double out of an integer's range cast to it),
#       which GCC's -fsanitize=undefined leaves out
#   cmake -S . -B build-tsan -DSLICESCHED_SANITIZE=thread
#       ThreadSanitizer
#
# Use a separate build directory per sanitizer. Run the tests as usual
# (ctest or the test binaries); a finding aborts the test with a report.
set(SLICESCHED_SANITIZE "" CACHE STRING "Sanitizer build: '', 'address' (ASan+LSan+UBSan) or 'thread'")
set_property(CACHE SLICESCHED_SANITIZE PROPERTY STRINGS "" address thread)

if(SLICESCHED_SANITIZE STREQUAL "address")
  set(_slicesched_san_flags -fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer
                            -fno-sanitize-recover=undefined,float-cast-overflow)
elseif(SLICESCHED_SANITIZE STREQUAL "thread")
  set(_slicesched_san_flags -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT SLICESCHED_SANITIZE STREQUAL "")
  message(FATAL_ERROR "SLICESCHED_SANITIZE must be '', 'address' or 'thread', not '${SLICESCHED_SANITIZE}'")
endif()

if(DEFINED _slicesched_san_flags)
  message(STATUS "slicesched: sanitizer build (${SLICESCHED_SANITIZE}): ${_slicesched_san_flags}")
  add_compile_options(${_slicesched_san_flags})
  add_link_options(${_slicesched_san_flags})
endif()
