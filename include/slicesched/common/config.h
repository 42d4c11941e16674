// YAML configuration helpers.
//
// Configuration files are handled in two steps: yaml-cpp parses the text into
// a YAML::Node tree (LoadYamlFile / LoadYamlString), then typed parsing walks
// the tree with a ConfigReader, which records every problem it finds in a
// ConfigErrors instead of stopping at the first one. Each error names the
// offending field and its position in the file:
//
//   a.yaml:9:5: devices[2].memory: expected a byte size such as 64GiB, got 'x'
//
// Typical use:
//
//   ConfigErrors errors;
//   ConfigReader r(root, "cluster.yaml", &errors);
//   ConfigReader devices = r.RequiredChild("devices");
//   for (size_t i = 0; i < devices.size(); ++i) {
//     ConfigReader d = devices.At(i);                       // "devices[2]"
//     spec.name = d.Required<std::string>("name");
//     spec.memory = d.RequiredBytes("memory");
//     spec.replicas = d.Optional<int64_t>("replicas", 1);
//     d.CheckPositive("replicas", spec.replicas);
//     d.RejectUnknownKeys({"name", "memory", "replicas"});
//   }
//   r.RejectUnknownKeys({"devices"});
//   SLICESCHED_RETURN_IF_ERROR(errors.ToStatus());
//
// Nothing here throws: yaml-cpp exceptions are caught and turned into errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "slicesched/common/units.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {

// Where a configuration tree came from: a file path, or "<embedded:NAME>" for
// text compiled into the binary. Used as the prefix of error positions.
struct ConfigSource {
  std::string name;
};

// Reads and parses a YAML file. A file that does not exist gives
// NotFoundError naming the path; a file that cannot be read gives
// PermissionDenied/Unavailable; a syntax error gives InvalidArgumentError
// "PATH:LINE:COL: MESSAGE" (1-based line and column). An empty file yields a
// null node.
absl::StatusOr<YAML::Node> LoadYamlFile(const std::string& path);

// Parses YAML text; `source_name` is used in error messages like a path.
absl::StatusOr<YAML::Node> LoadYamlString(absl::string_view text,
                                          absl::string_view source_name);

// "SOURCE:LINE:COL" (1-based) for a node that carries a position, or just
// "SOURCE" for one that does not (a node built in code, a missing node).
std::string FormatConfigPosition(absl::string_view source,
                                 const YAML::Node& at);

// Collects configuration errors. Each error is one line
// "SOURCE:LINE:COL: FIELD_PATH: MESSAGE"; the position part shrinks to
// "SOURCE" when `at` has no position and the path part is dropped when the
// path is empty. Adding an identical line twice keeps one copy.
class ConfigErrors {
 public:
  ConfigErrors() = default;
  // `default_source` is used by the Add overload without a source.
  explicit ConfigErrors(std::string default_source)
      : default_source_(std::move(default_source)) {}

  void Add(const YAML::Node& at, absl::string_view field_path,
           absl::string_view message);
  void Add(const ConfigSource& source, const YAML::Node& at,
           absl::string_view field_path, absl::string_view message);
  // An error that has no position (e.g. a cross-file consistency check).
  void AddGlobal(absl::string_view message);

  bool ok() const { return errors_.empty(); }
  size_t size() const { return errors_.size(); }
  const std::vector<std::string>& errors() const { return errors_; }

  // OkStatus() when there are no errors; otherwise InvalidArgumentError
  // "N configuration error(s):" followed by every error, one per line.
  absl::Status ToStatus() const;

 private:
  void AddLine(std::string line);

  std::string default_source_;
  std::vector<std::string> errors_;
};

// A position in a configuration tree: a YAML node, its field path
// ("devices[2].memory"), its source and the error sink. Readers are cheap to
// copy and never modify the YAML tree.
//
// A reader is "present" when its node exists and is not null. Asking a
// present map for a field that is missing reports the field as missing;
// asking an absent reader (the child of a missing or null node) for anything
// returns the default value without reporting: the absence was already
// reported by RequiredChild()/Required*() or is allowed by the caller's use of
// Child(). A null value (`key:` with nothing after it, or `~`) counts as
// absent for Optional*() and is reported as empty by Required*().
//
// Values that cannot be converted are reported at the value's position and
// the default (Optional*) or a value-initialised T (Required*) is returned, so
// parsing can carry on and find further errors.
//
// Supported scalar types for Required<T>/Optional<T>/As<T>:
//   std::string  any scalar
//   int64_t      base-10 integer, optional sign, unquoted (or tagged !!int)
//   double       finite decimal number ("1.5", "2e9"), unquoted (or tagged
//                !!float or !!int); inf/nan are rejected
//   bool         true/false, yes/no, on/off (any case), unquoted (or tagged
//                !!bool); numbers such as 1 are reported
// A quoted or block scalar is a YAML string: "16" where an integer or a number
// is expected, or 'yes' where a boolean is, is reported ("... got the string
// '16' (a quoted number is not a number; write it without quotes)") unless
// AcceptQuotedScalars().
class ConfigReader {
 public:
  // Reader for the root of a tree loaded from `source_name`. `errors` must
  // outlive the reader and all readers derived from it.
  ConfigReader(const YAML::Node& root, absl::string_view source_name,
               ConfigErrors* errors);

  ConfigReader(const ConfigReader& other) = default;
  ConfigReader(ConfigReader&& other) = default;
  // Rebinds this reader (YAML::Node's own operator= would write into the
  // tree, which readers must never do).
  ConfigReader& operator=(const ConfigReader& other);
  ConfigReader& operator=(ConfigReader&& other);

  bool present() const { return present_; }
  bool IsMap() const;
  bool IsList() const;
  bool IsScalar() const;
  const std::string& path() const { return path_; }
  const ConfigSource& source() const { return source_; }
  // The underlying node (a null node when absent). Read it through a const
  // reference only: non-const operator[] on YAML::Node inserts keys.
  const YAML::Node& node() const { return node_; }
  ConfigErrors* errors() const { return errors_; }

  // Reads a quoted 'yes' / "true" (and the other boolean words) as the
  // boolean it spells and a quoted "16" / '1.5' as the integer or number it
  // spells, in this reader and every reader derived from it. Only for
  // re-reading text that was accepted that way before quoted scalars were
  // refused (the job manager's stored jobs); new input stays strict.
  ConfigReader& AcceptQuotedScalars() {
    quoted_scalars_ = true;
    return *this;
  }

  // --- Structure -----------------------------------------------------------

  // Whether this is a map with `key` set to a non-null value. Never reports.
  bool Has(absl::string_view key) const;
  // The value under `key` (absent if missing or null). Reports when this
  // reader is present but not a map.
  ConfigReader Child(absl::string_view key) const;
  // Like Child(), but also reports a missing or null value.
  ConfigReader RequiredChild(absl::string_view key) const;

  // Number of list elements; 0 when absent. Reports when present but not a
  // list.
  size_t size() const;
  // Element `index` of a list, path "PATH[index]" (absent when out of range).
  ConfigReader At(size_t index) const;
  // All list elements, for range-for loops.
  std::vector<ConfigReader> Elements() const;
  // All map entries in file order, for maps keyed by user-chosen names
  // (e.g. "models: {llama: {...}}"). Reports when present but not a map.
  std::vector<std::pair<std::string, ConfigReader>> Entries() const;

  // Reports every key of this map that is not in `allowed`, at the key's
  // position: "unknown field 'foo' (expected one of: a, b)".
  void RejectUnknownKeys(
      std::initializer_list<absl::string_view> allowed) const;
  void RejectUnknownKeys(absl::Span<const absl::string_view> allowed) const;
  void RejectUnknownKeys(absl::Span<const std::string> allowed) const;

  // --- Scalars ---------------------------------------------------------------

  template <typename T>
  T Required(absl::string_view key) const {
    AssertSupported<T>();
    T value{};
    ReadField(key, /*required=*/true, &value);
    return value;
  }
  template <typename T>
  T Optional(absl::string_view key, T default_value) const {
    AssertSupported<T>();
    ReadField(key, /*required=*/false, &default_value);
    return default_value;
  }
  // This node itself as a scalar (for lists of scalars); `default_value` when
  // absent or not convertible (the latter is reported).
  template <typename T>
  T As(T default_value = T{}) const {
    AssertSupported<T>();
    ReadSelf(&default_value);
    return default_value;
  }

  // Byte sizes: anything Bytes::Parse accepts ("64GiB", "1.5 MiB", "4096").
  Bytes RequiredBytes(absl::string_view key) const;
  Bytes OptionalBytes(absl::string_view key, Bytes default_value) const;
  Bytes AsBytes(Bytes default_value = Bytes::Zero()) const;
  // Durations: anything Duration::Parse accepts ("10ms", "1.5s", "0").
  Duration RequiredDuration(absl::string_view key) const;
  Duration OptionalDuration(absl::string_view key,
                            Duration default_value) const;
  Duration AsDuration(Duration default_value = Duration::Zero()) const;

  // --- Validation ------------------------------------------------------

  // Reports `message` for field `key` unless `condition` holds. The position
  // is the field's value when set, else this node (or its nearest present
  // ancestor). Works on absent readers too.
  void Check(bool condition, absl::string_view key,
             absl::string_view message) const;
  // Reports "must be positive, got V" for field `key` unless value > 0.
  // T: an arithmetic type, Bytes or Duration.
  template <typename T>
  void CheckPositive(absl::string_view key, const T& value) const {
    if (value > T{}) return;
    if constexpr (std::is_arithmetic_v<T>) {
      Check(false, key, absl::StrCat("must be positive, got ", value));
    } else {
      Check(false, key,
            absl::StrCat("must be positive, got ", value.ToString()));
    }
  }
  // Reports `message` about this node itself.
  void Error(absl::string_view message) const;

 private:
  // Result of looking a key up in this reader's map; defined in config.cc.
  struct Lookup;

  template <typename T>
  static constexpr void AssertSupported() {
    static_assert(std::is_same_v<T, std::string> ||
                      std::is_same_v<T, int64_t> || std::is_same_v<T, double> ||
                      std::is_same_v<T, bool>,
                  "ConfigReader supports std::string, int64_t, double and "
                  "bool; use the *Bytes/*Duration methods for units");
  }

  ConfigReader(YAML::Node node, bool present, YAML::Node anchor,
               std::string path, const ConfigReader& parent);

  std::string ChildPath(absl::string_view key) const;
  // Looks `key` up in this map; reports when present but not a map.
  Lookup Find(absl::string_view key) const;
  // The value under `key` when set and non-null; otherwise nullopt, after
  // reporting a missing or empty field if `required`. (Nodes are returned by
  // value, never assigned: YAML::Node::operator= writes into the tree.)
  std::optional<YAML::Node> FindValue(absl::string_view key,
                                      bool required) const;
  void Report(const YAML::Node& at, absl::string_view field_path,
              absl::string_view message) const;
  // Reports "expected a map, got ..." when present and not a map.
  bool RequireMap() const;
  // The node errors about this reader are reported at.
  const YAML::Node& PositionNode() const { return present_ ? node_ : anchor_; }

  void ReadField(absl::string_view key, bool required, std::string* out) const;
  void ReadField(absl::string_view key, bool required, int64_t* out) const;
  void ReadField(absl::string_view key, bool required, double* out) const;
  void ReadField(absl::string_view key, bool required, bool* out) const;
  void ReadSelf(std::string* out) const;
  void ReadSelf(int64_t* out) const;
  void ReadSelf(double* out) const;
  void ReadSelf(bool* out) const;

  template <typename T, typename Convert>
  void ReadFieldWith(absl::string_view key, bool required, T* out,
                     Convert convert) const;

  YAML::Node node_;  // null node when absent
  bool present_ = false;
  YAML::Node anchor_;  // node used for positions when this one is absent
  std::string path_;
  ConfigSource source_;
  ConfigErrors* errors_ = nullptr;
  bool quoted_scalars_ = false;  // AcceptQuotedScalars()
};

}  // namespace slicesched
