// The CUDA tests' guard: without a usable GPU (this machine, CI) the test is
// skipped with the reason; where SLICESCHED_REQUIRE_CUDA=1 (tools/gpu-check
// --run on a GPU machine) a missing GPU fails it instead, so a check that
// meant to run on a GPU cannot pass by skipping.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>

#include "slicesched/executor/torch/device.h"

#define SLICESCHED_CUDA_OR_SKIP(ordinal)                                                        \
  do {                                                                                          \
    if (const absl::Status usable = ::slicesched::executor::CheckCudaDevice(ordinal);           \
        !usable.ok()) {                                                                         \
      const char* required = std::getenv("SLICESCHED_REQUIRE_CUDA");                            \
      if (required != nullptr && std::strcmp(required, "1") == 0) {                             \
        FAIL() << "SLICESCHED_REQUIRE_CUDA=1, but: " << usable;                                 \
      }                                                                                         \
      GTEST_SKIP() << "needs a CUDA GPU: " << usable;                                           \
    }                                                                                           \
  } while (0)
