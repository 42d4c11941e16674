// slicectl: parsing the command line, the output helpers and the
// connection, the formatting (slicectl.h), and the command table that
// RunSlicectl dispatches from. The commands are in slicectl_serving.cc,
// slicectl_jobs.cc and slicectl_batch.cc.
#include "slicesched/cli/slicectl.h"

#include <google/protobuf/util/json_util.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_replace.h"
#include "slicectl_internal.h"
#include "slicesched/common/strings.h"
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

namespace slicectl_internal {

namespace {

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

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

}  // namespace

// ---------------------------------------------------------------------------
// Output helpers
// ---------------------------------------------------------------------------

std::string ToJson(const google::protobuf::Message& m, bool pretty) {
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

int Client::Connect() {
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

void Client::Prepare(grpc::ClientContext* ctx, bool deadline) const {
  if (!g_.token.empty()) ctx->AddMetadata("authorization", "Bearer " + g_.token);
  if (deadline) {
    ctx->set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(g_.timeout_s * 1000)));
  }
}

int Client::Fail(const grpc::Status& s) const {
  std::string message = s.error_message();
  if (message.empty()) {
    message = s.error_code() == grpc::StatusCode::UNIMPLEMENTED ? "the daemon does not implement this call yet"
                                                                : "(no message)";
  }
  err_ << "slicectl: " << GrpcCodeName(s.error_code()) << ": " << message << "\n";
  return kSlicectlServerError;
}

std::optional<uint64_t> PositiveId(const Args& a, std::string_view command, std::string_view what,
                                   Usage* error) {
  uint64_t id = 0;
  if (!ParseNumber(a.words()[1], &id) || id == 0) {
    *error = UsageError{StrCat(command, ": ", what, " must be a positive number, got '", a.words()[1], "'")};
    return std::nullopt;
  }
  return id;
}

}  // namespace slicectl_internal

using slicectl_internal::Args;
using slicectl_internal::Client;
using slicectl_internal::EnumSuffix;
using slicectl_internal::Fixed;
using slicectl_internal::Global;
using slicectl_internal::Runner;

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

namespace slicectl_internal {
namespace {

// Each command: its flags ("--x!" = a switch), how many words (the
// command included), and a builder that checks the arguments and makes the
// call to run, so usage errors are found before connecting.
struct Spec {
  std::vector<std::string> flags;
  size_t min_words, max_words;
  std::function<Usage(const Args&, Runner*)> build;
};

std::map<std::string, Spec> CommandTable() {
  auto simple = [](int (*fn)(Client&)) {
    return [fn](const Args&, Runner* run) -> Usage {
      *run = fn;
      return std::nullopt;
    };
  };
  return {
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
}

}  // namespace
}  // namespace slicectl_internal

int RunSlicectl(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  Global g;
  std::vector<std::string> words;
  std::vector<std::pair<std::string, std::string>> flags;
  auto usage = [&](const std::string& message) {
    err << "slicectl: " << message << "\n" << kSlicectlHelpText;
    return kSlicectlUsage;
  };
  if (auto e = slicectl_internal::ParseCommandLine(args, &g, &words, &flags)) return usage(e->message);
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
  const auto commands = slicectl_internal::CommandTable();
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
