// Internal to slicectl (cli/slicectl.h): the command line's parts, the
// output helpers and the connection, shared by slicectl.cc (parsing, the
// command table and RunSlicectl) and the command groups it dispatches to:
// slicectl_serving.cc (the daemon's state, the GMG, the timeline and
// serving), slicectl_jobs.cc (fine-tuning jobs) and slicectl_batch.cc
// (batch jobs).
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "google/protobuf/message.h"
#include "slicesched/cli/slicectl.h"
#include "slicesched/common/strings.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/batch.grpc.pb.h"
#include "slicesched/v1/finetune.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"

namespace slicesched::slicectl_internal {

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

struct Global {
  std::string socket = "/run/sliced/sliced.sock";
  std::string address;
  std::string tls_ca;
  std::string token;
  bool json = false;
  bool help = false;
  double timeout_s = 30;
  double connect_timeout_s = 5;
};

struct UsageError {
  std::string message;
};

// The command's own flags and positionals, after the global flags are taken.
class Args {
 public:
  Args(std::vector<std::string> words, std::vector<std::pair<std::string, std::string>> flags)
      : words_(std::move(words)), flags_(std::move(flags)) {}

  const std::vector<std::string>& words() const { return words_; }
  // Rejects flags not in `allowed` ("--x" takes a value, "--x!" is a switch).
  std::optional<UsageError> Check(const std::vector<std::string>& allowed, size_t min_words, size_t max_words,
                                  std::string_view command) const {
    for (const auto& [name, value] : flags_) {
      const bool known_value = std::find(allowed.begin(), allowed.end(), name) != allowed.end();
      const bool known_switch = std::find(allowed.begin(), allowed.end(), name + "!") != allowed.end();
      if (!known_value && !known_switch) return UsageError{StrCat(command, ": unknown flag '", name, "'")};
      if (known_value && value.empty()) return UsageError{StrCat(command, ": ", name, " needs a value")};
      if (known_switch && !value.empty()) return UsageError{StrCat(command, ": ", name, " takes no value")};
    }
    if (words_.size() < min_words) return UsageError{StrCat(command, ": missing argument")};
    if (words_.size() > max_words) {
      return UsageError{StrCat(command, ": unexpected argument '", words_[max_words], "'")};
    }
    return std::nullopt;
  }
  bool Has(std::string_view name) const {
    return std::any_of(flags_.begin(), flags_.end(), [&](const auto& f) { return f.first == name; });
  }
  std::string Get(std::string_view name, std::string def = "") const {
    for (const auto& [n, v] : flags_) {
      if (n == name) def = v;
    }
    return def;
  }

 private:
  std::vector<std::string> words_;
  std::vector<std::pair<std::string, std::string>> flags_;  // value "" for switches
};

template <typename T>
bool ParseNumber(const std::string& text, T* out) {
  if constexpr (std::is_floating_point_v<T>) {
    double d = 0;
    if (!absl::SimpleAtod(text, &d)) return false;
    *out = static_cast<T>(d);
    return true;
  } else {
    return absl::SimpleAtoi(text, out);
  }
}

// ---------------------------------------------------------------------------
// Output helpers
// ---------------------------------------------------------------------------

// protobuf's JSON mapping with the .proto field names and every field
// printed; `pretty` indents it over several lines, otherwise one line.
std::string ToJson(const google::protobuf::Message& m, bool pretty = true);
std::string HumanDuration(int64_t ms);
std::string Percent(double fraction);
std::string Fixed(double v, int digits);
// "SERVING_STATE_DRAINING" -> "DRAINING".
std::string EnumSuffix(const std::string& name, std::string_view prefix);
std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& kv);

// ---------------------------------------------------------------------------
// Connection and calls
// ---------------------------------------------------------------------------

class Client {
 public:
  Client(const Global& g, std::ostream& out, std::ostream& err) : g_(g), out_(out), err_(err) {}

  // kSlicectlOk, kSlicectlUsage (unreadable CA file) or kSlicectlCannotConnect.
  int Connect();
  void Prepare(grpc::ClientContext* ctx, bool deadline = true) const;
  // Prints a failed call; returns the exit code for it.
  int Fail(const grpc::Status& s) const;

  v1::Admin::Stub& admin() { return *admin_; }
  v1::Serving::Stub& serving() { return *serving_; }
  v1::FineTune::Stub& finetune() { return *finetune_; }
  v1::Batch::Stub& batch() { return *batch_; }
  bool json() const { return g_.json; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }

 private:
  const Global& g_;
  std::ostream& out_;
  std::ostream& err_;
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Admin::Stub> admin_;
  std::unique_ptr<v1::Serving::Stub> serving_;
  std::unique_ptr<v1::FineTune::Stub> finetune_;
  std::unique_ptr<v1::Batch::Stub> batch_;
};

// Unary call helper: prepares the context, calls, prints the error.
template <typename Stub, typename Req, typename Resp>
int Call(Client& c, Stub& stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*), const Req& req,
         Resp* resp) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx);
  const grpc::Status s = (stub.*method)(&ctx, req, resp);
  return s.ok() ? kSlicectlOk : c.Fail(s);
}

using Runner = std::function<int(Client&)>;
using Usage = std::optional<UsageError>;

// The command's positive id argument (its second word).
std::optional<uint64_t> PositiveId(const Args& a, std::string_view command, std::string_view what,
                                   Usage* error);

// ---------------------------------------------------------------------------
// Commands: each checks its arguments and makes the call to run (a Usage
// builder), or is the call itself when it takes no arguments. The command
// table in RunSlicectl (slicectl.cc) names their flags and words.
// ---------------------------------------------------------------------------

// slicectl_serving.cc
int Status(Client& c);
int Devices(Client& c);
int Deployments(Client& c);
int Instances(Client& c);
Usage Gmg(const Args& a, Runner* run);
Usage Timeline(const Args& a, Runner* run);
Usage Cancel(const Args& a, Runner* run);
Usage Generate(const Args& a, Runner* run);

// slicectl_jobs.cc
Usage Submit(const Args& a, Runner* run);
int Jobs(Client& c);
Usage Job(const Args& a, Runner* run);
Usage CancelJob(const Args& a, Runner* run);

// slicectl_batch.cc
Usage Batch(const Args& a, Runner* run);

}  // namespace slicesched::slicectl_internal
