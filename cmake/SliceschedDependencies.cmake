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

# gRPC's C++ code generator plugin.
find_program(SLICESCHED_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

# LibTorch: only executor/ may use it (each TU including it costs ~40 s).
option(SLICESCHED_WITH_TORCH "Build the LibTorch executors" ON)
if(SLICESCHED_WITH_TORCH)
  find_package(Torch CONFIG REQUIRED)
endif()

# CUDA and NCCL are optional: found -> the GPU transfer backend is built.
option(SLICESCHED_WITH_CUDA "Build CUDA/NCCL code paths when the toolkit is found" ON)
set(SLICESCHED_HAVE_CUDA OFF)
if(SLICESCHED_WITH_CUDA)
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
    if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
      set(SLICESCHED_HAVE_CUDA ON)
      add_library(slicesched_nccl INTERFACE)
      target_include_directories(slicesched_nccl INTERFACE ${NCCL_INCLUDE_DIR})
      target_link_libraries(slicesched_nccl INTERFACE ${NCCL_LIBRARY} CUDA::cudart)
      add_library(slicesched::nccl ALIAS slicesched_nccl)
    endif()
  endif()
endif()
message(STATUS "slicesched: CUDA ${CUDAToolkit_VERSION} + NCCL found: ${SLICESCHED_HAVE_CUDA}")

# yaml-cpp 0.7 (Debian 12) exports a plain `yaml-cpp` target; newer releases
# export yaml-cpp::yaml-cpp. Accept either.
if(NOT TARGET yaml-cpp::yaml-cpp AND TARGET yaml-cpp)
  add_library(yaml-cpp::yaml-cpp ALIAS yaml-cpp)
endif()
