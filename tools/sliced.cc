// sliced: the slicesched scheduling daemon.
//
//   sliced [--config FILE] [--socket PATH] [--state-dir DIR] [--drain-timeout SECONDS] [--no-job-runner]
//
// Without --config it runs the embedded configs/sliced.yaml (a CPU-only demo
// under /tmp). It serves the Admin, Serving and FineTune gRPC services on the
// configured unix socket (and on TCP with TLS when configured), plus gRPC
// health checking and server reflection, and Prometheus metrics over plain
// HTTP at GET /metrics when `listen.metrics: HOST:PORT` is set.
//
// Signals: the first SIGTERM (or SIGINT) drains: no new work is admitted,
// in-flight instances get up to --drain-timeout seconds (default 100, below
// the systemd unit's TimeoutStopSec=120) to finish, estimator state is
// saved, and sliced exits 0. A second SIGTERM/SIGINT exits at once with
// status 1.
//
// systemd: with NOTIFY_SOCKET set (Type=notify) sliced sends READY=1 once it
// listens and STOPPING=1 when it starts draining. The sd_notify datagram
// protocol is implemented here (a few lines) so libsystemd is not needed.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/synchronization/mutex.h"
#include "slicesched/common/logging.h"
#include "slicesched/common/strings.h"
#include "slicesched/jobs/job_manager.h"
#include "slicesched/server/config.h"
#include "slicesched/common/status.h"
#include "slicesched/server/extensions.h"
#include "slicesched/server/master.h"
#include "slicesched/server/metrics.h"
#include "slicesched/server/services.h"
#include "spdlog/spdlog.h"

namespace slicesched {
namespace {

constexpr const char* kUsage =
    "usage: sliced [--config FILE] [--socket PATH] [--state-dir DIR] [--drain-timeout SECONDS] [--no-job-runner]\n"
    "  --config FILE            daemon config (default: the embedded configs/sliced.yaml demo)\n"
    "  --socket PATH            override listen.unix_socket of the config\n"
    "  --state-dir DIR          override state_dir of the config (absolute)\n"
    "  --drain-timeout SECONDS  how long SIGTERM waits for in-flight work (default 100)\n"
    "  --no-job-runner          accept fine-tuning jobs but do not plan or run them (they stay queued)\n";

// sd_notify(3)'s protocol: one datagram to the AF_UNIX socket named by
// $NOTIFY_SOCKET ('@' prefix = abstract namespace). Failures are logged only.
void Notify(const std::string& message) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path) || (path[0] != '/' && path[0] != '@')) {
    spdlog::warn("NOTIFY_SOCKET '{}' is not a usable unix socket address; not notifying systemd", path);
    return;
  }
  std::memcpy(addr.sun_path, path, len);
  if (path[0] == '@') addr.sun_path[0] = '\0';
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    spdlog::warn("sd_notify: socket: {}", std::strerror(errno));
    return;
  }
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + len);
  if (::sendto(fd, message.data(), message.size(), MSG_NOSIGNAL, reinterpret_cast<const sockaddr*>(&addr),
               addr_len) < 0) {
    spdlog::warn("sd_notify({}): {}", message, std::strerror(errno));
  }
  ::close(fd);
}

// The command line.
struct SlicedFlags {
  std::string config_path;
  SlicedOverrides overrides;
  int drain_timeout_s = 100;
  bool job_runner = true;
};

// Fills `flags`; an exit status when sliced should exit now (--help: 0, a bad
// argument: 2, after saying why on stderr).
std::optional<int> ParseFlags(int argc, char** argv, SlicedFlags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--no-job-runner") {
      flags->job_runner = false;
      continue;
    }
    if ((a == "--config" || a == "--drain-timeout" || a == "--socket" || a == "--state-dir") && i + 1 < argc) {
      const std::string v = argv[++i];
      if (a == "--config") {
        flags->config_path = v;
      } else if (a == "--socket") {
        flags->overrides.unix_socket = v;
      } else if (a == "--state-dir") {
        flags->overrides.state_dir = v;
      } else if (!absl::SimpleAtoi(v, &flags->drain_timeout_s) || flags->drain_timeout_s < 0) {
        std::fprintf(stderr, "sliced: --drain-timeout: expected a number of seconds >= 0, got '%s'\n", v.c_str());
        return 2;
      }
      continue;
    }
    std::fprintf(stderr, "sliced: unknown or incomplete argument '%s'\n%s", a.c_str(), kUsage);
    return 2;
  }
  return std::nullopt;
}

// The config (--config, else the embedded demo) with the flags' overrides
// applied, and logging set up as it says.
absl::StatusOr<SlicedConfig> Configure(const SlicedFlags& flags) {
  absl::StatusOr<SlicedConfig> config =
      flags.config_path.empty() ? DefaultSlicedConfig() : LoadSlicedConfig(flags.config_path);
  if (!config.ok()) return config.status();
  SLICESCHED_RETURN_IF_ERROR(ApplySlicedOverrides(flags.overrides, &*config));
  SLICESCHED_RETURN_IF_ERROR(SetupLogging(config->log_level));
  return config;
}

// What the daemon runs, in start order (destroyed in reverse); null: not
// started (a runner that does not run, no listen.metrics).
struct Daemon {
  std::unique_ptr<Master> master;
  std::unique_ptr<jobs::JobManager> job_manager;
  std::unique_ptr<TrainingRunner> runner;
  std::unique_ptr<jobs::BatchManager> batches;
  std::unique_ptr<BatchRunner> batch_runner;
  std::unique_ptr<SlicedServer> server;
  std::unique_ptr<MetricsHttpServer> metrics;
};

// The fine-tuning jobs and, unless --no-job-runner, their runner.
absl::Status StartJobs(const SlicedConfig& config, bool job_runner, Daemon* d) {
  // Fine-tuning jobs live in the same state directory; jobs that were running
  // when the daemon stopped are queued again (see jobs/job_manager.h).
  jobs::JobManager::Options job_options;
  Master* m = d->master.get();
  job_options.is_deployment = [m](std::string_view name) {
    auto list = m->ListDeployments();
    if (!list.ok()) return false;
    for (const DeploymentInfo& dep : *list) {
      if (dep.spec.name == name) return true;
    }
    return false;
  };
  SLICESCHED_ASSIGN_OR_RETURN(d->job_manager, jobs::JobManager::Open(config.state_dir, std::move(job_options)));
  const jobs::JobCounts counts = d->job_manager->Counts();
  spdlog::info("fine-tuning jobs: {} queued or paused, {} terminal", counts.submitted + counts.queued + counts.paused,
               counts.completed + counts.failed + counts.cancelled);
  // The job runner executes the planner's decisions on the real executors
  // (server/job_runner.h, registered by a LibTorch build through
  // server/extensions.h); without them jobs are accepted and stay queued.
  if (!job_runner) {
    spdlog::info("fine-tuning jobs are accepted but not run (--no-job-runner)");
  } else {
    JobRunnerOptions ro;
    ro.planner = config.planner;
    ro.state_dir = config.state_dir;
    auto created = CreateTrainingRunner(d->master.get(), d->job_manager.get(), ro);
    if (created.ok() && d->master->backend_name() != "virtual") {
      d->runner = *std::move(created);
      d->runner->Start();
      spdlog::info("fine-tuning job runner started: planner {} every {} s", ToStd(PlannerModeName(config.planner.mode)),
                   config.planner.interval.ToSecondsF());
    } else if (!created.ok() && !absl::IsFailedPrecondition(created.status())) {
      return created.status();
    } else {
      spdlog::warn("fine-tuning jobs will not run: {}", created.ok() ? "the devices are virtual (no real operators)"
                                                                       : created.status().ToString());
    }
  }
  return absl::OkStatus();
}

// The offline batch jobs and, on real executors, their runner.
absl::Status StartBatches(const SlicedConfig& config, Daemon* d) {
  // Offline batch jobs live in the same state directory; in_progress batches
  // go on where they stopped (jobs/batch_manager.h). They run on the real
  // executors only: virtual devices produce no tokens.
  Master* m = d->master.get();
  jobs::BatchManager::Options batch_options;
  batch_options.models = [m](std::string_view name) { return BatchModelInfoOf(m, name); };
  SLICESCHED_ASSIGN_OR_RETURN(d->batches, jobs::BatchManager::Open(config.state_dir, std::move(batch_options)));
  if (d->master->backend_name() == "virtual") {
    spdlog::warn("batch jobs will not run: the devices are virtual (no real operators)");
  } else {
    d->batch_runner = std::make_unique<BatchRunner>(
        m, d->batches.get(), BatchRunnerOptions{.max_inflight = static_cast<int>(config.batch.max_inflight)});
    d->batch_runner->Start();
    auto active = d->batches->Active();
    spdlog::info("batch runner started: {} batch(es) in progress", active.ok() ? active->size() : 0);
  }
  return absl::OkStatus();
}

// The gRPC services and, with listen.metrics, the Prometheus endpoint.
absl::Status StartServing(const SlicedConfig& config, Daemon* d) {
  SLICESCHED_ASSIGN_OR_RETURN(const ServerOptions options, ServerOptionsFromConfig(config.listen));
  SLICESCHED_ASSIGN_OR_RETURN(d->server, SlicedServer::Start(d->master.get(), options, d->job_manager.get(),
                                                             d->batches.get(), d->batch_runner.get()));
  if (!config.listen.metrics_address.empty()) {
    Master* m = d->master.get();
    jobs::BatchManager* bm = d->batches.get();
    const BatchRunner* br = d->batch_runner.get();
    auto render = [m, bm, br]() -> absl::StatusOr<std::string> {
      SLICESCHED_ASSIGN_OR_RETURN(MetricsSnapshot snap, m->Metrics());
      SLICESCHED_ASSIGN_OR_RETURN(snap.batches, BatchMetrics(bm, br));
      return RenderPrometheusText(snap);
    };
    SLICESCHED_ASSIGN_OR_RETURN(
        d->metrics, MetricsHttpServer::Start({.address = config.listen.metrics_address}, std::move(render)));
    spdlog::info("Prometheus metrics on http://{}/metrics", config.listen.metrics_address);
  }
  return absl::OkStatus();
}

// Starts everything; on an error, what started is left in `d`.
absl::Status StartDaemon(const SlicedConfig& config, bool job_runner, Daemon* d) {
  SLICESCHED_ASSIGN_OR_RETURN(d->master, Master::Start(config));
  SLICESCHED_RETURN_IF_ERROR(StartJobs(config, job_runner, d));
  SLICESCHED_RETURN_IF_ERROR(StartBatches(config, d));
  return StartServing(config, d);
}

// Stops the runners, drains the master and shuts everything down on a thread,
// while the main thread watches for a second signal, which exits at once with
// status 1. False when the drain failed.
bool DrainAndShutDown(Daemon& d, const sigset_t& signals, int drain_timeout_s) {
  std::atomic<bool> done{false};
  std::atomic<bool> drained_ok{true};
  std::thread drainer([&] {
    if (d.runner != nullptr) d.runner->Stop();  // in-flight micro-batches end, running jobs are checkpointed
    if (d.batch_runner != nullptr) d.batch_runner->Stop();  // unfinished batch requests run again after a restart
    auto r = d.master->Drain(/*wait=*/true, absl::Seconds(drain_timeout_s));
    if (!r.ok()) {
      spdlog::error("drain failed: {}", r.status().ToString());
      drained_ok = false;
    } else if (r->remaining_instances > 0) {
      spdlog::warn("drain timed out with {} instances still running; they are abandoned", r->remaining_instances);
    }
    d.server->Shutdown(absl::Seconds(2));
    if (d.metrics != nullptr) d.metrics->Stop();
    d.master->Shutdown();  // saves the estimators
    done = true;
  });
  const timespec poll{0, 50 * 1000 * 1000};
  while (!done.load()) {
    if (sigtimedwait(&signals, nullptr, &poll) > 0) {
      spdlog::warn("second signal: exiting without finishing the drain");
      spdlog::default_logger()->flush();
      std::_Exit(1);
    }
  }
  drainer.join();
  return drained_ok.load();
}

int Run(int argc, char** argv) {
  SlicedFlags flags;
  if (std::optional<int> exit_status = ParseFlags(argc, argv, &flags)) return *exit_status;

  // Signals are handled synchronously (sigwait) by the main thread; block
  // them before any other thread exists so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<SlicedConfig> config = Configure(flags);
  if (!config.ok()) {
    std::fprintf(stderr, "sliced: %s\n", std::string(config.status().message()).c_str());
    return 2;
  }
  spdlog::info("sliced starting with {}", config->source);

  Daemon d;
  if (absl::Status s = StartDaemon(*config, flags.job_runner, &d); !s.ok()) {
    spdlog::critical("cannot start: {}", s.ToString());
    return 1;
  }
  spdlog::info("serving on{}{}", config->listen.unix_socket.empty() ? "" : " unix:" + config->listen.unix_socket,
               config->listen.tcp_address.empty() ? "" : " " + config->listen.tcp_address + " (TLS)");
  Notify("READY=1\nSTATUS=serving");

  int sig = 0;
  while (sigwait(&signals, &sig) != 0) {
  }
  spdlog::info("received {}: draining for up to {} s (send it again to exit at once)", strsignal(sig),
               flags.drain_timeout_s);
  Notify("STOPPING=1\nSTATUS=draining");

  const bool drained_ok = DrainAndShutDown(d, signals, flags.drain_timeout_s);
  spdlog::info("sliced stopped");
  return drained_ok ? 0 : 1;
}

}  // namespace
}  // namespace slicesched

int main(int argc, char** argv) {
  // Lock-order checking on every Mutex::Lock (on in this absl build) takes
  // one process-wide spin lock per lock; a debugging aid the tests keep.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return slicesched::Run(argc, argv);
}
