// Element types of tensors in graph templates.
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace slicesched {

enum class DType : uint8_t { kF32, kBF16, kF16, kI64, kI32, kI8, kU8, kBool };

// Size of one element in bytes.
constexpr int64_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kI64: return 8;
    case DType::kI8: case DType::kU8: case DType::kBool: return 1;
  }
  return 0;
}
constexpr bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16;
}
constexpr bool IsInteger(DType t) {
  return t == DType::kI64 || t == DType::kI32 || t == DType::kI8 || t == DType::kU8;
}
absl::string_view DTypeName(DType t);
// Accepts f32/float32, bf16/bfloat16, f16/float16, i64/int64, i32/int32, i8, u8, bool.
absl::StatusOr<DType> ParseDType(absl::string_view name);

}  // namespace slicesched
