#include "slicesched/cli/slicectl.h"

#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "slicesched/common/strings.h"
#include "slicesched/v1/admin.grpc.pb.h"
#include "slicesched/v1/finetune.grpc.pb.h"
#include "slicesched/v1/batch.grpc.pb.h"
#include "slicesched/v1/serving.grpc.pb.h"
#include "yaml-cpp/yaml.h"

namespace slicesched {

const char kSlicectlHelpText[] =
    "usage: slicectl [GLOBAL FLAGS] COMMAND [ARGS]\n"
    "\n"
    "Commands:\n"
    "  status                          daemon state, uptime, deployments, queues\n"
    "  devices                         devices: memory, queue, running node, busy fraction\n"
    "  deployments                     registered deployments\n"
    "  instances                       graph instances in the GMG (from DumpGmg)\n"
    "  generate DEPLOYMENT --prompt \"1 2 3\" --max-tokens N [--seed S] [--top-p P]\n"
    "          [--temperature T] [--top-k K] [--offline]\n"
    "                                  stream generated token ids (Serving.Generate)\n"
    "  submit JOB.yaml [--tenant T] [--validate-only]\n"
    "                                  submit a fine-tuning job (FineTune.SubmitJob)\n"
    "  jobs                            fine-tuning jobs\n"
    "  job ID                          one job with its event log\n"
    "  cancel-job ID [--reason TEXT]   cancel a fine-tuning job (FineTune.CancelJob); a finished\n"
    "                                  job keeps its state, which is printed\n"
    "  cancel INSTANCE_ID              cancel a graph instance (Serving.Cancel)\n"
    "  batch submit FILE.jsonl [--deployment NAME] [--strict] [--completion-window 24h]\n"
    "          [--tenant T] [--validate-only]\n"
    "                                  submit a batch of requests (OpenAI Batch format)\n"
    "  batch list                      batch jobs\n"
    "  batch get ID                    one batch: progress, tokens, ETA at the current rate\n"
    "  batch results ID                the output file (JSONL) on stdout\n"
    "  batch cancel ID [--reason TEXT] cancel a batch; its finished results are kept\n"
    "  gmg dump [--format json|dot]    the Global Mapping Graph (default json)\n"
    "  timeline [--out FILE] [--since-ns N] [--until-ns N] [--max-events N]\n"
    "                                  Chrome trace of recent operators (chrome://tracing, Perfetto)\n"
    "\n"
    "Global flags:\n"
    "  --socket PATH          daemon unix socket (default /run/sliced/sliced.sock)\n"
    "  --address HOST:PORT    connect over TCP with TLS instead\n"
    "  --tls-ca FILE          CA certificate (PEM) for --address (default: system roots)\n"
    "  --token TOKEN          admin token (sent as 'authorization: Bearer TOKEN')\n"
    "  --json                 JSON output\n"
    "  --timeout SECONDS      per-call deadline (default 30; generate: none)\n"
    "  --connect-timeout SECONDS  how long to wait for the connection (default 5)\n"
    "  --help                 this text\n"
    "\n"
    "Exit codes: 0 ok, 1 server error, 2 usage error, 3 cannot connect.\n";

namespace {

namespace v1 = ::slicesched::v1;

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

// Command flags that take a value (the next word, or "--flag=value"). Any
// other "--x" is recorded as a switch; Args::Check decides whether the
// command knows it.
bool TakesValue(std::string_view flag) {
  static const char* const kValued[] = {"--prompt",     "--max-tokens", "--seed",       "--top-p",
                                        "--top-k",      "--temperature", "--tenant",      "--format",
                                        "--out",        "--since-ns",    "--until-ns",    "--max-events",
                                        "--reason",     "--deployment",  "--completion-window"};
  return std::any_of(std::begin(kValued), std::end(kValued), [&](const char* v) { return flag == v; });
}

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

// Splits `args` into global flags, the command words and the command flags.
std::optional<UsageError> ParseCommandLine(const std::vector<std::string>& args, Global* g,
                                           std::vector<std::string>* words,
                                           std::vector<std::pair<std::string, std::string>>* flags) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string value;
    bool inline_value = false;
    if (a.rfind("--", 0) == 0) {
      if (const size_t eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        inline_value = true;
      }
    }
    auto next = [&](std::string* v) -> std::optional<UsageError> {
      if (inline_value) {
        *v = value;
      } else if (i + 1 < args.size()) {
        *v = args[++i];
      } else {
        return UsageError{StrCat(a, " needs a value")};
      }
      if (v->empty()) return UsageError{StrCat(a, " needs a non-empty value")};
      return std::nullopt;
    };
    auto number = [&](double* v) -> std::optional<UsageError> {
      std::string text;
      if (auto e = next(&text)) return e;
      if (!ParseNumber(text, v) || *v <= 0)
        return UsageError{StrCat(a, ": expected a positive number, got '", text, "'")};
      return std::nullopt;
    };
    std::optional<UsageError> e;
    if (a == "--help" || a == "-h") {
      g->help = true;
    } else if (a == "--json") {
      g->json = true;
    } else if (a == "--socket") {
      e = next(&g->socket);
    } else if (a == "--address") {
      e = next(&g->address);
    } else if (a == "--tls-ca") {
      e = next(&g->tls_ca);
    } else if (a == "--token") {
      e = next(&g->token);
    } else if (a == "--timeout") {
      e = number(&g->timeout_s);
    } else if (a == "--connect-timeout") {
      e = number(&g->connect_timeout_s);
    } else if (a.rfind("--", 0) == 0 && a.size() > 2) {
      std::string v;
      if (TakesValue(a)) {
        e = next(&v);
      } else if (inline_value) {
        v = value.empty() ? "=" : value;  // a switch given a value: Check reports it
      }
      flags->emplace_back(a, v);
    } else if (a.size() > 1 && a[0] == '-' && !absl::ascii_isdigit(static_cast<unsigned char>(a[1]))) {
      e = UsageError{StrCat("unknown flag '", a, "'")};
    } else {
      words->push_back(a);
    }
    if (e) return e;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Output helpers
// ---------------------------------------------------------------------------

// protobuf's JSON mapping with the .proto field names and every field
// printed; `pretty` indents it over several lines, otherwise one line.
std::string ToJson(const google::protobuf::Message& m, bool pretty = true) {
  google::protobuf::util::JsonPrintOptions o;
  o.add_whitespace = pretty;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

std::string HumanDuration(int64_t ms) {
  if (ms < 1000) return StrCat(ms, "ms");
  int64_t s = ms / 1000;
  const int64_t h = s / 3600, m = (s / 60) % 60;
  s %= 60;
  char buf[48];
  if (h > 0) {
    std::snprintf(buf, sizeof(buf), "%lldh%02lldm%02llds", static_cast<long long>(h), static_cast<long long>(m),
                  static_cast<long long>(s));
  } else if (m > 0) {
    std::snprintf(buf, sizeof(buf), "%lldm%02llds", static_cast<long long>(m), static_cast<long long>(s));
  } else {
    std::snprintf(buf, sizeof(buf), "%.1fs", static_cast<double>(ms) / 1000.0);
  }
  return buf;
}

std::string Percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100.0 * fraction);
  return buf;
}

std::string Fixed(double v, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

// "SERVING_STATE_DRAINING" -> "DRAINING".
std::string EnumSuffix(const std::string& name, std::string_view prefix) {
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::string KeyValues(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::vector<std::vector<std::string>> rows;
  for (const auto& [k, v] : kv) rows.push_back({k, v});
  return FormatTable({}, rows);
}

// ---------------------------------------------------------------------------
// Connection and calls
// ---------------------------------------------------------------------------

class Client {
 public:
  Client(const Global& g, std::ostream& out, std::ostream& err) : g_(g), out_(out), err_(err) {}

  // kSlicectlOk, kSlicectlUsage (unreadable CA file) or kSlicectlCannotConnect.
  int Connect() {
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (!g_.address.empty()) {
      grpc::SslCredentialsOptions ssl;
      if (!g_.tls_ca.empty()) {
        std::ifstream in(g_.tls_ca, std::ios::binary);
        std::ostringstream ss;
        ss << in.rdbuf();
        if (!in || ss.str().empty()) {
          err_ << "slicectl: --tls-ca: cannot read '" << g_.tls_ca << "'\n";
          return kSlicectlUsage;
        }
        ssl.pem_root_certs = ss.str();
      }
      creds = grpc::SslCredentials(ssl);
      target_ = g_.address;
    } else {
      struct stat st {};
      if (::stat(g_.socket.c_str(), &st) != 0) {
        err_ << "slicectl: cannot connect to unix:" << g_.socket
             << ": no such socket (is sliced running? see --socket)\n";
        return kSlicectlCannotConnect;
      }
      if (!S_ISSOCK(st.st_mode)) {
        err_ << "slicectl: cannot connect to unix:" << g_.socket << ": not a socket\n";
        return kSlicectlCannotConnect;
      }
      creds = grpc::InsecureChannelCredentials();
      target_ = "unix:" + g_.socket;
    }
    channel_ = grpc::CreateChannel(target_, creds);
    const auto deadline =
        std::chrono::system_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(g_.connect_timeout_s * 1000));
    if (!channel_->WaitForConnected(deadline)) {
      err_ << "slicectl: cannot connect to " << target_ << " within " << g_.connect_timeout_s
           << " s (nothing listening, or the TLS handshake failed)\n";
      return kSlicectlCannotConnect;
    }
    admin_ = v1::Admin::NewStub(channel_);
    serving_ = v1::Serving::NewStub(channel_);
    finetune_ = v1::FineTune::NewStub(channel_);
    batch_ = v1::Batch::NewStub(channel_);
    return kSlicectlOk;
  }

  void Prepare(grpc::ClientContext* ctx, bool deadline = true) const {
    if (!g_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + g_.token);
    if (deadline) {
      ctx->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(g_.timeout_s * 1000)));
    }
  }

  // Prints a failed call; returns the exit code for it.
  int Fail(const grpc::Status& s) const {
    std::string message = s.error_message();
    if (message.empty()) {
      message = s.error_code() == grpc::StatusCode::UNIMPLEMENTED ? "the daemon does not implement this call yet"
                                                                  : "(no message)";
    }
    err_ << "slicectl: " << GrpcCodeName(s.error_code()) << ": " << message << "\n";
    return kSlicectlServerError;
  }

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

// ---------------------------------------------------------------------------
// Commands
// ---------------------------------------------------------------------------

int Status(Client& c) {
  v1::StatusResponse r;
  if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Status, v1::StatusRequest(), &r)) return rc;
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  c.out() << KeyValues({
      {"version", r.version()},
      {"state", EnumSuffix(v1::ServingState_Name(r.state()), "SERVING_STATE_")},
      {"uptime", HumanDuration(r.uptime_ms())},
      {"devices", StrCat(r.num_devices())},
      {"deployments", r.deployments().empty() ? "-" : absl::StrJoin(r.deployments(), ", ")},
      {"live instances",
       StrCat(r.live_instances(), " (queued: ", r.queued_online(), " online, ", r.queued_offline(), " offline)")},
      {"jobs", StrCat(r.jobs_running(), " running, ", r.jobs_queued(), " queued")},
      {"policy", r.policy()},
      {"state dir", r.state_dir()},
  });
  // The runtime calibration: what the simulator multiplies its predictions by.
  const v1::Calibration& cal = r.calibration();
  if (cal.devices().empty()) return kSlicectlOk;
  std::vector<std::vector<std::string>> rows;
  auto row = [&rows](const std::string& name, const v1::CalibrationFactor& f, const std::string& drift,
                     const std::string& ops, const std::string& busy) {
    rows.push_back({name, absl::StrFormat("%.3f", f.factor()), drift, absl::StrFormat("%.3f", f.raw()),
                    absl::StrFormat("%.3f", f.weight()), StrCat(f.samples()), ops, busy});
  };
  for (const v1::DeviceCalibration& d : cal.devices()) {
    row(d.name().empty() ? StrCat("device ", d.device()) : d.name(), d.speed(),
        absl::StrFormat("%.3f", d.has_drift() ? d.drift().factor() : 1.0), StrCat(d.operators()),
        absl::StrFormat("%.1f s", d.busy_seconds()));
  }
  row("overlap", cal.overlap(), "-", "-", "-");
  row("transfer overlap", cal.transfer_overlap(), "-", "-", "-");
  c.out() << "\ncalibration (speed factor per device within its type, > 1 slower, times its type's drift; "
             "overlap slowdowns)\n"
          << FormatTable({"FACTOR OF", "VALUE", "DRIFT", "RAW", "WEIGHT", "SAMPLES", "OPERATORS", "BUSY"}, rows);
  return kSlicectlOk;
}

int Devices(Client& c) {
  v1::DevicesResponse r;
  if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Devices, v1::DevicesRequest(), &r)) return rc;
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::DeviceStatus& d : r.devices()) {
    const v1::DeviceMemory& m = d.memory();
    const int64_t used = m.weights_bytes() + m.activations_bytes() + m.workspace_bytes() + m.checkpoints_bytes();
    rows.push_back({StrCat(d.device().id()), d.device().name(), d.device().type(), d.device().backend(),
                    StrCat(HumanBytes(used), " / ", HumanBytes(d.device().memory_bytes())), StrCat(d.queue_length()),
                    d.running_node() == 0 ? "-" : StrCat(d.running_node()), Percent(d.busy_fraction()),
                    d.healthy() || d.error().empty() ? "ok" : d.error()});
  }
  c.out() << FormatTable({"ID", "NAME", "TYPE", "BACKEND", "MEMORY", "QUEUE", "RUNNING", "BUSY", "HEALTH"}, rows);
  return kSlicectlOk;
}

int Deployments(Client& c) {
  v1::ListDeploymentsResponse r;
  if (int rc = Call(c, c.serving(), &v1::Serving::Stub::ListDeployments, v1::ListDeploymentsRequest(), &r)) {
    return rc;
  }
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Deployment& d : r.deployments()) {
    const v1::DeploymentSpec& s = d.spec();
    const std::string model = s.model().has_llama() ? s.model().llama().name() : s.model().preset();
    std::vector<std::string> parts;
    for (const v1::Partition& p : d.info().partitions()) parts.push_back(p.name());
    rows.push_back({s.name(), model,
                    absl::AsciiStrToLower(EnumSuffix(v1::DeploymentRole_Name(s.role()), "DEPLOYMENT_ROLE_")),
                    absl::StrJoin(parts, ","), HumanBytes(d.info().weight_bytes()),
                    StrCat(d.info().prefill_template(), " ", d.info().decode_template())});
  }
  c.out() << FormatTable({"NAME", "MODEL", "ROLE", "PARTITIONS", "WEIGHTS", "TEMPLATES"}, rows);
  return kSlicectlOk;
}

int DumpGmg(Client& c, v1::GmgDump* dump) {
  return Call(c, c.admin(), &v1::Admin::Stub::DumpGmg, v1::DumpGmgRequest(), dump);
}

int Instances(Client& c) {
  v1::GmgDump d;
  if (int rc = DumpGmg(c, &d)) return rc;
  if (c.json()) {
    v1::GmgDump only;
    only.set_taken_at_ns(d.taken_at_ns());
    *only.mutable_instances() = d.instances();
    c.out() << ToJson(only);
    return kSlicectlOk;
  }
  std::map<uint64_t, std::pair<int, int>> ops;  // instance -> done, total (operators only)
  for (const v1::Node& n : d.nodes()) {
    if (n.op() == "transfer") continue;
    auto& [done, total] = ops[n.instance()];
    ++total;
    done += n.state() == v1::NODE_STATE_DONE ? 1 : 0;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Instance& i : d.instances()) {
    const auto [done, total] = ops[i.id()];
    rows.push_back({StrCat(i.id()), i.template_name(), i.priority_class(), StrCat(i.priority()), i.state(),
                    StrCat(done, "/", total), HumanDuration((d.taken_at_ns() - i.arrival_ns()) / 1000000),
                    i.deadline_ns() == 0 ? "-" : HumanDuration((i.deadline_ns() - d.taken_at_ns()) / 1000000),
                    i.label().empty() ? "-" : i.label()});
  }
  c.out() << FormatTable({"ID", "TEMPLATE", "CLASS", "PRIO", "STATE", "OPS", "AGE", "DEADLINE IN", "LABEL"}, rows);
  return kSlicectlOk;
}

using Runner = std::function<int(Client&)>;
using Usage = std::optional<UsageError>;

Usage Gmg(const Args& a, Runner* run) {
  if (a.words()[1] != "dump") return UsageError{StrCat("gmg: unknown subcommand '", a.words()[1], "' (expected dump)")};
  const std::string format = a.Get("--format", "json");
  if (format != "json" && format != "dot") {
    return UsageError{StrCat("gmg dump: --format must be json or dot, got '", format, "'")};
  }
  *run = [format](Client& c) {
    v1::GmgDump d;
    if (int rc = DumpGmg(c, &d)) return rc;
    c.out() << (format == "dot" ? GmgDumpToDot(d) : ToJson(d));
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

Usage Timeline(const Args& a, Runner* run) {
  v1::TimelineRequest req;
  req.set_format(v1::TIMELINE_FORMAT_CHROME_TRACE);
  for (const char* flag : {"--since-ns", "--until-ns", "--max-events"}) {
    if (!a.Has(flag)) continue;
    int64_t v = 0;
    const bool max = std::string_view(flag) == "--max-events";
    if (!ParseNumber(a.Get(flag), &v) || v < 0 || (max && v > 0xffffffffLL)) {
      return UsageError{StrCat("timeline: ", flag, ": expected a number >= 0, got '", a.Get(flag), "'")};
    }
    if (max) {
      req.set_max_events(static_cast<uint32_t>(v));
    } else if (std::string_view(flag) == "--since-ns") {
      req.set_since_ns(v);
    } else {
      req.set_until_ns(v);
    }
  }
  *run = [req, path = a.Get("--out")](Client& c) {
    v1::TimelineResponse r;
    if (int rc = Call(c, c.admin(), &v1::Admin::Stub::Timeline, req, &r)) return rc;
    if (r.truncated()) c.err() << "slicectl: timeline truncated to the most recent events (see --max-events)\n";
    if (path.empty()) {
      c.out() << r.chrome_trace_json();
      return static_cast<int>(kSlicectlOk);
    }
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << r.chrome_trace_json();
    f.close();
    if (!f) {
      c.err() << "slicectl: timeline: cannot write '" << path << "'\n";
      return static_cast<int>(kSlicectlUsage);
    }
    c.out() << "wrote " << r.chrome_trace_json().size() << " bytes to " << path << "\n";
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

// The command's positive id argument (its second word).
std::optional<uint64_t> PositiveId(const Args& a, std::string_view command, std::string_view what,
                                   Usage* error) {
  uint64_t id = 0;
  if (!ParseNumber(a.words()[1], &id) || id == 0) {
    *error = UsageError{StrCat(command, ": ", what, " must be a positive number, got '", a.words()[1], "'")};
    return std::nullopt;
  }
  return id;
}

Usage Cancel(const Args& a, Runner* run) {
  Usage error;
  const std::optional<uint64_t> parsed = PositiveId(a, "cancel", "INSTANCE_ID", &error);
  if (!parsed) return error;
  const uint64_t id = *parsed;
  *run = [id](Client& c) {
    v1::CancelRequest req;
    req.set_instance_id(id);
    v1::CancelResponse r;
    if (int rc = Call(c, c.serving(), &v1::Serving::Stub::Cancel, req, &r)) return rc;
    if (c.json()) {
      c.out() << ToJson(r);
    } else {
      c.out() << "instance " << id << ": " << EnumSuffix(v1::InstanceState_Name(r.state()), "INSTANCE_STATE_") << "\n";
    }
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

int StreamGenerate(Client& c, const v1::GenerateRequest& req);

Usage Generate(const Args& a, Runner* run) {
  v1::GenerateRequest req;
  req.set_deployment(a.words()[1]);
  if (!a.Has("--prompt")) return UsageError{"generate: --prompt \"TOKEN TOKEN ...\" is required"};
  for (absl::string_view t : absl::StrSplit(a.Get("--prompt"), absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    uint32_t id = 0;
    if (!absl::SimpleAtoi(t, &id)) {
      return UsageError{StrCat("generate: --prompt: token ids are numbers, got '", ToStd(t), "'")};
    }
    req.add_prompt_token_ids(id);
  }
  if (req.prompt_token_ids().empty()) return UsageError{"generate: --prompt: no token ids"};
  uint32_t max_tokens = 0;
  if (!ParseNumber(a.Get("--max-tokens"), &max_tokens) || max_tokens == 0) {
    return UsageError{StrCat("generate: --max-tokens N (>= 1) is required, got '", a.Get("--max-tokens"), "'")};
  }
  req.set_max_tokens(max_tokens);
  v1::SamplingParams* sp = req.mutable_sampling();
  if (a.Has("--seed")) {
    uint64_t seed = 0;
    if (!ParseNumber(a.Get("--seed"), &seed))
      return UsageError{StrCat("generate: --seed: not a number: '", a.Get("--seed"), "'")};
    sp->set_seed(seed);
  }
  if (a.Has("--top-p")) {
    float p = 0;
    if (!ParseNumber(a.Get("--top-p"), &p) || p < 0 || p > 1) {
      return UsageError{StrCat("generate: --top-p: expected 0..1, got '", a.Get("--top-p"), "'")};
    }
    sp->set_top_p(p);
  }
  if (a.Has("--top-k")) {
    uint32_t k = 0;
    if (!ParseNumber(a.Get("--top-k"), &k))
      return UsageError{StrCat("generate: --top-k: not a number: '", a.Get("--top-k"), "'")};
    sp->set_top_k(k);
  }
  if (a.Has("--temperature")) {
    float t = 0;
    if (!ParseNumber(a.Get("--temperature"), &t) || t < 0) {
      return UsageError{StrCat("generate: --temperature: expected >= 0, got '", a.Get("--temperature"), "'")};
    }
    sp->set_temperature(t);
  }
  if (a.Has("--offline")) req.set_priority_class(v1::PRIORITY_CLASS_OFFLINE);

  *run = [req](Client& c) { return StreamGenerate(c, req); };
  return std::nullopt;
}

int StreamGenerate(Client& c, const v1::GenerateRequest& req) {
  grpc::ClientContext ctx;
  c.Prepare(&ctx, /*deadline=*/false);
  auto reader = c.serving().Generate(&ctx, req);
  v1::GenerateResponse r;
  int n = 0;
  double first_ms = 0, last_ms = 0;
  std::string finish;
  while (reader->Read(&r)) {
    if (c.json()) {
      c.out() << ToJson(r, /*pretty=*/false) << "\n";
    } else {
      c.out() << (n == 0 ? "" : " ") << r.token_id();
    }
    c.out().flush();
    if (n == 0) first_ms = r.time_from_arrival_ms();
    last_ms = r.time_from_arrival_ms();
    ++n;
    if (r.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      finish = EnumSuffix(v1::FinishReason_Name(r.finish_reason()), "FINISH_REASON_");
      if (r.finish_reason() == v1::FINISH_REASON_ERROR) finish += ": " + r.error_message();
    }
  }
  const grpc::Status s = reader->Finish();
  if (!c.json() && n > 0) {
    c.out() << "\n"
            << n << " tokens, finish " << (finish.empty() ? "?" : finish) << ", first token " << Fixed(first_ms, 1)
            << " ms, last " << Fixed(last_ms, 1) << " ms\n";
  }
  return s.ok() ? kSlicectlOk : c.Fail(s);
}

// The daemon names a job's positions "<job>:LINE:COL"; for a file, the
// file's path says where to look.
grpc::Status NameJobFile(const grpc::Status& s, const std::string& path) {
  if (s.ok()) return s;
  return grpc::Status(s.error_code(), absl::StrReplaceAll(s.error_message(), {{"<job>:", path + ":"}}));
}

Usage Submit(const Args& a, Runner* run) {
  const std::string& path = a.words()[1];
  std::error_code ec;
  // A directory opens as a stream on Linux and reads as nothing: say what it is.
  if (std::filesystem::is_directory(path, ec)) {
    return UsageError{StrCat("submit: '", path, "' is a directory; expected a job YAML file")};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return UsageError{StrCat("submit: cannot read '", path, "': ", std::strerror(errno))};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return UsageError{StrCat("submit: cannot read '", path, "'")};
  if (ss.str().empty()) return UsageError{StrCat("submit: '", path, "' is empty; expected a job YAML file")};
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  v1::SubmitJobRequest req;
  req.set_yaml(ec ? ss.str() : AnchorJobDatasetPath(ss.str(), abs.parent_path().string()));
  req.set_tenant(a.Get("--tenant"));
  req.set_validate_only(a.Has("--validate-only"));
  *run = [req, path](Client& c) {
    v1::SubmitJobResponse r;
    grpc::ClientContext ctx;
    c.Prepare(&ctx);
    if (const grpc::Status s = c.finetune().SubmitJob(&ctx, req, &r); !s.ok()) return c.Fail(NameJobFile(s, path));
    if (c.json()) {
      c.out() << ToJson(r);
      return static_cast<int>(kSlicectlOk);
    }
    c.out() << (req.validate_only() ? std::string("valid") : StrCat("job ", r.job_id(), " submitted")) << "\n";
    for (const std::string& w : r.warnings()) c.out() << "warning: " << w << "\n";
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

std::string JobState(v1::JobState s) { return absl::AsciiStrToLower(EnumSuffix(v1::JobState_Name(s), "JOB_STATE_")); }

int Jobs(Client& c) {
  v1::ListJobsRequest req;
  v1::ListJobsResponse all;
  while (true) {
    v1::ListJobsResponse page;
    if (int rc = Call(c, c.finetune(), &v1::FineTune::Stub::ListJobs, req, &page)) return rc;
    for (const v1::Job& j : page.jobs()) *all.add_jobs() = j;
    if (page.next_page_token().empty()) break;
    req.set_page_token(page.next_page_token());
  }
  if (c.json()) {
    c.out() << ToJson(all);
    return kSlicectlOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const v1::Job& j : all.jobs()) {
    rows.push_back({StrCat(j.id()), j.name(), j.tenant(), JobState(j.state()),
                    StrCat(j.iterations_done(), "/", j.iterations_target()), Fixed(j.last_loss(), 4),
                    j.message().empty() ? "-" : j.message()});
  }
  c.out() << FormatTable({"ID", "NAME", "TENANT", "STATE", "ITERATIONS", "LOSS", "MESSAGE"}, rows);
  return kSlicectlOk;
}

int ShowJob(Client& c, uint64_t id);

Usage Job(const Args& a, Runner* run) {
  Usage error;
  const std::optional<uint64_t> id = PositiveId(a, "job", "ID", &error);
  if (!id) return error;
  *run = [id = *id](Client& c) { return ShowJob(c, id); };
  return std::nullopt;
}

Usage CancelJob(const Args& a, Runner* run) {
  Usage error;
  const std::optional<uint64_t> id = PositiveId(a, "cancel-job", "ID", &error);
  if (!id) return error;
  v1::CancelJobRequest req;
  req.set_job_id(*id);
  req.set_reason(a.Get("--reason", "cancelled with slicectl"));
  *run = [req](Client& c) {
    v1::CancelJobResponse r;
    if (int rc = Call(c, c.finetune(), &v1::FineTune::Stub::CancelJob, req, &r)) return rc;
    if (c.json()) {
      c.out() << ToJson(r);
    } else {
      c.out() << "job " << req.job_id() << ": " << JobState(r.job().state()) << "\n";
    }
    return static_cast<int>(kSlicectlOk);
  };
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Batch jobs

std::string BatchStateName(v1::BatchState s) {
  return absl::AsciiStrToLower(EnumSuffix(v1::BatchState_Name(s), "BATCH_STATE_"));
}

std::string BatchProgressText(const v1::BatchJob& b) {
  const int64_t done = b.succeeded() + b.failed();
  return StrCat(done, "/", b.total(), b.failed() > 0 ? StrCat(" (", b.failed(), " failed)") : "");
}

int ShowBatch(Client& c, const v1::BatchJob& b) {
  if (c.json()) {
    c.out() << ToJson(b);
    return kSlicectlOk;
  }
  c.out() << KeyValues({
      {"id", StrCat(b.id())},
      {"state", BatchStateName(b.state())},
      {"deployment", b.deployment().empty() ? "(per line)" : b.deployment()},
      {"tenant", b.tenant()},
      {"done", BatchProgressText(b)},
      {"rejected lines", StrCat(b.rejected())},
      {"tokens", StrCat(b.prompt_tokens(), " prompt, ", b.completion_tokens(), " generated")},
      {"rate", StrCat(Fixed(b.tokens_per_second(), 2), " tok/s since submit")},
      {"eta", b.eta_s() < 0 ? std::string("-") : HumanDuration(static_cast<int64_t>(b.eta_s() * 1000))},
      {"completion window", b.completion_window_s() == 0 ? std::string("none")
                                                          : HumanDuration(b.completion_window_s() * 1000)},
      {"message", b.message().empty() ? "-" : b.message()},
  });
  return kSlicectlOk;
}

Usage Batch(const Args& a, Runner* run) {
  const std::string& sub = a.words()[1];
  auto only = [&](std::initializer_list<const char*> allowed, size_t words) -> Usage {
    if (a.words().size() != words) {
      return UsageError{StrCat("batch ", sub, ": expected ", words - 2, " argument(s) after '", sub, "'")};
    }
    for (const char* f : {"--deployment", "--strict", "--completion-window", "--tenant", "--validate-only",
                          "--reason"}) {
      if (a.Has(f) && std::find_if(allowed.begin(), allowed.end(), [&](const char* x) {
                        return std::string_view(x) == f;
                      }) == allowed.end()) {
        return UsageError{StrCat("batch ", sub, ": unknown flag '", f, "'")};
      }
    }
    return std::nullopt;
  };
  auto id_of = [&](Usage* error) -> std::optional<uint64_t> {
    uint64_t id = 0;
    if (!ParseNumber(a.words()[2], &id) || id == 0) {
      *error = UsageError{StrCat("batch ", sub, ": ID must be a positive number, got '", a.words()[2], "'")};
      return std::nullopt;
    }
    return id;
  };
  Usage error;
  if (sub == "submit") {
    if (auto e = only({"--deployment", "--strict", "--completion-window", "--tenant", "--validate-only"}, 3)) return e;
    const std::string path = a.words()[2];
    std::error_code ec;
    if (std::filesystem::is_directory(path, ec)) {
      return UsageError{StrCat("batch submit: '", path, "' is a directory; expected a JSONL file")};
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return UsageError{StrCat("batch submit: cannot read '", path, "': ", std::strerror(errno))};
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) return UsageError{StrCat("batch submit: cannot read '", path, "'")};
    v1::SubmitBatchChunk head;
    head.set_deployment(a.Get("--deployment"));
    head.set_strict(a.Has("--strict"));
    head.set_completion_window(a.Get("--completion-window"));
    head.set_tenant(a.Get("--tenant"));
    head.set_validate_only(a.Has("--validate-only"));
    *run = [head, data = ss.str(), path](Client& c) {
      v1::SubmitBatchResponse r;
      grpc::ClientContext ctx;
      c.Prepare(&ctx);
      auto writer = c.batch().Submit(&ctx, &r);
      // 1 MiB pieces: a file of any size stays under the message limit.
      constexpr size_t kChunk = size_t{1} << 20;
      size_t pos = 0;
      v1::SubmitBatchChunk chunk = head;
      do {
        chunk.set_data(data.substr(pos, kChunk));
        pos += kChunk;
        if (!writer->Write(chunk)) break;
        chunk = v1::SubmitBatchChunk();
      } while (pos < data.size());
      writer->WritesDone();
      if (const grpc::Status s = writer->Finish(); !s.ok()) {
        return c.Fail(grpc::Status(s.error_code(), StrCat(path, ": ", s.error_message())));
      }
      if (c.json()) {
        c.out() << ToJson(r);
        return static_cast<int>(kSlicectlOk);
      }
      c.out() << (head.validate_only() ? StrCat("valid: ", r.accepted(), " request(s)")
                                       : StrCat("batch ", r.batch().id(), " submitted: ", r.accepted(), " request(s)"))
              << (r.rejected() > 0 ? StrCat(", ", r.rejected(), " line(s) left out") : "") << "\n";
      for (const std::string& l : r.rejected_lines()) c.out() << "  " << path << ": " << l << "\n";
      return static_cast<int>(kSlicectlOk);
    };
    return std::nullopt;
  }
  if (sub == "list") {
    if (auto e = only({}, 2)) return e;
    *run = [](Client& c) {
      v1::ListBatchesRequest req;
      v1::ListBatchesResponse all;
      while (true) {
        v1::ListBatchesResponse page;
        if (int rc = Call(c, c.batch(), &v1::Batch::Stub::List, req, &page)) return rc;
        for (const v1::BatchJob& b : page.batches()) *all.add_batches() = b;
        if (page.next_page_token().empty()) break;
        req.set_page_token(page.next_page_token());
      }
      if (c.json()) {
        c.out() << ToJson(all);
        return static_cast<int>(kSlicectlOk);
      }
      std::vector<std::vector<std::string>> rows;
      for (const v1::BatchJob& b : all.batches()) {
        rows.push_back({StrCat(b.id()), BatchStateName(b.state()), b.deployment().empty() ? "-" : b.deployment(),
                        BatchProgressText(b), StrCat(b.completion_tokens()),
                        b.eta_s() < 0 ? std::string("-") : HumanDuration(static_cast<int64_t>(b.eta_s() * 1000))});
      }
      c.out() << FormatTable({"ID", "STATE", "DEPLOYMENT", "DONE", "TOKENS", "ETA"}, rows);
      return static_cast<int>(kSlicectlOk);
    };
    return std::nullopt;
  }
  if (sub == "get" || sub == "cancel") {
    if (auto e = only(sub == "cancel" ? std::initializer_list<const char*>{"--reason"}
                                      : std::initializer_list<const char*>{},
                      3)) {
      return e;
    }
    const std::optional<uint64_t> id = id_of(&error);
    if (!id) return error;
    const std::string reason = a.Get("--reason", "cancelled with slicectl");
    const bool cancel = sub == "cancel";
    *run = [id = *id, reason, cancel](Client& c) {
      v1::BatchJob b;
      if (cancel) {
        v1::CancelBatchRequest req;
        req.set_batch_id(id);
        req.set_reason(reason);
        if (int rc = Call(c, c.batch(), &v1::Batch::Stub::Cancel, req, &b)) return rc;
      } else {
        v1::GetBatchRequest req;
        req.set_batch_id(id);
        if (int rc = Call(c, c.batch(), &v1::Batch::Stub::Get, req, &b)) return rc;
      }
      return ShowBatch(c, b);
    };
    return std::nullopt;
  }
  if (sub == "results") {
    if (auto e = only({}, 3)) return e;
    const std::optional<uint64_t> id = id_of(&error);
    if (!id) return error;
    *run = [id = *id](Client& c) {
      grpc::ClientContext ctx;
      c.Prepare(&ctx, /*deadline=*/false);
      v1::BatchResultsRequest req;
      req.set_batch_id(id);
      auto reader = c.batch().Results(&ctx, req);
      v1::BatchResultsChunk chunk;
      while (reader->Read(&chunk)) c.out() << chunk.data();
      c.out().flush();
      if (const grpc::Status s = reader->Finish(); !s.ok()) return c.Fail(s);
      return static_cast<int>(kSlicectlOk);
    };
    return std::nullopt;
  }
  return UsageError{StrCat("batch: unknown subcommand '", sub, "' (submit, list, get, results, cancel)")};
}

int ShowJob(Client& c, uint64_t id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  req.set_include_events(true);
  v1::GetJobResponse r;
  if (int rc = Call(c, c.finetune(), &v1::FineTune::Stub::GetJob, req, &r)) return rc;
  if (c.json()) {
    c.out() << ToJson(r);
    return kSlicectlOk;
  }
  const v1::Job& j = r.job();
  std::vector<std::string> devices;
  for (uint32_t d : j.devices()) devices.push_back(StrCat(d));
  c.out() << KeyValues({{"id", StrCat(j.id())},
                        {"name", j.name()},
                        {"tenant", j.tenant()},
                        {"state", JobState(j.state())},
                        {"iterations", StrCat(j.iterations_done(), "/", j.iterations_target())},
                        {"last loss", Fixed(j.last_loss(), 4)},
                        {"devices", devices.empty() ? "-" : absl::StrJoin(devices, ",")},
                        {"message", j.message().empty() ? "-" : j.message()}});
  std::vector<std::vector<std::string>> rows;
  for (const v1::JobEvent& e : r.events()) {
    rows.push_back({StrCat(e.seq()), StrCat(e.time_unix_ms()), e.kind(), e.details_json()});
  }
  if (!rows.empty()) c.out() << "\n" << FormatTable({"SEQ", "TIME_UNIX_MS", "KIND", "DETAILS"}, rows);
  return kSlicectlOk;
}

}  // namespace

// ---------------------------------------------------------------------------
// Formatting
// ---------------------------------------------------------------------------

std::string FormatTable(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  auto measure = [&](const std::vector<std::string>& row) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  };
  if (!header.empty()) measure(header);
  for (const auto& r : rows) measure(r);
  std::string out;
  auto emit = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  if (!header.empty()) emit(header);
  for (const auto& r : rows) emit(r);
  return out;
}

std::string GmgDumpToDot(const v1::GmgDump& dump) {
  auto quote = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') out += '\\';
      out += ch == '\n' ? ' ' : ch;
    }
    return out + "\"";
  };
  std::map<int64_t, std::string> device_names;
  for (const v1::Device& d : dump.devices()) device_names[d.id()] = d.name();
  auto dev = [&](int32_t d) {
    auto it = device_names.find(d);
    return d < 0 ? std::string("-") : it == device_names.end() ? StrCat("dev", d) : it->second;
  };
  std::map<uint64_t, std::vector<const v1::Node*>> by_instance;
  for (const v1::Node& n : dump.nodes()) by_instance[n.instance()].push_back(&n);
  std::string out = "digraph gmg {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n";
  for (const v1::Instance& inst : dump.instances()) {
    out += StrCat("  subgraph cluster_", inst.id(), " {\n    label=",
                  quote(StrCat("instance ", inst.id(), " ", inst.template_name(), " (", inst.priority_class(), ", ",
                               inst.state(), ")")),
                  ";\n");
    for (const v1::Node* n : by_instance[inst.id()]) {
      const std::string state = absl::AsciiStrToLower(EnumSuffix(v1::NodeState_Name(n->state()), "NODE_STATE_"));
      std::string where = dev(n->device());
      if (n->dst_device() >= 0) where += "->" + dev(n->dst_device());
      const char* color = n->state() == v1::NODE_STATE_DONE      ? "gray"
                          : n->state() == v1::NODE_STATE_RUNNING ? "green"
                          : n->state() == v1::NODE_STATE_ISSUED  ? "blue"
                          : n->state() == v1::NODE_STATE_FAILED  ? "red"
                                                                 : "black";
      out += StrCat("    n", n->id(), " [label=", quote(StrCat(n->op(), "\n", where, " ", state)), ", color=", color,
                    n->op() == "transfer" ? ", shape=ellipse" : "", "];\n");
    }
    out += "  }\n";
  }
  for (const v1::Node& n : dump.nodes()) {
    for (uint64_t p : n.preds()) out += StrCat("  n", p, " -> n", n.id(), ";\n");
  }
  out += "}\n";
  return out;
}

std::string AnchorJobDatasetPath(const std::string& yaml, const std::string& file_dir) {
  YAML::Node path;
  try {
    const YAML::Node root = YAML::Load(yaml);
    if (!root.IsMap() || !root["dataset"].IsMap()) return yaml;
    path = root["dataset"]["path"];
  } catch (const YAML::Exception&) {
    return yaml;
  }
  if (!path.IsScalar() || path.Scalar().empty() || path.Scalar().front() == '/') return yaml;
  const std::string anchored = (std::filesystem::path(file_dir) / path.Scalar()).lexically_normal().string();
  const size_t pos = static_cast<size_t>(path.Mark().pos);
  if (pos >= yaml.size()) return yaml;
  // The scalar as written: plain (replaced by a double-quoted string, which
  // takes any path), or quoted (the directory goes inside the quotes).
  std::string out = yaml;
  if (yaml.compare(pos, path.Scalar().size(), path.Scalar()) == 0 && yaml[pos] != '"' && yaml[pos] != '\'') {
    std::string quoted = "\"";
    for (char ch : anchored) {
      if (ch == '"' || ch == '\\') quoted += '\\';
      quoted += ch;
    }
    out.replace(pos, path.Scalar().size(), quoted + "\"");
  } else if (yaml[pos] == '\'') {
    out.insert(pos + 1, absl::StrReplaceAll(file_dir + "/", {{"'", "''"}}));
  } else if (yaml[pos] == '"') {
    out.insert(pos + 1, absl::StrReplaceAll(file_dir + "/", {{"\\", "\\\\"}, {"\"", "\\\""}}));
  } else {
    return yaml;
  }
  // Only hand over what still means the same thing.
  try {
    const YAML::Node check = YAML::Load(out);
    if (check["dataset"]["path"].Scalar() != (std::filesystem::path(file_dir) / path.Scalar()).string() &&
        check["dataset"]["path"].Scalar() != anchored) {
      return yaml;
    }
  } catch (const YAML::Exception&) {
    return yaml;
  }
  return out;
}

std::string_view GrpcCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    default: return "UNKNOWN_CODE";
  }
}

std::string HumanBytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (std::abs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  if (u == 0) return StrCat(bytes, " B");
  return StrCat(Fixed(v, v < 10 ? 1 : 0), " ", kUnits[u]);
}

// ---------------------------------------------------------------------------
// Entry point
// ---------------------------------------------------------------------------

int RunSlicectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Global g;
  std::vector<std::string> words;
  std::vector<std::pair<std::string, std::string>> flags;
  auto usage = [&](const std::string& message) {
    err << "slicectl: " << message << "\n" << kSlicectlHelpText;
    return kSlicectlUsage;
  };
  if (auto e = ParseCommandLine(args, &g, &words, &flags)) return usage(e->message);
  if (g.help) {
    out << kSlicectlHelpText;
    return kSlicectlOk;
  }
  if (words.empty()) return usage("missing COMMAND");
  if (!g.address.empty() && g.address.find(':') == std::string::npos) {
    return usage(StrCat("--address: expected HOST:PORT, got '", g.address, "'"));
  }
  const Args a(words, flags);
  const std::string& cmd = words[0];

  // Each command: its flags ("--x!" = a switch), how many words (the
  // command included), and a builder that checks the arguments and makes the
  // call to run, so usage errors are found before connecting.
  struct Spec {
    std::vector<std::string> flags;
    size_t min_words, max_words;
    std::function<Usage(const Args&, Runner*)> build;
  };
  auto simple = [](int (*fn)(Client&)) {
    return [fn](const Args&, Runner* run) -> Usage {
      *run = fn;
      return std::nullopt;
    };
  };
  const std::map<std::string, Spec> commands = {
      {"status", {{}, 1, 1, simple(Status)}},
      {"devices", {{}, 1, 1, simple(Devices)}},
      {"deployments", {{}, 1, 1, simple(Deployments)}},
      {"instances", {{}, 1, 1, simple(Instances)}},
      {"generate",
       {{"--prompt", "--max-tokens", "--seed", "--top-p", "--top-k", "--temperature", "--offline!"}, 2, 2, Generate}},
      {"submit", {{"--tenant", "--validate-only!"}, 2, 2, Submit}},
      {"jobs", {{}, 1, 1, simple(Jobs)}},
      {"job", {{}, 2, 2, Job}},
      {"cancel-job", {{"--reason"}, 2, 2, CancelJob}},
      {"cancel", {{}, 2, 2, Cancel}},
      {"batch",
       {{"--deployment", "--strict!", "--completion-window", "--tenant", "--validate-only!", "--reason"}, 2, 3, Batch}},
      {"gmg", {{"--format"}, 2, 2, Gmg}},
      {"timeline", {{"--out", "--since-ns", "--until-ns", "--max-events"}, 1, 1, Timeline}},
  };
  auto it = commands.find(cmd);
  if (it == commands.end()) return usage(StrCat("unknown command '", cmd, "'"));
  if (auto e = a.Check(it->second.flags, it->second.min_words, it->second.max_words, cmd)) return usage(e->message);
  Runner run;
  if (auto e = it->second.build(a, &run)) return usage(e->message);

  Client c(g, out, err);
  if (const int rc = c.Connect(); rc != kSlicectlOk) return rc;
  return run(c);
}

}  // namespace slicesched
