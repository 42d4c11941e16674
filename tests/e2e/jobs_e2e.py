#!/usr/bin/python3
"""End-to-end test of the FineTune API from another stack.

Starts the real `sliced` binary on the embedded default config (with
--no-job-runner: this test is about the API and persistence, so jobs stay
queued; tests/e2e/jobs_restart_e2e.py runs them) and, from
Python (Debian's python3-grpcio, stubs generated from the .proto now):
  1. submits every example job of configs/jobs/ (dataset paths made
     absolute, as a remote client must), a job whose backbone is a
     deployment, a validate_only job and invalid jobs (INVALID_ARGUMENT
     listing every error with its line:col);
  2. lists with state/tenant filters and pages, gets a job with its events,
     cancels one (twice: the second answer is the terminal state);
  3. checks Admin.Status counts the jobs;
  4. sends SIGTERM (exit status 0), restarts on the same state directory and
     checks no job was lost: same ids, names, states and event logs.

usage: jobs_e2e.py REPO_ROOT SLICED
"""

import os
import re
import sys
import tempfile

try:
    import grpc
except ImportError:  # python3-grpcio is in tools/bootstrap; skip where it is missing
    print("jobs_e2e: SKIP: python3-grpcio is not installed")
    sys.exit(77)

REPO, SLICED = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(REPO, "tools"))
import sliced_client  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def example_jobs():
    """(file name, yaml) of every example, relative dataset paths made absolute."""
    jobs_dir = os.path.join(REPO, "configs", "jobs")
    out = []
    for name in sorted(os.listdir(jobs_dir)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(jobs_dir, name)) as f:
            text = f.read()
        text = re.sub(r"(\n\s+path: )(?!/)", r"\g<1>" + jobs_dir + "/", text)
        out.append((name, text))
    return out


def snapshot(stubs, channel):
    """Every job (paging through ListJobs) and its events."""
    ft = stubs.finetune_pb2_grpc.FineTuneStub(channel)
    jobs, token = [], ""
    while True:
        page = ft.ListJobs(stubs.finetune_pb2.ListJobsRequest(page_size=2, page_token=token))
        jobs.extend(page.jobs)
        token = page.next_page_token
        if not token:
            break
    out = {}
    for j in jobs:
        got = ft.GetJob(stubs.finetune_pb2.GetJobRequest(job_id=j.id, include_events=True))
        out[j.id] = (j.name, j.tenant, j.state, j.yaml, [(e.seq, e.kind) for e in got.events])
    return out


def main():
    with tempfile.TemporaryDirectory(prefix="sliced-jobs-e2e-") as work:
        stubs = sliced_client.generate_stubs(REPO, os.path.join(work, "stubs"))
        pb = stubs.finetune_pb2
        daemon = sliced_client.Daemon(SLICED, work, extra_args=["--no-job-runner"])
        channel = daemon.start()
        try:
            ft = stubs.finetune_pb2_grpc.FineTuneStub(channel)
            admin = stubs.admin_pb2_grpc.AdminStub(channel)

            # 1. Submissions.
            examples = example_jobs()
            check(len(examples) >= 3, "at least three example jobs, got %d" % len(examples))
            ids = {}
            for name, text in examples:
                r = ft.SubmitJob(pb.SubmitJobRequest(yaml=text))
                ids[name] = r.job_id
            check(sorted(ids.values()) == list(range(1, len(examples) + 1)), "ids ascend from 1: %s" % ids)
            sentiment = dict(examples)["sentiment-tiny.yaml"]
            dep = sentiment.replace("backbone: tiny", "backbone: tiny-online").replace(
                "name: sentiment-tiny", "name: on-deployment")
            r = ft.SubmitJob(pb.SubmitJobRequest(yaml=dep, tenant="team-a"))
            check(r.job_id == len(examples) + 1, "a deployment is a backbone")
            check(ft.GetJob(pb.GetJobRequest(job_id=r.job_id)).job.name == "on-deployment", "renamed job")
            r = ft.SubmitJob(pb.SubmitJobRequest(yaml=examples[0][1], validate_only=True))
            check(r.job_id == 0, "validate_only stores nothing")
            bad = ("name: bad job\nbackbone: gpt9\ndataset: {path: relative.jsonl}\n"
                   "hyperparameters: {learning_rate: 0, batch_size: 1}\n"
                   "stop: {metric: f1, target: 1, max_epochs: 0}\ncolour: red\n")
            try:
                ft.SubmitJob(pb.SubmitJobRequest(yaml=bad))
                check(False, "invalid job accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "invalid job: %s" % e.code())
                msg = e.details()
                for want in ["<job>:1:7: name:", "<job>:2:11: backbone: unknown backbone 'gpt9'",
                             "<job>:3:17: dataset.path: must be an absolute path",
                             "<job>:4:34: hyperparameters.learning_rate: must be positive",
                             "<job>:5:16: stop.metric:", "<job>:5:43: stop.max_epochs:",
                             "<job>:6:1: unknown field 'colour'"]:
                    check(want in msg, "error list names %r:\n%s" % (want, msg))
            try:
                ft.SubmitJob(pb.SubmitJobRequest(yaml=examples[0][1], tenant="someone-else"))
                check(False, "tenant mismatch accepted")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "submitted for tenant" in e.details(),
                      "tenant mismatch: %s" % e.details())

            # 2. List, get, cancel.
            listed = ft.ListJobs(pb.ListJobsRequest(tenant="team-a"))
            check([j.name for j in listed.jobs] == ["copy-pipeline", "sentiment-tiny", "on-deployment"],
                  "tenant filter: %s" % [j.name for j in listed.jobs])
            queued = ft.ListJobs(pb.ListJobsRequest(state=pb.JOB_STATE_QUEUED))
            check(len(queued.jobs) == len(examples) + 1, "all new jobs are QUEUED")
            check(all(j.message == "submitted; waiting to be profiled" for j in queued.jobs), "submitted message")
            first = ft.ListJobs(pb.ListJobsRequest(page_size=2))
            second = ft.ListJobs(pb.ListJobsRequest(page_size=2, page_token=first.next_page_token))
            check([j.id for j in first.jobs] == [1, 2] and [j.id for j in second.jobs] == [3, 4], "pages")
            try:
                ft.ListJobs(pb.ListJobsRequest(page_size=2, tenant="team-a", page_token=first.next_page_token))
                check(False, "page token accepted with other filters")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.INVALID_ARGUMENT, "foreign page token")
            victim = ids["parity-synthetic.yaml"]
            c = ft.CancelJob(pb.CancelJobRequest(job_id=victim, reason="e2e"))
            check(c.job.state == pb.JOB_STATE_CANCELLED and c.job.message == "cancelled: e2e", "cancel")
            c = ft.CancelJob(pb.CancelJobRequest(job_id=victim, reason="again"))
            check(c.job.state == pb.JOB_STATE_CANCELLED, "cancel of a cancelled job")
            got = ft.GetJob(pb.GetJobRequest(job_id=victim, include_events=True))
            check([(e.seq, e.kind) for e in got.events] == [(1, "submitted"), (2, "cancelled")],
                  "events: %s" % [(e.seq, e.kind) for e in got.events])
            check('"reason":"e2e"' in got.events[1].details_json, "cancel reason recorded")
            try:
                ft.GetJob(pb.GetJobRequest(job_id=999))
                check(False, "unknown job found")
            except grpc.RpcError as e:
                check(e.code() == grpc.StatusCode.NOT_FOUND, "unknown job: %s" % e.code())

            # 3. Status.
            st = admin.Status(stubs.admin_pb2.StatusRequest())
            check(st.jobs_queued == len(examples) and st.jobs_running == 0,
                  "status counts: queued %d running %d" % (st.jobs_queued, st.jobs_running))
            before = snapshot(stubs, channel)
        finally:
            rc = daemon.stop()
        check(rc == 0, "SIGTERM exit status %s" % rc)

        # 4. Restart: nothing lost.
        channel = daemon.start()
        try:
            after = snapshot(stubs, channel)
            check(after == before, "jobs after restart equal those before:\n%s\n%s" % (before, after))
            st = stubs.admin_pb2_grpc.AdminStub(channel).Status(stubs.admin_pb2.StatusRequest())
            check(st.jobs_queued == len(examples), "status after restart")
            r = stubs.finetune_pb2_grpc.FineTuneStub(channel).SubmitJob(pb.SubmitJobRequest(yaml=examples[1][1]))
            check(r.job_id == len(examples) + 2, "ids are not reused after a restart: %d" % r.job_id)
        finally:
            rc = daemon.stop()
        check(rc == 0, "second SIGTERM exit status %s" % rc)
        check("fine-tuning jobs: %d queued or paused, 1 terminal" % len(examples) in daemon.log_text(),
              "the daemon logs the jobs it reloaded")

    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("jobs_e2e: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
