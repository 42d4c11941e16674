# Every dependency is found through CMake's own find_package or pkg-config;
# no path is hard-coded. tools/bootstrap installs the Debian packages.

find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(spdlog CONFIG REQUIRED)
find_package(yaml-cpp CONFIG REQUIRED)
find_package(GTest CONFIG REQUIRED)
find_package(benchmark CONFIG REQUIRED)
find_package(SQLite3 REQUIRED)
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
pkg_check_modules(CBC REQUIRED IMPORTED_TARGET cbc)
# Text prompts of batch jobs (jobs/tokenizer.h); Debian libsentencepiece-dev.
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)

# gRPC's C++ code generator plugin.
find_program(SLICESCHED_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# LibTorch: only executor/ may use it (each TU including it costs ~40 s).
# It comes from the PyPI torch wheel (a CUDA build that also runs CPU tensors
# without a GPU or driver), installed by tools/bootstrap into the project's
# .venv; a GPU machine points SLICESCHED_TORCH_PYTHON at its own interpreter.
# Protobuf and gRPC are found above, before Torch: Caffe2's config would
# otherwise alias protobuf::libprotobuf to the copy bundled in the wheel.
option(SLICESCHED_WITH_TORCH "Build the LibTorch executors" ON)
set(SLICESCHED_TORCH_VERSION "2.11.0" CACHE STRING "The torch wheel version the build expects")
set(SLICESCHED_TORCH_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python3"
    CACHE FILEPATH "The Python interpreter whose torch package provides LibTorch")
if(SLICESCHED_WITH_TORCH)
  if(NOT EXISTS "${SLICESCHED_TORCH_PYTHON}")
    message(FATAL_ERROR "slicesched: no Python at SLICESCHED_TORCH_PYTHON=${SLICESCHED_TORCH_PYTHON}; "
                        "run tools/bootstrap (it installs torch==${SLICESCHED_TORCH_VERSION} into .venv), "
                        "or configure with -DSLICESCHED_WITH_TORCH=OFF")
  endif()
  execute_process(
    COMMAND "${SLICESCHED_TORCH_PYTHON}" -c
            "import torch, torch.utils, os; print(torch.__version__); print(torch.utils.cmake_prefix_path); print(os.path.dirname(os.path.dirname(torch.__file__)))"
    OUTPUT_VARIABLE _torch_out ERROR_VARIABLE _torch_err RESULT_VARIABLE _torch_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _torch_rc EQUAL 0)
    message(FATAL_ERROR "slicesched: ${SLICESCHED_TORCH_PYTHON} cannot import torch: ${_torch_err}"
                        "run tools/bootstrap")
  endif()
  string(REPLACE "\n" ";" _torch_out "${_torch_out}")
  list(GET _torch_out 0 SLICESCHED_TORCH_FOUND_VERSION)
  list(GET _torch_out 1 _torch_prefix)
  list(GET _torch_out 2 SLICESCHED_TORCH_SITE_PACKAGES)
  if(NOT SLICESCHED_TORCH_FOUND_VERSION MATCHES "^${SLICESCHED_TORCH_VERSION}")
    message(FATAL_ERROR "slicesched: torch ${SLICESCHED_TORCH_FOUND_VERSION} at ${SLICESCHED_TORCH_PYTHON}; "
                        "the build expects ${SLICESCHED_TORCH_VERSION} (run tools/bootstrap)")
  endif()
  # The torch folder first, so its lib/ (libc10.so, ...) is searched before
  # the system's.
  list(PREPEND CMAKE_PREFIX_PATH "${_torch_prefix}" "${SLICESCHED_TORCH_SITE_PACKAGES}/torch")
  # Torch 2.11's CUDA config no longer asks for CUDA::nvToolsExt (gone since
  # CUDA 12), so no alias to CUDA::nvtx3 is needed. TORCH_LIBRARY is only
  # Torch's found-check; pin it to the wheel so no other libtorch.so is named.
  set(TORCH_LIBRARY "${SLICESCHED_TORCH_SITE_PACKAGES}/torch/lib/libtorch.so" CACHE FILEPATH "" FORCE)
  # Torch's config enables the CUDA language and would try-run a program to
  # find the installed GPUs; slicesched compiles no CUDA sources, so name the
  # target architecture (Hopper) and a dialect CMake knows for nvcc.
  set(CMAKE_CUDA_STANDARD 17)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    enable_language(CUDA)
    unset(CMAKE_CUDA_ARCHITECTURES CACHE)  # Torch reads TORCH_CUDA_ARCH_LIST only
  endif()
  if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)
    set(TORCH_CUDA_ARCH_LIST "9.0")
  endif()
  find_package(Torch CONFIG REQUIRED)
  # The wheel's libtorch.so and libtorch_cpu.so export a copy of
  # std::filesystem (from the static parts of their build compiler's
  # libstdc++), without symbol versions, so they satisfy our programs'
  # references to the system libstdc++'s. That copy crashes when called from
  # outside torch (std::filesystem::remove_all jumps to a null pointer). The
  # dynamic linker takes the first definition in NEEDED order, so every binary
  # names libstdc++ before any torch library.
  add_link_options("SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")
  message(STATUS "slicesched: LibTorch ${SLICESCHED_TORCH_FOUND_VERSION} from ${SLICESCHED_TORCH_SITE_PACKAGES}")
endif()

# CUDA and NCCL are optional: found -> the GPU transfer backend is built.
# With LibTorch, NCCL and the CUDA runtime are the wheel's own (its nvidia/
# packages): the process then loads the one libnccl and libcudart that
# libtorch_cuda loads, never a second copy from the toolkit.
option(SLICESCHED_WITH_CUDA "Build CUDA/NCCL code paths when the toolkit is found" ON)
set(SLICESCHED_HAVE_CUDA OFF)
if(SLICESCHED_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    if(SLICESCHED_WITH_TORCH)
      set(_nvidia "${SLICESCHED_TORCH_SITE_PACKAGES}/nvidia")
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS "${_nvidia}/nccl/include" NO_DEFAULT_PATH)
      find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS "${_nvidia}/nccl/lib" NO_DEFAULT_PATH)
      find_library(SLICESCHED_CUDART_LIBRARY NAMES cudart libcudart.so.13 HINTS "${_nvidia}/cu13/lib" NO_DEFAULT_PATH)
      set(_cudart ${SLICESCHED_CUDART_LIBRARY} CUDA::toolkit)
    else()
      find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
      find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
      set(_cudart CUDA::cudart)
    endif()
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(SLICESCHED_HAVE_CUDA ON)
      add_library(slicesched_nccl INTERFACE)
      target_include_directories(slicesched_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(slicesched_nccl INTERFACE ${NCCL_LIBRARY} ${_cudart})
      add_library(slicesched::nccl ALIAS slicesched_nccl)
    endif()
  endif()
endif()
message(STATUS "slicesched: CUDA ${CUDAToolkit_VERSION} + NCCL found: ${SLICESCHED_HAVE_CUDA} (${NCCL_LIBRARY})")

# yaml-cpp 0.7 (Debian 12) exports a plain `yaml-cpp` target; newer releases
# export yaml-cpp::yaml-cpp. Accept either.
if(NOT TARGET yaml-cpp::yaml-cpp AND TARGET yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()
