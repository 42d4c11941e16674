// Reader and writer for the safetensors format
// (https://huggingface.co/docs/safetensors):
//
//   [8 bytes]  N, little-endian uint64: length of the JSON header
//   [N bytes]  JSON: {"<name>": {"dtype": "F32", "shape": [2, 3],
//                                "data_offsets": [begin, end]}, ...,
//                     "__metadata__": {"key": "value", ...}}
//   [rest]     the tensor data; offsets are relative to the end of the header
//
// Open() validates the whole file up front with a small strict JSON parser:
// the header length lies within the file, the JSON is well formed, every
// tensor has a known dtype, a non-negative shape and offsets inside the data
// section that do not overlap and span exactly numel x element size bytes.
// Every error names the file and, where there is one, the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "slicesched/executor/torch/tensor.h"
#include "slicesched/gmg/dtype.h"

namespace slicesched::executor {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets into the data section
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps the file read-only and validates its header.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Tensor names in header order (without "__metadata__").
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsEntry* Find(std::string_view name) const;

  // A copy of tensor `name` as a CPU tensor. Errors: NotFound (missing
  // tensor), InvalidArgument (shape or dtype differs from the expected one;
  // the message gives both).
  absl::StatusOr<Tensor> Get(std::string_view name, std::span<const int64_t> expected_shape,
                             DType expected_dtype) const;
  // Without expectations.
  absl::StatusOr<Tensor> Get(std::string_view name) const;

 private:
  struct Mapping;
  SafetensorsFile() = default;
  // Open's first step: the whole file mapped read-only (at least the 8-byte
  // header length field).
  static absl::StatusOr<std::shared_ptr<Mapping>> MapReadOnly(const std::string& path);

  std::string path_;
  std::shared_ptr<Mapping> mapping_;
  const char* data_ = nullptr;  // start of the data section inside mapping_
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (in order, contiguous, header padded to 8 bytes) with
// optional string metadata. Fails on duplicate or empty names, undefined
// tensors and I/O errors.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

// "F32", "BF16", ... (the safetensors spelling).
std::string_view SafetensorsDTypeName(DType dtype);

}  // namespace slicesched::executor
