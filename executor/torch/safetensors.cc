// safetensors reader/writer. Torch-free TU: tensors are built through the
// byte-level helpers in tensor_internal.h.
#include "slicesched/executor/torch/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <variant>

#include "slicesched/common/json.h"
#include "slicesched/common/json_parse.h"
#include "slicesched/common/status.h"
#include "slicesched/common/strings.h"
#include "slicesched/executor/torch/aten_tensor.h"

namespace slicesched::executor {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // as in the reference implementation

// ---------------------------------------------------------------------------

struct DTypeSpelling {
  std::string_view name;
  DType dtype;
};
constexpr DTypeSpelling kDTypes[] = {
    {"F32", DType::kF32}, {"BF16", DType::kBF16}, {"F16", DType::kF16}, {"I64", DType::kI64},
    {"I32", DType::kI32}, {"I8", DType::kI8},     {"U8", DType::kU8},   {"BOOL", DType::kBool},
};
constexpr std::string_view kSpecOnlyDTypes[] = {"F64", "I16", "U16", "U32", "U64",
                                                "F8_E4M3", "F8_E5M2"};

std::optional<uint64_t> AsUint64(const JsonValue& v) {
  const auto* n = std::get_if<JsonNumber>(&v.v);
  if (n == nullptr || !n->is_integer || n->text.empty() || n->text[0] == '-') return std::nullopt;
  uint64_t out = 0;
  for (char c : n->text) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (out > (std::numeric_limits<uint64_t>::max() - d) / 10) return std::nullopt;
    out = out * 10 + d;
  }
  return out;
}

std::string ShapeString(std::span<const int64_t> shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

// An error that names the file; every error Open returns is one.
absl::Status FileError(const std::string& path, absl::StatusCode code, std::string_view what) {
  return absl::Status(code, StrCat("safetensors file '", path, "': ", what));
}

// The length of the JSON header, checked against the file and the limit.
absl::StatusOr<uint64_t> ReadHeaderLength(const std::string& path, const char* base,
                                          uint64_t file_size) {
  uint64_t header_len = 0;
  std::memcpy(&header_len, base, 8);  // little-endian host (static_assert above)
  if (header_len > file_size - 8) {
    return FileError(
        path, absl::StatusCode::kInvalidArgument,
        StrCat("header length ", header_len, " exceeds the file (", file_size - 8,
               " bytes after the length field); the file is truncated or not safetensors"));
  }
  if (header_len > kMaxHeaderBytes) {
    return FileError(path, absl::StatusCode::kInvalidArgument,
                     StrCat("header length ", header_len, " exceeds the ", kMaxHeaderBytes,
                            "-byte limit"));
  }
  if (header_len < 2) {
    return FileError(path, absl::StatusCode::kInvalidArgument,
                     StrCat("header length ", header_len, " is too small to hold a JSON object"));
  }
  return header_len;
}

// "__metadata__": an object of strings, added to `out`.
absl::Status ParseMetadata(const std::string& path, const JsonValue& value,
                           std::map<std::string, std::string>& out) {
  const auto* meta = std::get_if<JsonObject>(&value.v);
  if (meta == nullptr) {
    return FileError(path, absl::StatusCode::kInvalidArgument, "__metadata__ is not an object");
  }
  for (const auto& [k, mv] : *meta) {
    const auto* s = std::get_if<std::string>(&mv.v);
    if (s == nullptr) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       StrCat("__metadata__ value of '", k, "' is not a string"));
    }
    out.emplace(k, *s);
  }
  return absl::OkStatus();
}

// One tensor's header entry, checked field by field against the data section
// (`data_size` bytes).
absl::StatusOr<SafetensorsEntry> ParseEntry(const std::string& path, const std::string& name,
                                            const JsonValue& value, uint64_t data_size) {
  auto bad = [&](std::string_view what) {
    return FileError(path, absl::StatusCode::kInvalidArgument, StrCat("tensor '", name, "': ", what));
  };
  const auto* fields = std::get_if<JsonObject>(&value.v);
  if (fields == nullptr) return bad("entry is not an object");
  const JsonValue* dtype_v = nullptr;
  const JsonValue* shape_v = nullptr;
  const JsonValue* offsets_v = nullptr;
  for (const auto& [k, fv] : *fields) {
    if (k == "dtype") dtype_v = &fv;
    else if (k == "shape") shape_v = &fv;
    else if (k == "data_offsets") offsets_v = &fv;
    else return bad(StrCat("unexpected field \"", k, "\""));
  }
  if (dtype_v == nullptr || shape_v == nullptr || offsets_v == nullptr) {
    return bad("needs \"dtype\", \"shape\" and \"data_offsets\"");
  }
  SafetensorsEntry entry;
  entry.name = name;
  const auto* dtype_s = std::get_if<std::string>(&dtype_v->v);
  if (dtype_s == nullptr) return bad("dtype is not a string");
  bool known = false;
  for (const auto& d : kDTypes) {
    if (d.name == *dtype_s) {
      entry.dtype = d.dtype;
      known = true;
    }
  }
  if (!known) {
    for (std::string_view s : kSpecOnlyDTypes) {
      if (s == *dtype_s) return bad(StrCat("dtype ", s, " is not supported by the executor"));
    }
    return bad(StrCat("unknown dtype \"", *dtype_s, "\""));
  }
  const auto* shape_a = std::get_if<JsonArray>(&shape_v->v);
  if (shape_a == nullptr) return bad("shape is not an array");
  uint64_t numel = 1;
  for (const auto& d : *shape_a) {
    const auto dim = AsUint64(d);
    if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad("shape holds something other than a non-negative integer");
    }
    if (*dim != 0 && numel > std::numeric_limits<uint64_t>::max() / *dim) {
      return bad("shape overflows");
    }
    numel *= *dim;
    entry.shape.push_back(static_cast<int64_t>(*dim));
  }
  const auto* off_a = std::get_if<JsonArray>(&offsets_v->v);
  if (off_a == nullptr || off_a->size() != 2) return bad("data_offsets is not [begin, end]");
  const auto begin = AsUint64((*off_a)[0]);
  const auto end = AsUint64((*off_a)[1]);
  if (!begin || !end) return bad("data_offsets are not non-negative integers");
  if (*begin > *end) return bad(StrCat("data_offsets [", *begin, ", ", *end, "] are reversed"));
  if (*end > data_size) {
    return bad(StrCat("data_offsets [", *begin, ", ", *end, "] run past the data section (",
                      data_size, " bytes)"));
  }
  const uint64_t elem = static_cast<uint64_t>(DTypeSize(entry.dtype));
  if (numel > std::numeric_limits<uint64_t>::max() / elem || numel * elem != *end - *begin) {
    return bad(StrCat("data_offsets [", *begin, ", ", *end, "] span ", *end - *begin,
                      " bytes but shape ", ShapeString(entry.shape), " x ", *dtype_s, " needs ",
                      numel * elem));
  }
  entry.begin = *begin;
  entry.end = *end;
  return entry;
}

// Overlaps: sort by begin; each tensor must start at or after the previous end.
absl::Status CheckNoOverlaps(const std::string& path, const std::vector<SafetensorsEntry>& entries) {
  std::vector<const SafetensorsEntry*> order;
  for (const auto& e : entries) {
    if (e.end > e.begin) order.push_back(&e);  // empty tensors occupy nothing
  }
  std::sort(order.begin(), order.end(),
            [](const auto* a, const auto* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < order.size(); ++i) {
    if (order[i]->begin < order[i - 1]->end) {
      return FileError(path, absl::StatusCode::kInvalidArgument,
                       StrCat("tensors '", order[i - 1]->name, "' [", order[i - 1]->begin, ", ",
                              order[i - 1]->end, ") and '", order[i]->name, "' [", order[i]->begin,
                              ", ", order[i]->end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string_view SafetensorsDTypeName(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

struct SafetensorsFile::Mapping {
  void* addr = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
  }
};

SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::shared_ptr<SafetensorsFile::Mapping>> SafetensorsFile::MapReadOnly(
    const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    return FileError(path,
                     err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kUnavailable,
                     StrCat("cannot open: ", std::strerror(err)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return FileError(path, absl::StatusCode::kUnavailable, StrCat("cannot stat: ", std::strerror(err)));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return FileError(path, absl::StatusCode::kInvalidArgument,
                     StrCat("truncated: ", file_size,
                            " bytes, shorter than the 8-byte header length field"));
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(file_size);
  mapping->addr = ::mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (mapping->addr == MAP_FAILED) {
    return FileError(path, absl::StatusCode::kUnavailable,
                     StrCat("cannot mmap: ", std::strerror(map_err)));
  }
  return mapping;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SLICESCHED_ASSIGN_OR_RETURN(std::shared_ptr<Mapping> mapping, MapReadOnly(path));
  const char* base = static_cast<const char*>(mapping->addr);
  const uint64_t file_size = mapping->size;
  SLICESCHED_ASSIGN_OR_RETURN(const uint64_t header_len, ReadHeaderLength(path, base, file_size));
  const std::string_view header(base + 8, static_cast<size_t>(header_len));
  const uint64_t data_size = file_size - 8 - header_len;

  auto parsed = ParseJson(header, "JSON header");
  if (!parsed.ok()) {
    return FileError(path, absl::StatusCode::kInvalidArgument, ToStd(parsed.status().message()));
  }
  const auto* top = std::get_if<JsonObject>(&parsed->v);
  if (top == nullptr) {
    return FileError(path, absl::StatusCode::kInvalidArgument, "header JSON is not an object");
  }

  SafetensorsFile file;
  file.path_ = path;
  for (const auto& [name, value] : *top) {
    if (name == "__metadata__") {
      SLICESCHED_RETURN_IF_ERROR(ParseMetadata(path, value, file.metadata_));
      continue;
    }
    SLICESCHED_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(path, name, value, data_size));
    file.entries_.push_back(std::move(entry));
  }
  SLICESCHED_RETURN_IF_ERROR(CheckNoOverlaps(path, file.entries_));
  file.mapping_ = std::move(mapping);
  file.data_ = base + 8 + header_len;
  return file;
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

const SafetensorsEntry* SafetensorsFile::Find(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

absl::StatusOr<Tensor> SafetensorsFile::Get(std::string_view name) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) {
    return absl::NotFoundError(
        StrCat("safetensors file '", path_, "': tensor '", name, "' is missing"));
  }
  auto t = internal::TensorFromBytes(e->dtype, e->shape, data_ + e->begin,
                                     static_cast<size_t>(e->end - e->begin));
  if (!t.ok()) {
    return Annotate(t.status(), ToAbsl(StrCat("safetensors file '", path_, "': tensor '", name, "'")));
  }
  return t;
}

absl::StatusOr<Tensor> SafetensorsFile::Get(std::string_view name,
                                            std::span<const int64_t> expected_shape,
                                            DType expected_dtype) const {
  const SafetensorsEntry* e = Find(name);
  if (e == nullptr) return Get(name);  // NotFound
  if (!std::equal(e->shape.begin(), e->shape.end(), expected_shape.begin(), expected_shape.end())) {
    return absl::InvalidArgumentError(
        StrCat("safetensors file '", path_, "': tensor '", name, "' has shape ",
               ShapeString(e->shape), ", expected ", ShapeString(expected_shape)));
  }
  if (e->dtype != expected_dtype) {
    return absl::InvalidArgumentError(
        StrCat("safetensors file '", path_, "': tensor '", name, "' has dtype ",
               SafetensorsDTypeName(e->dtype), ", expected ", SafetensorsDTypeName(expected_dtype)));
  }
  return Get(name);
}

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, Tensor>>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  auto fail = [&](std::string_view what) {
    return absl::InvalidArgumentError(StrCat("writing safetensors file '", path, "': ", what));
  };
  std::set<std::string, std::less<>> seen;
  std::vector<std::string> blobs;
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) header += ",";
      first = false;
      header += StrCat(JsonQuote(k), ":", JsonQuote(v));
    }
    header += "}";
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == "__metadata__") return fail(StrCat("invalid tensor name '", name, "'"));
    if (!seen.insert(name).second) return fail(StrCat("duplicate tensor '", name, "'"));
    if (!tensor.defined()) return fail(StrCat("tensor '", name, "' is undefined"));
    auto bytes = internal::TensorToBytes(tensor);
    if (!bytes.ok()) return Annotate(bytes.status(), ToAbsl(StrCat("tensor '", name, "'")));
    if (header.size() > 1) header += ",";
    header += StrCat(JsonQuote(name), ":{\"dtype\":\"", SafetensorsDTypeName(tensor.dtype()),
                     "\",\"shape\":[");
    const auto shape = tensor.shape();
    for (size_t i = 0; i < shape.size(); ++i) {
      if (i > 0) header += ",";
      header += std::to_string(shape[i]);
    }
    header += StrCat("],\"data_offsets\":[", offset, ",", offset + bytes->size(), "]}");
    offset += bytes->size();
    blobs.push_back(*std::move(bytes));
  }
  header += "}";
  while (header.size() % 8 != 0) header += ' ';

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::UnavailableError(
        StrCat("writing safetensors file '", path, "': cannot open: ", std::strerror(errno)));
  }
  const uint64_t n = header.size();
  char len[8];
  std::memcpy(len, &n, 8);
  out.write(len, 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (const auto& b : blobs) out.write(b.data(), static_cast<std::streamsize>(b.size()));
  out.close();
  if (!out) return absl::UnavailableError(StrCat("writing safetensors file '", path, "': write failed"));
  return absl::OkStatus();
}

}  // namespace slicesched::executor
