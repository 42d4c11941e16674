// slicectl's commands on batch jobs: batch submit, list, get, results and
// cancel.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "slicectl_internal.h"

namespace slicesched::slicectl_internal {
namespace {

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

}  // namespace

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

}  // namespace slicesched::slicectl_internal
