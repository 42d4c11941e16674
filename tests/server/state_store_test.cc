// StateStore: round trips, persistence across reopen, concurrent readers,
// corrupt files and the append-only job event log.
#include "slicesched/server/state_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include <sqlite3.h>

#include "slicesched/common/strings.h"

namespace slicesched {
namespace {

using ::testing::HasSubstr;

// A fresh, empty directory per test.
std::string FreshDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/state_store_test_" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

StateStore::Options FakeClock(std::atomic<int64_t>* now) {
  StateStore::Options o;
  o.now_unix_ms = [now] { return now->load(); };
  return o;
}

TEST(StateStoreTest, OpensCreatesAndVersions) {
  const std::string dir = FreshDir("open");
  auto store = StateStore::Open(dir + "/nested/state");
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE(std::filesystem::exists(dir + "/nested/state/sliced.db"));
  auto v = (*store)->SchemaVersion();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, StateStore::kSchemaVersion);
}

TEST(StateStoreTest, DeploymentRoundTrip) {
  std::atomic<int64_t> now{1000};
  auto store = StateStore::Open(FreshDir("deployments"), FakeClock(&now));
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  ASSERT_TRUE(s.PutDeployment("b", "name: b\n").ok());
  ASSERT_TRUE(s.PutDeployment("a", "name: a\nmodel: tiny\n").ok());
  now = 2000;
  ASSERT_TRUE(s.PutDeployment("b", "name: b\nrole: offline\n").ok());

  auto b = s.GetDeployment("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->spec_yaml, "name: b\nrole: offline\n");
  EXPECT_EQ(b->created_unix_ms, 1000);  // kept on replace
  EXPECT_EQ(b->updated_unix_ms, 2000);

  auto all = s.ListDeployments();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].name, "a");
  EXPECT_EQ((*all)[1].name, "b");

  ASSERT_TRUE(s.DeleteDeployment("a").ok());
  EXPECT_EQ(s.GetDeployment("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.DeleteDeployment("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.PutDeployment("", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateStoreTest, EstimatorRoundTripIncludingBinarySafeText) {
  auto store = StateStore::Open(FreshDir("estimators"));
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  const std::string text = "op A16 tiny/prefill:g0 1.5e-3 0 0 2\nquote ' and \"\n";
  ASSERT_TRUE(s.PutEstimators({{"op", text, 0}, {"transfer", "0 1 12e9 20000\n", 0}}).ok());
  auto op = s.GetEstimator("op");
  ASSERT_TRUE(op.ok()) << op.status();
  EXPECT_EQ(op->text, text);
  ASSERT_TRUE(s.PutEstimator("transfer", "v2").ok());
  auto all = s.ListEstimators();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].kind, "transfer");
  EXPECT_EQ((*all)[1].text, "v2");
  ASSERT_TRUE(s.DeleteEstimator("op").ok());
  EXPECT_EQ(s.GetEstimator("op").status().code(), absl::StatusCode::kNotFound);
  // A batch with a bad entry changes nothing.
  EXPECT_FALSE(s.PutEstimators({{"transfer", "v3", 0}, {"", "x", 0}}).ok());
  EXPECT_EQ(s.GetEstimator("transfer")->text, "v2");
}

TEST(StateStoreTest, JobsAndEventLog) {
  std::atomic<int64_t> now{5};
  auto store = StateStore::Open(FreshDir("jobs"), FakeClock(&now));
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  auto j1 = s.CreateJob("name: one\n", "alice", "queued", R"({"source":"test"})");
  ASSERT_TRUE(j1.ok()) << j1.status();
  auto j2 = s.CreateJob("name: two\n", "bob", "queued");
  ASSERT_TRUE(j2.ok()) << j2.status();
  EXPECT_LT(*j1, *j2);

  now = 10;
  auto seq = s.SetJobState(*j1, "running", "state", R"({"from":"queued","to":"running"})");
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*seq, 2u);
  for (int i = 0; i < 5; ++i) {
    now = 20 + i;
    auto k = s.AppendJobEvent(*j1, "progress", StrCat(R"({"iteration":)", i, "}"));
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(*k, 3u + i);
  }
  auto events = s.ListJobEvents(*j1);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 7u);
  for (size_t i = 0; i < events->size(); ++i) {
    EXPECT_EQ((*events)[i].seq, i + 1);
    if (i > 0) {
      EXPECT_GE((*events)[i].time_unix_ms, (*events)[i - 1].time_unix_ms);
    }
  }
  EXPECT_EQ((*events)[0].kind, "submitted");
  EXPECT_EQ((*events)[0].details_json, R"({"source":"test"})");
  EXPECT_EQ((*events)[6].details_json, R"({"iteration":4})");
  auto tail = s.ListJobEvents(*j1, 5);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->size(), 2u);
  EXPECT_EQ((*tail)[0].seq, 6u);

  auto job = s.GetJob(*j1);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, "running");
  EXPECT_EQ(job->tenant, "alice");
  EXPECT_EQ(job->yaml, "name: one\n");
  EXPECT_EQ(job->submitted_unix_ms, 5);
  EXPECT_EQ(job->updated_unix_ms, 24);

  auto running = s.ListJobs({.state = "running"});
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->size(), 1u);
  EXPECT_EQ((*running)[0].id, *j1);
  auto bobs = s.ListJobs({.tenant = "bob"});
  ASSERT_EQ(bobs->size(), 1u);
  EXPECT_EQ((*bobs)[0].id, *j2);
  auto page = s.ListJobs({.after_id = *j1, .limit = 1});
  ASSERT_EQ(page->size(), 1u);
  EXPECT_EQ((*page)[0].id, *j2);

  // Errors: unknown job, bad JSON (nothing is written).
  EXPECT_EQ(s.AppendJobEvent(999, "x").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.SetJobState(999, "running", "state").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.AppendJobEvent(*j1, "x", "{not json").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ListJobEvents(*j1)->size(), 7u);

  // Deleting a job removes its log; ids are not reused.
  ASSERT_TRUE(s.DeleteJob(*j2).ok());
  EXPECT_EQ(s.GetJob(*j2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(s.ListJobEvents(*j2)->empty());
  auto j3 = s.CreateJob("name: three\n", "bob", "queued");
  ASSERT_TRUE(j3.ok());
  EXPECT_GT(*j3, *j2);
}

TEST(StateStoreTest, SurvivesCloseAndReopen) {
  const std::string dir = FreshDir("reopen");
  uint64_t job = 0;
  {
    auto s = StateStore::Open(dir);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->PutDeployment("d", "name: d\n").ok());
    ASSERT_TRUE((*s)->PutEstimator("op", "coefficients").ok());
    auto j = (*s)->CreateJob("name: j\n", "t", "queued");
    ASSERT_TRUE(j.ok());
    job = *j;
    ASSERT_TRUE((*s)->SetJobState(job, "paused", "state").ok());
  }
  auto s = StateStore::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->GetDeployment("d")->spec_yaml, "name: d\n");
  EXPECT_EQ((*s)->GetEstimator("op")->text, "coefficients");
  EXPECT_EQ((*s)->GetJob(job)->state, "paused");
  EXPECT_EQ((*s)->ListJobEvents(job)->size(), 2u);
  EXPECT_EQ(*(*s)->AppendJobEvent(job, "resumed"), 3u);
}

TEST(StateStoreTest, ConcurrentReadersWhileWriting) {
  const std::string dir = FreshDir("concurrent");
  auto writer = StateStore::Open(dir);
  ASSERT_TRUE(writer.ok()) << writer.status();
  auto job = (*writer)->CreateJob("name: j\n", "t", "running");
  ASSERT_TRUE(job.ok());
  // A second connection on the same file (as slicectl would open) plus
  // threads sharing the writer's connection.
  auto reader = StateStore::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();

  constexpr int kEvents = 200;
  std::atomic<bool> done{false};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    StateStore* s = t % 2 == 0 ? reader->get() : writer->get();
    threads.emplace_back([s, &done, &failures, id = *job] {
      size_t last = 0;
      while (!done.load()) {
        auto events = s->ListJobEvents(id);
        if (!events.ok()) {
          ++failures;
          ADD_FAILURE() << events.status();
          return;
        }
        // Readers see a prefix of the log that only grows, always in order.
        if (events->size() < last) ++failures;
        last = events->size();
        for (size_t i = 0; i < events->size(); ++i) {
          if ((*events)[i].seq != i + 1) ++failures;
        }
      }
    });
  }
  for (int i = 0; i < kEvents; ++i) {
    auto seq = (*writer)->AppendJobEvent(*job, "tick");
    ASSERT_TRUE(seq.ok()) << seq.status();
  }
  done = true;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ((*reader)->ListJobEvents(*job)->size(), kEvents + 1u);
}

TEST(StateStoreTest, TwoWritersInterleaveWithoutGaps) {
  const std::string dir = FreshDir("two_writers");
  auto a = StateStore::Open(dir);
  auto b = StateStore::Open(dir);
  ASSERT_TRUE(a.ok() && b.ok());
  auto job = (*a)->CreateJob("name: j\n", "t", "running");
  ASSERT_TRUE(job.ok());
  std::thread ta([&] {
    for (int i = 0; i < 50; ++i) ASSERT_TRUE((*a)->AppendJobEvent(*job, "a").ok());
  });
  std::thread tb([&] {
    for (int i = 0; i < 50; ++i) ASSERT_TRUE((*b)->AppendJobEvent(*job, "b").ok());
  });
  ta.join();
  tb.join();
  auto events = (*a)->ListJobEvents(*job);
  ASSERT_TRUE(events.ok());
  ASSERT_EQ(events->size(), 101u);
  for (size_t i = 0; i < events->size(); ++i) EXPECT_EQ((*events)[i].seq, i + 1);
}

TEST(StateStoreTest, CorruptFileGivesClearError) {
  const std::string dir = FreshDir("corrupt");
  std::filesystem::create_directories(dir);
  {
    std::ofstream out(dir + "/sliced.db", std::ios::binary);
    for (int i = 0; i < 512; ++i) out << "this is not a database ";
  }
  auto s = StateStore::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr(dir + "/sliced.db"));
  EXPECT_THAT(s.status().message(), HasSubstr("not a database"));
  EXPECT_THAT(s.status().message(), HasSubstr("in statement '"));
}

TEST(StateStoreTest, DamagedPagesGiveClearError) {
  const std::string dir = FreshDir("damaged");
  {
    auto s = StateStore::Open(dir);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE((*s)->PutDeployment(StrCat("d", i), std::string(2000, 'x')).ok());
    }
  }
  // Checkpointed on close; overwrite everything after the header page.
  const std::string path = dir + "/sliced.db";
  ASSERT_GT(std::filesystem::file_size(path), 8192u);
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(4096);
    const std::string junk(static_cast<size_t>(std::filesystem::file_size(path)) - 4096, '\x5a');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  auto s = StateStore::Open(dir);
  if (s.ok()) {
    // Some damage only shows when the pages are read.
    auto all = (*s)->ListDeployments();
    ASSERT_FALSE(all.ok());
    EXPECT_EQ(all.status().code(), absl::StatusCode::kDataLoss) << all.status();
  } else {
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << s.status();
    EXPECT_THAT(s.status().message(), HasSubstr(path));
  }
}

TEST(StateStoreTest, UnusableDirectoryGivesError) {
  const std::string dir = FreshDir("file_not_dir");
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path());
  { std::ofstream(dir) << "x"; }
  auto s = StateStore::Open(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr(dir));
  EXPECT_EQ(StateStore::Open("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StateStoreTest, ApplyJobChangesIsAllOrNothing) {
  std::atomic<int64_t> now{1000};
  auto store = StateStore::Open(FreshDir("changes"), FakeClock(&now));
  ASSERT_TRUE(store.ok()) << store.status();
  StateStore& s = **store;
  auto a = s.CreateJob("name: a\n", "t", "queued");
  auto b = s.CreateJob("name: b\n", "t", "queued");
  ASSERT_TRUE(a.ok() && b.ok());
  now = 2000;
  JobChange run_a;
  run_a.job_id = *a;
  run_a.update.state = "running";
  run_a.update.plan_json = R"({"devices":[0,1]})";
  run_a.update.message = "running";
  run_a.event_kind = "running";
  JobChange progress_b;
  progress_b.job_id = *b;
  progress_b.update.iterations_done = 40;
  progress_b.update.iterations_target = 100;
  progress_b.update.last_loss = 0.625;
  progress_b.update.checkpoint_path = "/ckpt/b";
  progress_b.event_kind = "checkpoint";
  progress_b.details_json = R"({"iterations_done":40})";
  auto seqs = s.ApplyJobChanges({run_a, progress_b});
  ASSERT_TRUE(seqs.ok()) << seqs.status();
  EXPECT_EQ(*seqs, (std::vector<uint64_t>{2, 2}));
  auto ja = s.GetJob(*a);
  EXPECT_EQ(ja->state, "running");
  EXPECT_EQ(ja->plan_json, R"({"devices":[0,1]})");
  EXPECT_EQ(ja->updated_unix_ms, 2000);
  EXPECT_EQ(ja->checkpoint_path, "");  // untouched
  auto jb = s.GetJob(*b);
  EXPECT_EQ(jb->state, "queued");  // untouched
  EXPECT_EQ(jb->iterations_done, 40);
  EXPECT_EQ(jb->iterations_target, 100);
  EXPECT_DOUBLE_EQ(jb->last_loss, 0.625);
  EXPECT_EQ(jb->checkpoint_path, "/ckpt/b");

  // A change naming an unknown job rolls back the whole batch.
  JobChange fail_a = run_a;
  fail_a.update.state = "failed";
  fail_a.event_kind = "failed";
  JobChange ghost;
  ghost.job_id = 99;
  ghost.event_kind = "x";
  EXPECT_EQ(s.ApplyJobChanges({fail_a, ghost}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.GetJob(*a)->state, "running");
  EXPECT_EQ(s.ListJobEvents(*a)->size(), 2u);
  // Invalid input is refused before anything is written.
  JobChange bad_json = run_a;
  bad_json.update.plan_json = "{not json";
  EXPECT_EQ(s.ApplyJobChanges({bad_json}).status().code(), absl::StatusCode::kInvalidArgument);
  JobChange no_kind = run_a;
  no_kind.event_kind = "";
  EXPECT_EQ(s.ApplyJobChanges({no_kind}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ListJobEvents(*a)->size(), 2u);
}

// Normal runs (schema 4): points per job under one key, exact doubles,
// kept across a reopen, removed with their job; bad input is refused with
// the reason and stores nothing.
TEST(StateStoreTest, NormalRunsRoundTripAndSurviveReopen) {
  const std::string dir = FreshDir("normal_runs");
  uint64_t a = 0, b = 0;
  {
    auto s = StateStore::Open(dir);
    ASSERT_TRUE(s.ok()) << s.status();
    a = *(*s)->CreateJob("name: a\n", "t", "running");
    b = *(*s)->CreateJob("name: b\n", "t", "running");
    ASSERT_TRUE((*s)->AddNormalRunPoint(a, "dep|fa-inv|64+16|loss", 8, 0.1 + 0.2).ok());
    ASSERT_TRUE((*s)->AddNormalRunPoint(a, "dep|fa-inv|64+16|loss", 16, 0.25).ok());
    ASSERT_TRUE((*s)->AddNormalRunPoint(a, "dep|fa-inv|64+16|loss", 16, 0.125).ok());  // replaces step 16
    ASSERT_TRUE((*s)->AddNormalRunPoint(b, "other", 4, 1.5).ok());
    const absl::Status other_key = (*s)->AddNormalRunPoint(a, "other", 24, 0.1);
    EXPECT_EQ(other_key.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(other_key.message()), HasSubstr("stored with key 'dep|fa-inv|64+16|loss'"));
    EXPECT_EQ((*s)->AddNormalRunPoint(99, "k", 1, 0.5).code(), absl::StatusCode::kNotFound);
    EXPECT_EQ((*s)->AddNormalRunPoint(a, "", 1, 0.5).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*s)->AddNormalRunPoint(a, "dep|fa-inv|64+16|loss", -1, 0.5).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*s)->AddNormalRunPoint(a, "dep|fa-inv|64+16|loss", 32, NAN).code(),
              absl::StatusCode::kInvalidArgument);
  }
  auto s = StateStore::Open(dir);
  ASSERT_TRUE(s.ok()) << s.status();
  auto runs = (*s)->ListNormalRuns();
  ASSERT_TRUE(runs.ok()) << runs.status();
  ASSERT_EQ(runs->size(), 2u);
  EXPECT_EQ((*runs)[0].job_id, a);
  EXPECT_EQ((*runs)[0].run_key, "dep|fa-inv|64+16|loss");
  EXPECT_EQ((*runs)[0].points, (std::vector<std::pair<int64_t, double>>{{8, 0.1 + 0.2}, {16, 0.125}}));
  EXPECT_EQ((*runs)[1].job_id, b);
  EXPECT_EQ((*runs)[1].points, (std::vector<std::pair<int64_t, double>>{{4, 1.5}}));
  ASSERT_TRUE((*s)->DeleteNormalRun(b).ok());
  ASSERT_TRUE((*s)->DeleteNormalRun(b).ok());  // none stored: no error
  ASSERT_TRUE((*s)->DeleteJob(a).ok());        // takes its run along
  EXPECT_TRUE((*s)->ListNormalRuns()->empty());
}

// A database written by the schema-1 binary is migrated in place: its jobs
// and events stay, the new columns get their defaults.
TEST(StateStoreTest, MigratesSchemaOneDatabases) {
  const std::string dir = FreshDir("migrate");
  std::filesystem::create_directories(dir);
  {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/sliced.db").c_str(), &db), SQLITE_OK);
    const char* v1 =
        "CREATE TABLE schema_version (id INTEGER PRIMARY KEY CHECK (id = 1), version INTEGER NOT NULL);"
        "INSERT INTO schema_version VALUES (1, 1);"
        "CREATE TABLE deployments (name TEXT PRIMARY KEY NOT NULL, spec_yaml TEXT NOT NULL,"
        "  created_unix_ms INTEGER NOT NULL, updated_unix_ms INTEGER NOT NULL);"
        "CREATE TABLE estimators (kind TEXT PRIMARY KEY NOT NULL, text TEXT NOT NULL,"
        "  updated_unix_ms INTEGER NOT NULL);"
        "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, yaml TEXT NOT NULL, state TEXT NOT NULL,"
        "  tenant TEXT NOT NULL, submitted_unix_ms INTEGER NOT NULL, updated_unix_ms INTEGER NOT NULL);"
        "CREATE TABLE job_events (job_id INTEGER NOT NULL, seq INTEGER NOT NULL, time_unix_ms INTEGER NOT NULL,"
        "  kind TEXT NOT NULL, details_json TEXT NOT NULL, PRIMARY KEY (job_id, seq)) WITHOUT ROWID;"
        "INSERT INTO jobs (yaml, state, tenant, submitted_unix_ms, updated_unix_ms)"
        "  VALUES ('name: old\n', 'running', 't', 10, 20);"
        "INSERT INTO job_events VALUES (1, 1, 10, 'submitted', '{}');";
    char* err = nullptr;
    ASSERT_EQ(sqlite3_exec(db, v1, nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
    sqlite3_close(db);
  }
  auto store = StateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->SchemaVersion(), StateStore::kSchemaVersion);  // migrated through every version
  auto job = (*store)->GetJob(1);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state, "running");
  EXPECT_EQ(job->yaml, "name: old\n");
  EXPECT_EQ(job->checkpoint_path, "");
  EXPECT_EQ(job->iterations_done, 0);
  EXPECT_EQ(job->plan_json, "{}");
  auto seq = (*store)->AppendJobEvent(1, "recovered");
  ASSERT_TRUE(seq.ok()) << seq.status();
  EXPECT_EQ(*seq, 2u);
  // The later schemas' tables exist.
  EXPECT_TRUE((*store)->ListDecoupledPairs()->empty());
  EXPECT_TRUE((*store)->AddNormalRunPoint(1, "k", 8, 0.5).ok());
  EXPECT_EQ((*store)->ListNormalRuns()->size(), 1u);
}

}  // namespace
}  // namespace slicesched
