// The input-robustness campaign (tests/fuzz/) on safetensors files: seeded
// mutations of a valid file, byte-level over the whole file (length prefix
// included) and over the JSON header alone with the length prefix kept
// consistent (so mutations reach the JSON parser and the validation rather
// than the length check). A file must open and give every tensor, or fail
// with an error naming the file. Torch-free TU.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/mutator.h"
#include "slicesched/executor/torch/safetensors.h"

namespace slicesched::executor {
namespace {

std::string File(const std::string& header, const std::string& data) {
  std::string out(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(out.data(), &len, 8);
  return out + header + data;
}

TEST(SafetensorsMutation, OpensOrNamesTheFile) {
  const char* env = std::getenv("SLICESCHED_FUZZ_ITERATIONS");
  const int iterations = env != nullptr ? std::atoi(env) : 1500;
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("b":{"dtype":"BF16","shape":[4],"data_offsets":[24,32]},)"
      R"("c":{"dtype":"I64","shape":[1,1],"data_offsets":[32,40]},)"
      R"("__metadata__":{"format":"pt","k":"v"}})";
  std::string data(40, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  ASSERT_TRUE(SafetensorsFile::Open([&] {
                const std::string p = ::testing::TempDir() + "/fuzz_st_seed_" + std::to_string(::getpid());
                std::ofstream(p, std::ios::binary) << File(header, data);
                return p;
              }())
                  .ok());
  const std::string path = ::testing::TempDir() + "/fuzz_st_" + std::to_string(::getpid()) + ".safetensors";
  fuzz::Mutator m(20261201);
  int ok = 0, errors = 0, unnamed = 0;
  for (int i = 0; i < iterations; ++i) {
    const std::string bytes = i % 2 == 0 ? m.Mutate(File(header, data)) : File(m.Mutate(header), data);
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    auto f = SafetensorsFile::Open(path);
    absl::Status s = f.status();
    if (f.ok()) {
      for (const std::string& name : f->names()) {
        s = f->Get(name).status();
        if (!s.ok()) break;
      }
    }
    if (s.ok()) {
      ++ok;
      continue;
    }
    ++errors;
    if (std::string(s.message()).find(path) == std::string::npos && unnamed++ < 5) {
      ADD_FAILURE() << "error does not name the file: " << s;
    }
  }
  std::printf("[fuzz] safetensors: %d inputs, %d opened, %d rejected, %d unnamed\n", iterations, ok, errors, unnamed);
}

}  // namespace
}  // namespace slicesched::executor
