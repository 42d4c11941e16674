// slicectl's commands on fine-tuning jobs: submit, jobs, job and cancel-job.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "slicectl_internal.h"

namespace slicesched::slicectl_internal {
namespace {

// The daemon names a job's positions "<job>:LINE:COL"; for a file, the
// file's path says where to look.
grpc::Status NameJobFile(const grpc::Status& s, const std::string& path) {
  if (s.ok()) return s;
  return grpc::Status(s.error_code(), absl::StrReplaceAll(s.error_message(), {{"<job>:", path + ":"}}));
}

std::string JobState(v1::JobState s) { return absl::AsciiStrToLower(EnumSuffix(v1::JobState_Name(s), "JOB_STATE_")); }

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

}  // namespace slicesched::slicectl_internal
