#include "slicesched/gmg/dtype.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace slicesched {

absl::string_view DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kI8: return "i8";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "f32" || n == "float32" || n == "float") return DType::kF32;
  if (n == "bf16" || n == "bfloat16") return DType::kBF16;
  if (n == "f16" || n == "float16" || n == "half") return DType::kF16;
  if (n == "i64" || n == "int64") return DType::kI64;
  if (n == "i32" || n == "int32") return DType::kI32;
  if (n == "i8" || n == "int8") return DType::kI8;
  if (n == "u8" || n == "uint8") return DType::kU8;
  if (n == "bool") return DType::kBool;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (expected one of f32, bf16, f16, i64, i32, i8, u8, bool)"));
}

}  // namespace slicesched
