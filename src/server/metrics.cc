#include "slicesched/server/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "slicesched/common/strings.h"

namespace slicesched {

// ---------------------------------------------------------------------------
// Histogram
// ---------------------------------------------------------------------------

Histogram Histogram::WithBounds(std::vector<double> upper_bounds) {
  Histogram h;
  std::sort(upper_bounds.begin(), upper_bounds.end());
  upper_bounds.erase(std::unique(upper_bounds.begin(), upper_bounds.end()), upper_bounds.end());
  h.counts.assign(upper_bounds.size() + 1, 0);
  h.upper_bounds = std::move(upper_bounds);
  return h;
}

Histogram Histogram::LatencySeconds() {
  std::vector<double> b;
  for (double v = 0.001; v < 100; v *= 2) b.push_back(v);
  return WithBounds(std::move(b));
}

Histogram Histogram::DecisionSeconds() {
  std::vector<double> b;
  for (double v = 0.00001; v < 2; v *= 2) b.push_back(v);
  return WithBounds(std::move(b));
}

void Histogram::Observe(double value) {
  if (counts.size() != upper_bounds.size() + 1) counts.assign(upper_bounds.size() + 1, 0);
  const size_t i =
      static_cast<size_t>(std::lower_bound(upper_bounds.begin(), upper_bounds.end(), value) - upper_bounds.begin());
  ++counts[i];
  sum += value;
  ++count;
}

// ---------------------------------------------------------------------------
// Text exposition
// ---------------------------------------------------------------------------

namespace {

std::string Num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::trunc(v) && std::fabs(v) < 1e15) return StrCat(static_cast<int64_t>(v));  // 10, not 1e+01
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Shortest form that reads back to the same double.
  for (int prec = 1; prec < 17; ++prec) {
    char shorter[40];
    std::snprintf(shorter, sizeof(shorter), "%.*g", prec, v);
    if (std::strtod(shorter, nullptr) == v) return shorter;
  }
  return buf;
}

std::string Num(uint64_t v) { return StrCat(v); }

// Label value: backslash, double quote and line feed escaped.
std::string EscapeLabel(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string LabelText(const Labels& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ",";
    out += StrCat(labels[i].first, "=\"", EscapeLabel(labels[i].second), "\"");
  }
  return out + "}";
}

class Writer {
 public:
  void Family(const std::string& name, const char* type, const char* help) {
    out_ += StrCat("# HELP slicesched_", name, " ", help, "\n# TYPE slicesched_", name, " ", type, "\n");
  }
  template <typename T>
  void Sample(const std::string& name, const Labels& labels, T value) {
    out_ += StrCat("slicesched_", name, LabelText(labels), " ", Num(value), "\n");
  }
  void Hist(const std::string& name, const Labels& labels, const Histogram& h) {
    uint64_t cumulative = 0;
    for (size_t i = 0; i < h.upper_bounds.size(); ++i) {
      cumulative += i < h.counts.size() ? h.counts[i] : 0;
      Labels l = labels;
      l.emplace_back("le", Num(h.upper_bounds[i]));
      Sample(name + "_bucket", l, cumulative);
    }
    Labels l = labels;
    l.emplace_back("le", "+Inf");
    Sample(name + "_bucket", l, h.count);
    Sample(name + "_sum", labels, h.sum);
    Sample(name + "_count", labels, h.count);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

const char* kClassNames[2] = {"online", "offline"};

}  // namespace

std::string RenderPrometheusText(const MetricsSnapshot& m) {
  Writer w;
  w.Family("build_info", "gauge", "Always 1; the daemon version is a label.");
  w.Sample("build_info", {{"version", m.version}}, uint64_t{1});
  w.Family("uptime_seconds", "gauge", "Seconds since the daemon started.");
  w.Sample("uptime_seconds", {}, m.uptime_seconds);

  auto dev = [](const MetricsSnapshot::Device& d) { return Labels{{"device", d.name}, {"type", d.type}}; };
  w.Family("device_busy_ratio", "gauge", "Fraction of the last minute (or of the uptime) the device computed.");
  for (const auto& d : m.devices) w.Sample("device_busy_ratio", dev(d), d.busy_ratio);
  w.Family("device_busy_seconds_total", "counter", "Seconds the device spent computing operators.");
  for (const auto& d : m.devices) w.Sample("device_busy_seconds_total", dev(d), d.busy_seconds_total);
  w.Family("device_busy_batch_seconds_total", "counter",
           "Seconds the device spent computing operators of batch jobs' requests.");
  for (const auto& d : m.devices) w.Sample("device_busy_batch_seconds_total", dev(d), d.busy_batch_seconds_total);
  w.Family("device_queue_length", "gauge", "Operators issued to the device and not finished.");
  for (const auto& d : m.devices) w.Sample("device_queue_length", dev(d), static_cast<uint64_t>(d.queue_length));
  w.Family("device_memory_used_bytes", "gauge",
           "Bytes resident on the device (weights, activations, workspace, checkpoints).");
  for (const auto& d : m.devices)
    w.Sample("device_memory_used_bytes", dev(d), static_cast<double>(d.memory_used_bytes));
  w.Family("device_memory_capacity_bytes", "gauge", "Bytes of the device slicesched may use.");
  for (const auto& d : m.devices) {
    w.Sample("device_memory_capacity_bytes", dev(d), static_cast<double>(d.memory_capacity_bytes));
  }

  w.Family("live_instances", "gauge", "Graph instances in the GMG.");
  w.Sample("live_instances", {}, m.live_instances);
  w.Family("queued_instances", "gauge", "Live instances with no operator issued yet.");
  w.Sample("queued_instances", {{"class", "online"}}, m.queued_online);
  w.Sample("queued_instances", {{"class", "offline"}}, m.queued_offline);
  w.Family("instances_finished_total", "counter", "Instances that reached a terminal state.");
  for (int c = 0; c < 2; ++c) {
    w.Sample("instances_finished_total", {{"class", kClassNames[c]}, {"state", "done"}}, m.classes[c].done);
    w.Sample("instances_finished_total", {{"class", kClassNames[c]}, {"state", "failed"}}, m.classes[c].failed);
    w.Sample("instances_finished_total", {{"class", kClassNames[c]}, {"state", "cancelled"}}, m.classes[c].cancelled);
  }
  w.Family("request_latency_seconds", "histogram", "Arrival to completion of instances that finished DONE.");
  for (int c = 0; c < 2; ++c) w.Hist("request_latency_seconds", {{"class", kClassNames[c]}}, m.classes[c].latency);

  w.Family("slo_instances_total", "counter", "Finished online instances that had a deadline.");
  w.Sample("slo_instances_total", {}, m.slo_total);
  w.Family("slo_met_total", "counter", "Online instances with a deadline that finished DONE by it.");
  w.Sample("slo_met_total", {}, m.slo_met);
  w.Family("slo_attainment_ratio", "gauge", "slo_met_total / slo_instances_total (NaN before the first).");
  w.Sample("slo_attainment_ratio", {},
           m.slo_total == 0 ? std::nan("") : static_cast<double>(m.slo_met) / static_cast<double>(m.slo_total));

  if (m.batches.has_value()) {
    const MetricsSnapshot::Batches& b = *m.batches;
    w.Family("batches", "gauge", "Batch jobs in each state.");
    for (const auto& [state, n] : b.by_state) w.Sample("batches", {{"state", state}}, static_cast<double>(n));
    w.Family("batch_requests_done_total", "counter", "Batch requests whose result was stored since start.");
    w.Sample("batch_requests_done_total", {{"result", "ok"}}, b.requests_ok);
    w.Sample("batch_requests_done_total", {{"result", "error"}}, b.requests_error);
    w.Family("batch_tokens_total", "counter", "Tokens generated for batch requests whose result was stored.");
    w.Sample("batch_tokens_total", {}, b.tokens);
    w.Family("batch_requests_in_flight", "gauge", "Batch requests in the scheduler now.");
    w.Sample("batch_requests_in_flight", {}, static_cast<uint64_t>(b.in_flight));
    double busy = 0, batch = 0;
    for (const auto& d : m.devices) {
      busy += d.busy_seconds_total;
      batch += d.busy_batch_seconds_total;
    }
    w.Family("batch_device_time_ratio", "gauge",
             "Device time spent on batch requests over all device time since start (NaN before any).");
    w.Sample("batch_device_time_ratio", {}, busy > 0 ? batch / busy : std::nan(""));
  }

  w.Family("estimator_mape_percent", "gauge",
           "Mean absolute percentage error of the predictions made before each observation, since start.");
  w.Sample("estimator_mape_percent", {{"estimator", "op"}}, m.op_mape_pct);
  w.Sample("estimator_mape_percent", {{"estimator", "transfer"}}, m.transfer_mape_pct);
  w.Family("estimator_observations_total", "counter", "Completions the estimators learned from since start.");
  w.Sample("estimator_observations_total", {{"estimator", "op"}}, m.op_observations);
  w.Sample("estimator_observations_total", {{"estimator", "transfer"}}, m.transfer_observations);
  w.Family("estimator_key_mape_percent", "gauge", "Recent MAPE of one operator key's estimator.");
  for (const auto& k : m.op_keys) {
    w.Sample("estimator_key_mape_percent", {{"device_type", k.device_type}, {"op_key", k.op_key}}, k.mape_pct);
  }

  w.Family("schedule_call_seconds", "histogram", "Wall time of one scheduler call (the master loop's decision step).");
  w.Hist("schedule_call_seconds", {}, m.schedule_call);
  w.Family("schedule_round_seconds", "histogram",
           "Wall time of one scheduling round that ran what-if simulations (snapshot, simulate, choose).");
  w.Hist("schedule_round_seconds", {}, m.schedule_round);
  w.Family("schedule_rounds_total", "counter", "Batches the scheduler decided.");
  w.Sample("schedule_rounds_total", {}, m.schedule_rounds);
  w.Family("schedule_whatif_runs_total", "counter", "What-if simulations the scheduler ran.");
  w.Sample("schedule_whatif_runs_total", {}, m.whatif_runs);
  w.Family("schedule_issued_nodes_total", "counter", "Compute nodes the scheduler issued.");
  w.Sample("schedule_issued_nodes_total", {}, m.issued_nodes);
  w.Family("schedule_simulated_ops_total", "counter", "Operators advanced by the scheduler's what-if simulations.");
  w.Sample("schedule_simulated_ops_total", {}, m.simulated_ops);
  w.Family("schedule_whatif_seconds_total", "counter", "Wall time spent in what-if evaluation.");
  w.Sample("schedule_whatif_seconds_total", {}, m.whatif_seconds);
  w.Family("schedule_simulated_ops_per_ms", "gauge",
           "Simulated operators per millisecond of what-if wall time since start (0 before the first round).");
  w.Sample("schedule_simulated_ops_per_ms", {},
           m.whatif_seconds > 0 ? static_cast<double>(m.simulated_ops) / (m.whatif_seconds * 1e3) : 0.0);
  return w.Take();
}

// ---------------------------------------------------------------------------
// HTTP
// ---------------------------------------------------------------------------

namespace {

std::string Response(int code, const char* reason, const std::string& content_type, const std::string& body,
                     bool head_only = false) {
  std::string r = StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: ", content_type,
                         "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n");
  if (code == 405) r += "Allow: GET, HEAD\r\n";
  r += "\r\n";
  if (!head_only) r += body;
  return r;
}

std::string Plain(int code, const char* reason, const std::string& body) {
  return Response(code, reason, "text/plain; charset=utf-8", body + "\n");
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= 'A' && c <= 'Z'; });
}

}  // namespace

std::string HttpResponseFor(std::string_view head, const MetricsHttpServer::Render& render) {
  const size_t eol = head.find("\r\n");
  const std::string_view line = head.substr(0, eol == std::string_view::npos ? head.size() : eol);
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != line.npos) {
    return Plain(400, "Bad Request", "malformed request line");
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method) || target.empty() || (version != "HTTP/1.1" && version != "HTTP/1.0")) {
    return Plain(400, "Bad Request", "malformed request line");
  }
  if (const size_t q = target.find('?'); q != target.npos) target = target.substr(0, q);
  if (target != "/metrics") return Plain(404, "Not Found", "not found; metrics are at /metrics");
  if (method != "GET" && method != "HEAD") return Plain(405, "Method Not Allowed", "use GET");
  absl::StatusOr<std::string> body = render();
  if (!body.ok()) return Plain(500, "Internal Server Error", std::string(body.status().message()));
  return Response(200, "OK", kPrometheusContentType, *body, method == "HEAD");
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(Options options, Render render) {
  const size_t colon = options.address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(StrCat("listen.metrics: expected HOST:PORT, got '", options.address, "'"));
  }
  std::string host = options.address.substr(0, colon);
  const std::string port = options.address.substr(colon + 1);
  int port_num = 0;
  if (!absl::SimpleAtoi(port, &port_num) || port_num < 0 || port_num > 65535) {
    return absl::InvalidArgumentError(StrCat("listen.metrics: bad port in '", options.address, "'"));
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  if (const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(
        StrCat("listen.metrics: cannot resolve '", options.address, "': ", ::gai_strerror(rc)));
  }
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer(std::move(options), std::move(render)));
  std::string error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    error = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(res);
  if (s->listen_fd_ < 0) {
    return absl::UnavailableError(StrCat("listen.metrics: cannot listen on '", s->options_.address, "': ", error));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    s->port_ = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  }
  if (::pipe2(s->wake_pipe_, O_CLOEXEC) != 0) {
    return absl::InternalError(StrCat("listen.metrics: pipe: ", std::strerror(errno)));
  }
  s->thread_ = std::thread([p = s.get()] { p->Serve(); });
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  Stop();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  const char b = 'x';
  while (::write(wake_pipe_[1], &b, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void MetricsHttpServer::Serve() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;  // the peer went away, or out of descriptors for now
    HandleConnection(fd);
    ::close(fd);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  // One deadline for the whole request, so a client trickling bytes cannot
  // hold the (single) serving thread longer than read_timeout_ms; the same
  // bound applies to each blocking send of the response.
  timeval tv{options_.read_timeout_ms / 1000, (options_.read_timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  std::string buf;
  std::string response;
  char chunk[1024];
  while (true) {
    if (const size_t end = buf.find("\r\n\r\n"); end != std::string::npos) {
      response = HttpResponseFor(std::string_view(buf).substr(0, end + 4), render_);
      break;
    }
    if (buf.size() > options_.max_request_bytes) {
      response = Plain(431, "Request Header Fields Too Large",
                       StrCat("request larger than ", options_.max_request_bytes, " bytes"));
      break;
    }
    pollfd p{fd, POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const int rc = left.count() <= 0 ? 0 : ::poll(&p, 1, static_cast<int>(left.count()));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) {
      response = Plain(408, "Request Timeout", "no complete request in time");
      break;
    }
    if (rc < 0) return;
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (buf.empty()) return;  // connected and closed: nothing to answer
      response = Plain(400, "Bad Request", "incomplete request");
      break;
    }
    buf.append(chunk, static_cast<size_t>(n));
  }
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = ::send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
  // Lingering close: read what the client still sends (a refused oversized
  // request) until it closes, so closing with unread data does not reset
  // the connection before the client has read the response. Bounded in
  // bytes and time.
  ::shutdown(fd, SHUT_WR);
  const auto linger_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.read_timeout_ms);
  size_t drained = 0;
  while (drained < 16 * options_.max_request_bytes) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(linger_until - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) <= 0) return;
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) return;
    drained += static_cast<size_t>(n);
  }
}

}  // namespace slicesched
