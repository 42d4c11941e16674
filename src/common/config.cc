// Implementation of the YAML configuration helpers (see config.h).
//
// yaml-cpp reports problems by throwing; every entry point here catches
// YAML::Exception and turns it into a Status or a recorded ConfigError.
//
// One trap shapes this file: YAML::Node::operator= does not rebind a node, it
// writes the right-hand side into the tree the left-hand side refers to. Nodes
// are therefore only ever copy-constructed or rebound with Node::reset(), and
// lookups go through const nodes (non-const operator[] inserts keys).

#include "slicesched/common/config.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "yaml-cpp/depthguard.h"

namespace slicesched {
namespace {

// "'text'" for scalars, "a map"/"a list"/"nothing" otherwise; used in
// "expected X, got Y" messages.
std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  return absl::StrCat("'", node.Scalar(), "'");
}

// Converters: return an empty string on success (having set *out), or the
// error message. *out is left untouched on failure.
std::string ConvertString(const YAML::Node& n, std::string* out) {
  if (!n.IsScalar())
    return absl::StrCat("expected a string, got ", Describe(n));
  *out = n.Scalar();
  return "";
}

// Whether scalar `n` is a YAML string by its form: quoted or block (the
// non-specific tag "!") or tagged !!str. A plain scalar (tag "?"), one with a
// type tag (!!int, !!bool, ...) and a node built in code (no tag) are not.
bool IsStringScalar(const YAML::Node& n) {
  return n.Tag() == "!" || n.Tag() == "tag:yaml.org,2002:str";
}

// Numbers follow the rule for booleans (below): a quoted or block scalar is a
// string in YAML, so "16" where an integer or a number is expected is
// refused with a hint, as every other YAML tool would read it as text,
// unless `quoted_ok` (ConfigReader::AcceptQuotedScalars). A string that does
// not spell a number gets the plain message.
std::string ConvertInt(const YAML::Node& n, bool quoted_ok, int64_t* out) {
  int64_t v;
  if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) {
    return absl::StrCat("expected an integer, got ", Describe(n));
  }
  if (!quoted_ok && IsStringScalar(n)) {
    return absl::StrCat("expected an integer, got the string ", Describe(n),
                        " (a quoted number is not a number; write it without quotes)");
  }
  *out = v;
  return "";
}

std::string ConvertDouble(const YAML::Node& n, bool quoted_ok, double* out) {
  double v;
  if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v) || !std::isfinite(v)) {
    return absl::StrCat("expected a number, got ", Describe(n));
  }
  if (!quoted_ok && IsStringScalar(n)) {
    return absl::StrCat("expected a number, got the string ", Describe(n),
                        " (a quoted number is not a number; write it without quotes)");
  }
  *out = v;
  return "";
}

// A boolean is a plain (unquoted) scalar true/false, yes/no or on/off in any
// case, or one tagged !!bool. A quoted or block scalar is a string in YAML,
// whatever it spells ('yes' is the word, not the boolean), so it is refused
// with a hint rather than read differently from every other YAML tool, unless
// `quoted_ok` (ConfigReader::AcceptQuotedScalars).
std::string ConvertBool(const YAML::Node& n, bool quoted_ok, bool* out) {
  if (n.IsScalar()) {
    const std::string s = absl::AsciiStrToLower(n.Scalar());
    const bool is_true = s == "true" || s == "yes" || s == "on";
    const bool is_false = s == "false" || s == "no" || s == "off";
    const bool plain = quoted_ok || !IsStringScalar(n);
    if ((is_true || is_false) && plain) {
      *out = is_true;
      return "";
    }
    if (is_true || is_false) {
      return absl::StrCat("expected true or false, got the string ", Describe(n),
                          " (a quoted word is not a boolean; write it without quotes)");
    }
  }
  return absl::StrCat("expected true or false, got ", Describe(n));
}

std::string ConvertBytes(const YAML::Node& n, Bytes* out) {
  if (n.IsScalar()) {
    absl::StatusOr<Bytes> parsed = Bytes::Parse(n.Scalar());
    if (parsed.ok()) {
      *out = *parsed;
      return "";
    }
    if (absl::EndsWith(parsed.status().message(), "out of range")) {
      return absl::StrCat("byte size ", Describe(n), " is out of range");
    }
  }
  return absl::StrCat("expected a byte size such as 64GiB, got ", Describe(n));
}

std::string ConvertDuration(const YAML::Node& n, Duration* out) {
  if (n.IsScalar()) {
    absl::StatusOr<Duration> parsed = Duration::Parse(n.Scalar());
    if (parsed.ok()) {
      *out = *parsed;
      return "";
    }
    if (absl::EndsWith(parsed.status().message(), "out of range")) {
      return absl::StrCat("duration ", Describe(n), " is out of range");
    }
  }
  return absl::StrCat("expected a duration such as 10ms, got ", Describe(n));
}

// A defined copy of `node` that is safe to keep and rebind (an undefined
// "zombie" node from a failed lookup would make Node::reset() throw).
YAML::Node Keepable(const YAML::Node& node) {
  return node.IsDefined() ? node : YAML::Node();
}

}  // namespace

// ---------------------------------------------------------------------------
// Loading

absl::StatusOr<YAML::Node> LoadYamlString(absl::string_view text,
                                          absl::string_view source_name) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    std::string position(source_name);
    if (!e.mark.is_null()) {
      absl::StrAppend(&position, ":", e.mark.line + 1, ":", e.mark.column + 1);
    }
    // yaml-cpp's depth guard reports nesting that is too deep as "bad file".
    const bool too_deep = dynamic_cast<const YAML::DeepRecursion*>(&e) != nullptr;
    return absl::InvalidArgumentError(absl::StrCat(
        position, ": ", too_deep ? "nested too deeply (collections inside collections beyond yaml-cpp's limit)" : e.msg));
  }
}

absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read config file '", path, "': is a directory"));
  }
  std::ifstream in(path, std::ios::in | std::ios::binary);
  if (!in) {
    const int err = errno;
    const std::string reason = absl::StrCat("cannot open config file '", path,
                                            "': ", std::strerror(err));
    if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(reason);
    if (err == EACCES || err == EPERM)
      return absl::PermissionDeniedError(reason);
    return absl::UnavailableError(reason);
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) {
    return absl::UnavailableError(
        absl::StrCat("cannot read config file '", path, "'"));
  }
  return LoadYamlString(contents.str(), path);
}

std::string FormatConfigPosition(absl::string_view source,
                                 const YAML::Node& at) {
  try {
    if (at.IsDefined()) {
      const YAML::Mark mark = at.Mark();
      if (mark.line >= 0 && mark.column >= 0) {
        return absl::StrCat(source, ":", mark.line + 1, ":", mark.column + 1);
      }
    }
  } catch (const YAML::Exception&) {
    // No position available.
  }
  return std::string(source);
}

// ---------------------------------------------------------------------------
// ConfigErrors

void ConfigErrors::Add(const YAML::Node& at, absl::string_view field_path,
                       absl::string_view message) {
  Add(ConfigSource{default_source_}, at, field_path, message);
}

void ConfigErrors::Add(const ConfigSource& source, const YAML::Node& at,
                       absl::string_view field_path,
                       absl::string_view message) {
  std::string line = FormatConfigPosition(source.name, at);
  if (!line.empty()) line += ": ";
  if (!field_path.empty()) absl::StrAppend(&line, field_path, ": ");
  absl::StrAppend(&line, message);
  AddLine(std::move(line));
}

void ConfigErrors::AddGlobal(absl::string_view message) {
  AddLine(std::string(message));
}

void ConfigErrors::AddLine(std::string line) {
  if (std::find(errors_.begin(), errors_.end(), line) != errors_.end()) return;
  errors_.push_back(std::move(line));
}

absl::Status ConfigErrors::ToStatus() const {
  if (errors_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(errors_.size(),
                   errors_.size() == 1 ? " configuration error:\n"
                                       : " configuration errors:\n",
                   absl::StrJoin(errors_, "\n")));
}

// ---------------------------------------------------------------------------
// ConfigReader: construction

struct ConfigReader::Lookup {
  enum Kind {
    kAbsentParent,  // this reader is absent: nothing to look up
    kNotMap,        // this reader is present but not a map (reported)
    kMissing,       // no such key
    kNull,          // key present with a null value
    kFound,         // key present with a non-null value
  };
  Kind kind;
  YAML::Node key;    // the key node for kNull/kFound
  YAML::Node value;  // the value node for kFound
};

ConfigReader::ConfigReader(const YAML::Node& root,
                           absl::string_view source_name, ConfigErrors* errors)
    : node_(Keepable(root)),
      present_(root.IsDefined() && !root.IsNull()),
      anchor_(Keepable(root)),
      source_{std::string(source_name)},
      errors_(errors) {
  ABSL_RAW_CHECK(errors != nullptr, "ConfigReader needs a ConfigErrors");
}

ConfigReader::ConfigReader(YAML::Node node, bool present, YAML::Node anchor,
                           std::string path, const ConfigReader& parent)
    : node_(Keepable(node)),
      present_(present),
      anchor_(Keepable(anchor)),
      path_(std::move(path)),
      source_(parent.source_),
      errors_(parent.errors_),
      quoted_scalars_(parent.quoted_scalars_) {}

ConfigReader& ConfigReader::operator=(const ConfigReader& other) {
  if (this == &other) return *this;
  node_.reset(other.node_);
  anchor_.reset(other.anchor_);
  present_ = other.present_;
  path_ = other.path_;
  source_ = other.source_;
  errors_ = other.errors_;
  quoted_scalars_ = other.quoted_scalars_;
  return *this;
}

ConfigReader& ConfigReader::operator=(ConfigReader&& other) {
  return *this = static_cast<const ConfigReader&>(other);
}

bool ConfigReader::IsMap() const { return present_ && node_.IsMap(); }
bool ConfigReader::IsList() const { return present_ && node_.IsSequence(); }
bool ConfigReader::IsScalar() const { return present_ && node_.IsScalar(); }

std::string ConfigReader::ChildPath(absl::string_view key) const {
  if (key.empty()) return path_;
  if (path_.empty()) return std::string(key);
  return absl::StrCat(path_, ".", key);
}

void ConfigReader::Report(const YAML::Node& at, absl::string_view field_path,
                          absl::string_view message) const {
  errors_->Add(source_, at, field_path, message);
}

bool ConfigReader::RequireMap() const {
  if (!present_) return false;
  if (node_.IsMap()) return true;
  Report(node_, path_, absl::StrCat("expected a map, got ", Describe(node_)));
  return false;
}

// ---------------------------------------------------------------------------
// ConfigReader: structure

ConfigReader::Lookup ConfigReader::Find(absl::string_view key) const {
  if (!present_) return {Lookup::kAbsentParent, {}, {}};
  if (!RequireMap()) return {Lookup::kNotMap, {}, {}};
  try {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (!it->first.IsScalar() || it->first.Scalar() != key) continue;
      if (!it->second.IsDefined() || it->second.IsNull()) {
        return {Lookup::kNull, it->first, {}};
      }
      return {Lookup::kFound, it->first, it->second};
    }
  } catch (const YAML::Exception& e) {
    Report(node_, path_, e.what());
    return {Lookup::kNotMap, {}, {}};
  }
  return {Lookup::kMissing, {}, {}};
}

std::optional<YAML::Node> ConfigReader::FindValue(absl::string_view key,
                                                  bool required) const {
  Lookup found = Find(key);
  switch (found.kind) {
    case Lookup::kFound:
      return found.value;
    case Lookup::kMissing:
      if (required) {
        Report(node_, path_,
               absl::StrCat("missing required field '", key, "'"));
      }
      break;
    case Lookup::kNull:
      if (required) {
        Report(found.key, path_,
               absl::StrCat("required field '", key, "' has no value"));
      }
      break;
    case Lookup::kAbsentParent:
    case Lookup::kNotMap:
      break;
  }
  return std::nullopt;
}

bool ConfigReader::Has(absl::string_view key) const {
  if (!present_ || !node_.IsMap()) return false;
  return Find(key).kind == Lookup::kFound;
}

ConfigReader ConfigReader::Child(absl::string_view key) const {
  Lookup found = Find(key);
  switch (found.kind) {
    case Lookup::kFound:
      return ConfigReader(found.value, true, found.value, ChildPath(key),
                          *this);
    case Lookup::kNull:
      return ConfigReader(YAML::Node(), false, found.key, ChildPath(key),
                          *this);
    case Lookup::kMissing:
    case Lookup::kNotMap:
      return ConfigReader(YAML::Node(), false, node_, ChildPath(key), *this);
    case Lookup::kAbsentParent:
      break;
  }
  return ConfigReader(YAML::Node(), false, anchor_, ChildPath(key), *this);
}

ConfigReader ConfigReader::RequiredChild(absl::string_view key) const {
  FindValue(key, /*required=*/true);  // only for its report
  return Child(key);
}

size_t ConfigReader::size() const {
  if (!present_) return 0;
  if (!node_.IsSequence()) {
    Report(node_, path_,
           absl::StrCat("expected a list, got ", Describe(node_)));
    return 0;
  }
  return node_.size();
}

ConfigReader ConfigReader::At(size_t index) const {
  const std::string path = absl::StrCat(path_, "[", index, "]");
  if (index < size()) {
    try {
      const YAML::Node& list = node_;
      YAML::Node element = list[index];
      if (element.IsDefined() && !element.IsNull()) {
        return ConfigReader(element, true, element, path, *this);
      }
      return ConfigReader(YAML::Node(), false, Keepable(element), path, *this);
    } catch (const YAML::Exception& e) {
      Report(node_, path, e.what());
    }
  }
  return ConfigReader(YAML::Node(), false, PositionNode(), path, *this);
}

std::vector<ConfigReader> ConfigReader::Elements() const {
  std::vector<ConfigReader> elements;
  const size_t n = size();
  elements.reserve(n);
  for (size_t i = 0; i < n; ++i) elements.push_back(At(i));
  return elements;
}

std::vector<std::pair<std::string, ConfigReader>> ConfigReader::Entries()
    const {
  std::vector<std::pair<std::string, ConfigReader>> entries;
  if (!RequireMap()) return entries;
  try {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      if (!it->first.IsScalar()) {
        Report(it->first, path_, "map keys must be plain strings");
        continue;
      }
      const std::string key = it->first.Scalar();
      if (!it->second.IsDefined() || it->second.IsNull()) {
        entries.emplace_back(key, ConfigReader(YAML::Node(), false, it->first,
                                               ChildPath(key), *this));
      } else {
        entries.emplace_back(key, ConfigReader(it->second, true, it->second,
                                               ChildPath(key), *this));
      }
    }
  } catch (const YAML::Exception& e) {
    Report(node_, path_, e.what());
  }
  return entries;
}

void ConfigReader::RejectUnknownKeys(
    std::initializer_list<absl::string_view> allowed) const {
  RejectUnknownKeys(
      absl::Span<const absl::string_view>(allowed.begin(), allowed.size()));
}

void ConfigReader::RejectUnknownKeys(
    absl::Span<const std::string> allowed) const {
  std::vector<absl::string_view> views(allowed.begin(), allowed.end());
  RejectUnknownKeys(absl::Span<const absl::string_view>(views));
}

void ConfigReader::RejectUnknownKeys(
    absl::Span<const absl::string_view> allowed) const {
  if (!RequireMap()) return;
  try {
    for (auto it = node_.begin(); it != node_.end(); ++it) {
      const std::string key = it->first.IsScalar() ? it->first.Scalar() : "";
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) {
        continue;
      }
      Report(it->first, path_,
             absl::StrCat("unknown field ", Describe(it->first),
                          " (expected one of: ", absl::StrJoin(allowed, ", "),
                          ")"));
    }
  } catch (const YAML::Exception& e) {
    Report(node_, path_, e.what());
  }
}

// ---------------------------------------------------------------------------
// ConfigReader: scalars

template <typename T, typename Convert>
void ConfigReader::ReadFieldWith(absl::string_view key, bool required, T* out,
                                 Convert convert) const {
  std::optional<YAML::Node> value = FindValue(key, required);
  if (!value.has_value()) return;
  std::string error = convert(*value, out);
  if (!error.empty()) Report(*value, ChildPath(key), error);
}

void ConfigReader::ReadField(absl::string_view key, bool required,
                             std::string* out) const {
  ReadFieldWith(key, required, out, ConvertString);
}
void ConfigReader::ReadField(absl::string_view key, bool required,
                             int64_t* out) const {
  ReadFieldWith(key, required, out,
                [this](const YAML::Node& n, int64_t* v) { return ConvertInt(n, quoted_scalars_, v); });
}
void ConfigReader::ReadField(absl::string_view key, bool required,
                             double* out) const {
  ReadFieldWith(key, required, out,
                [this](const YAML::Node& n, double* v) { return ConvertDouble(n, quoted_scalars_, v); });
}
void ConfigReader::ReadField(absl::string_view key, bool required,
                             bool* out) const {
  ReadFieldWith(key, required, out,
                [this](const YAML::Node& n, bool* b) { return ConvertBool(n, quoted_scalars_, b); });
}

namespace {

template <typename T, typename Convert>
void ReadSelfWith(const ConfigReader& r, T* out, Convert convert) {
  if (!r.present()) return;
  std::string error = convert(r.node(), out);
  if (!error.empty()) r.Error(error);
}

}  // namespace

void ConfigReader::ReadSelf(std::string* out) const {
  ReadSelfWith(*this, out, ConvertString);
}
void ConfigReader::ReadSelf(int64_t* out) const {
  ReadSelfWith(*this, out, [this](const YAML::Node& n, int64_t* v) { return ConvertInt(n, quoted_scalars_, v); });
}
void ConfigReader::ReadSelf(double* out) const {
  ReadSelfWith(*this, out, [this](const YAML::Node& n, double* v) { return ConvertDouble(n, quoted_scalars_, v); });
}
void ConfigReader::ReadSelf(bool* out) const {
  ReadSelfWith(*this, out, [this](const YAML::Node& n, bool* b) { return ConvertBool(n, quoted_scalars_, b); });
}

Bytes ConfigReader::RequiredBytes(absl::string_view key) const {
  Bytes value;
  ReadFieldWith(key, /*required=*/true, &value, ConvertBytes);
  return value;
}

Bytes ConfigReader::OptionalBytes(absl::string_view key,
                                  Bytes default_value) const {
  ReadFieldWith(key, /*required=*/false, &default_value, ConvertBytes);
  return default_value;
}

Bytes ConfigReader::AsBytes(Bytes default_value) const {
  ReadSelfWith(*this, &default_value, ConvertBytes);
  return default_value;
}

Duration ConfigReader::RequiredDuration(absl::string_view key) const {
  Duration value;
  ReadFieldWith(key, /*required=*/true, &value, ConvertDuration);
  return value;
}

Duration ConfigReader::OptionalDuration(absl::string_view key,
                                        Duration default_value) const {
  ReadFieldWith(key, /*required=*/false, &default_value, ConvertDuration);
  return default_value;
}

Duration ConfigReader::AsDuration(Duration default_value) const {
  ReadSelfWith(*this, &default_value, ConvertDuration);
  return default_value;
}

// ---------------------------------------------------------------------------
// ConfigReader: validation

void ConfigReader::Check(bool condition, absl::string_view key,
                         absl::string_view message) const {
  if (condition) return;
  if (present_ && node_.IsMap() && !key.empty()) {
    Lookup found = Find(key);
    if (found.kind == Lookup::kFound) {
      Report(found.value, ChildPath(key), message);
      return;
    }
    if (found.kind == Lookup::kNull) {
      Report(found.key, ChildPath(key), message);
      return;
    }
  }
  Report(PositionNode(), ChildPath(key), message);
}

void ConfigReader::Error(absl::string_view message) const {
  Report(PositionNode(), path_, message);
}

}  // namespace slicesched
