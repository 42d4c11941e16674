// slicesim's command-line plumbing, shared by its command groups: exit
// codes, typed flags, how a failure or a refused option is reported, and the
// command table each group registers its commands in.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace slicesim {

// Exit codes: 0 ok, 1 the command failed while running (an unreadable or
// malformed input file, a failed computation), 2 a usage error (an unknown
// command or option, a missing or bad option value).
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

// Prints a usage error of `command`; returns the exit code.
inline int UsageError(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "slicesim %s: %s\n", command.c_str(), message.c_str());
  return kExitUsage;
}

// Command-line flags of one command: "--name VALUE" pairs and "--name"
// switches, bound to variables. Parse() checks the syntax of every value
// against its flag's type (an integer, a number, one of the choices, given
// when required) and reports the first bad argument as a usage error naming
// the flag and the value; an int flag never truncates, a seed is never
// negative. Bounds are not checked here: the command's options struct
// checks them (its Validate(), reported through Rejected()), so that the
// library and the command line cannot disagree.
class Flags {
 public:
  explicit Flags(std::string command) : command_(std::move(command)) {}
  Flags& Switch(const char* name, bool* out) { return Add(name, Kind::kSwitch, out); }
  Flags& Text(const char* name, std::string* out) { return Add(name, Kind::kText, out); }
  Flags& Int(const char* name, int64_t* out) { return Add(name, Kind::kInt64, out); }
  // An int variable: values outside int's range are refused, not truncated.
  Flags& Int(const char* name, int* out) { return Add(name, Kind::kInt, out); }
  // A seed: a non-negative integer (the variable is unsigned).
  Flags& Seed(const char* name, uint64_t* out) { return Add(name, Kind::kSeed, out); }
  // A finite number ("nan" and "inf" are refused).
  Flags& Num(const char* name, double* out) { return Add(name, Kind::kNum, out); }
  // A text flag whose value must be one of `allowed` (the default in *out is
  // not checked).
  Flags& Choice(const char* name, std::vector<std::string> allowed, std::string* out) {
    Add(name, Kind::kText, out);
    flags_.back().allowed = std::move(allowed);
    return *this;
  }
  // The last flag added must be given.
  Flags& Required() {
    flags_.back().required = true;
    return *this;
  }

  // Returns 0 on success, else the exit code after printing the problem.
  int Parse(const std::vector<std::string>& args) {
    std::vector<bool> seen(flags_.size(), false);
    for (size_t i = 0; i < args.size(); ++i) {
      size_t k = 0;
      while (k < flags_.size() && args[i] != flags_[k].name) ++k;
      if (k == flags_.size()) return Error("unknown argument '" + args[i] + "'");
      const Flag& f = flags_[k];
      seen[k] = true;
      if (f.kind == Kind::kSwitch) {
        *static_cast<bool*>(f.out) = true;
        continue;
      }
      if (i + 1 >= args.size()) return Error(std::string(f.name) + " needs a value");
      if (std::string why = Store(f, args[++i]); !why.empty()) {
        return Error(std::string(f.name) + " " + why + ", got '" + args[i] + "'");
      }
    }
    for (size_t k = 0; k < flags_.size(); ++k) {
      if (flags_[k].required && !seen[k]) return Error(std::string(flags_[k].name) + " is required");
    }
    return 0;
  }

 private:
  enum class Kind { kSwitch, kText, kInt, kInt64, kSeed, kNum };
  struct Flag {
    const char* name;
    Kind kind;
    void* out;
    std::vector<std::string> allowed;  // Choice: the values accepted
    bool required = false;
  };
  // "a", "a or b", "a, b or c".
  static std::string OneOf(const std::vector<std::string>& values) {
    std::string text;
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) text += i + 1 == values.size() ? " or " : ", ";
      text += values[i];
    }
    return text;
  }
  // Converts and stores `v`; returns "" or what the value must be.
  static std::string Store(const Flag& f, const std::string& v) {
    if (f.kind == Kind::kText) {
      if (!f.allowed.empty() && std::find(f.allowed.begin(), f.allowed.end(), v) == f.allowed.end()) {
        return "must be " + OneOf(f.allowed);
      }
      *static_cast<std::string*>(f.out) = v;
      return "";
    }
    if (f.kind == Kind::kNum) {
      double x = 0;
      if (!absl::SimpleAtod(v, &x) || !std::isfinite(x)) return "needs a number";
      *static_cast<double*>(f.out) = x;
      return "";
    }
    int64_t n = 0;
    if (!absl::SimpleAtoi(v, &n)) return "needs an integer";
    switch (f.kind) {
      case Kind::kInt:
        if (n < std::numeric_limits<int>::min() || n > std::numeric_limits<int>::max()) {
          return absl::StrCat("needs an integer in ", std::numeric_limits<int>::min(), "..",
                              std::numeric_limits<int>::max());
        }
        *static_cast<int*>(f.out) = static_cast<int>(n);
        break;
      case Kind::kInt64: *static_cast<int64_t*>(f.out) = n; break;
      case Kind::kSeed:
        if (n < 0) return "must be at least 0";
        *static_cast<uint64_t*>(f.out) = static_cast<uint64_t>(n);
        break;
      case Kind::kNum:
      case Kind::kSwitch:
      case Kind::kText: break;
    }
    return "";
  }
  Flags& Add(const char* name, Kind kind, void* out) {
    flags_.push_back({name, kind, out, {}, false});
    return *this;
  }
  int Error(const std::string& message) const { return UsageError(command_, message); }
  std::string command_;
  std::vector<Flag> flags_;
};

// Prints a failed command's status; returns the exit code.
inline int Failed(const char* command, const absl::Status& status) {
  std::fprintf(stderr, "slicesim %s: %s\n", command, std::string(status.message()).c_str());
  return kExitFailed;
}

// Prints what a command's options struct refused (its Validate(), called
// before any work) and returns the exit code: an InvalidArgument is a bad
// option value, named with the value by the library, so a usage error (2);
// anything else a failure (1). Only Validate() results come here: an
// InvalidArgument from a run itself (a malformed trace, an unwritable output
// directory) goes to Failed(), the command line being well formed.
inline int Rejected(const char* command, const absl::Status& status) {
  if (status.code() != absl::StatusCode::kInvalidArgument) return Failed(command, status);
  std::fprintf(stderr, "slicesim %s: %s\n", command, std::string(status.message()).c_str());
  return kExitUsage;
}

// A command's entry point: its arguments after the command name; returns the
// exit code.
using CommandFn = int (*)(const std::vector<std::string>& args);

// Adds commands to the table. Each group of commands registers itself from a
// namespace-scope initialiser of its own file, so the groups a build links
// are the commands it has: slicesim's CMakeLists.txt adds the LibTorch groups
// only to a build with LibTorch. Returns true (for that initialiser); a name
// registered twice aborts.
bool RegisterCommands(std::initializer_list<std::pair<std::string_view, CommandFn>> commands);
// The command of that name, or nullptr when this build has none.
CommandFn FindCommand(std::string_view name);

}  // namespace slicesim
