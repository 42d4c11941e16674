#!/usr/bin/python3
"""Restart acceptance of fine-tuning jobs: kill -9 with jobs running.

Starts the real `sliced` (LibTorch CPU devices, the job runner on) with a
config of two CPU devices and a short checkpoint interval, submits three
synthetic jobs (two run, one waits), waits until a running job has written a
checkpoint, kills the daemon with SIGKILL, starts it again on the same state
directory and checks:
  * every job is still listed, with its id, name and event log prefix;
  * each job that was running got a "recovered" event naming its checkpoint
    and iterations;
  * it runs again and its next progress starts from the checkpoint's
    iteration count (>=), not from 0.

usage: jobs_restart_e2e.py REPO_ROOT SLICED
"""

import json
import os
import signal
import sys
import tempfile
import time

try:
    import grpc
except ImportError:  # python3-grpcio is in tools/bootstrap; skip where it is missing
    print("jobs_restart_e2e: SKIP: python3-grpcio is not installed")
    sys.exit(77)

REPO, SLICED = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(REPO, "tools"))
import sliced_client  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


CONFIG = """
cluster:
  devices: [{name: cpu, count: 2, type: cpu, memory: 512MiB, backend: cpu}]
deployments:
  - {name: tiny-ft, model: tiny, weights: {seed: 3}, role: offline, partitions: [single]}
planner: {interval_s: 5, checkpoint_interval_s: 1}
state_dir: /tmp/unused
log_level: info
"""


def job_yaml(name, task):
    return ("name: %s\nbackbone: tiny\n"
            "dataset: {synthetic: {task: %s, seed: 5, examples: 4000, sequence_length: 16}}\n"
            "hyperparameters: {learning_rate: 0.005, batch_size: 8}\n"
            "stop: {metric: accuracy, target: 0.999, max_epochs: 20}\n") % (name, task)


def events(ft, pb, job_id):
    return list(ft.GetJob(pb.GetJobRequest(job_id=job_id, include_events=True)).events)


def main():
    with tempfile.TemporaryDirectory(prefix="sliced-restart-e2e-") as work:
        stubs = sliced_client.generate_stubs(REPO, os.path.join(work, "stubs"))
        pb = stubs.finetune_pb2
        config = os.path.join(work, "sliced.yaml")
        with open(config, "w") as f:
            f.write(CONFIG)
        daemon = sliced_client.Daemon(SLICED, work, extra_args=["--config", config])
        channel = daemon.start()
        ft = stubs.finetune_pb2_grpc.FineTuneStub(channel)
        ids = [ft.SubmitJob(pb.SubmitJobRequest(yaml=job_yaml("job%d" % i, t))).job_id
               for i, t in enumerate(["fa-major", "fb-major", "parity"])]
        check(ids == [1, 2, 3], "ids %s" % ids)

        # Until some running job has a checkpoint with iterations done.
        deadline = time.monotonic() + 240
        checkpointed = {}
        while time.monotonic() < deadline and not checkpointed:
            for i in ids:
                for e in events(ft, pb, i):
                    if e.kind == "checkpoint" and json.loads(e.details_json)["iterations_done"] > 0:
                        checkpointed[i] = json.loads(e.details_json)["iterations_done"]
            time.sleep(0.5)
        check(checkpointed, "a running job wrote a checkpoint within 240 s")
        before = {j.id: (j.name, j.state) for j in ft.ListJobs(pb.ListJobsRequest()).jobs}
        running_before = [i for i, (n, s) in before.items() if s == pb.JOB_STATE_RUNNING]
        check(len(running_before) == 2, "two jobs running on two devices before the kill: %s" % before)
        logs_before = {i: [(e.seq, e.kind) for e in events(ft, pb, i)] for i in ids}
        channel.close()

        daemon.proc.send_signal(signal.SIGKILL)
        daemon.proc.wait()
        daemon.proc = None
        daemon.log.close()

        channel = daemon.start()
        ft = stubs.finetune_pb2_grpc.FineTuneStub(channel)
        after = {j.id: j.name for j in ft.ListJobs(pb.ListJobsRequest()).jobs}
        check(after == {i: n for i, (n, s) in before.items()}, "every job is listed after kill -9: %s" % after)
        for i in ids:
            log = [(e.seq, e.kind) for e in events(ft, pb, i)]
            # The log may have grown between the snapshot and the kill; what was there is kept.
            check(log[:len(logs_before[i])] == logs_before[i], "job %d keeps its event log" % i)

        # Recovered jobs resume from their checkpoint.
        deadline = time.monotonic() + 240
        resumed = {}
        while time.monotonic() < deadline and len(resumed) < len(running_before):
            for i in running_before:
                evs = events(ft, pb, i)
                rec = [e for e in evs if e.kind == "recovered"]
                if not rec:
                    continue
                saved = json.loads(rec[-1].details_json)["iterations_done"]
                later = [json.loads(e.details_json) for e in evs
                         if e.seq > rec[-1].seq and e.kind in ("progress", "checkpoint")]
                if later:
                    resumed[i] = (saved, later[0]["iterations_done"])
            time.sleep(0.5)
        check(len(resumed) == len(running_before), "both recovered jobs report progress again: %s" % resumed)
        for i, (saved, first) in resumed.items():
            check(saved > 0, "job %d had a checkpoint with iterations (saved %d)" % (i, saved))
            check(first >= saved, "job %d resumes from its checkpoint (%d), not from 0 (first after: %d)" % (
                i, saved, first))
        for i in ids:
            ft.CancelJob(pb.CancelJobRequest(job_id=i, reason="e2e done"))
        rc = daemon.stop()
        check(rc == 0, "SIGTERM exit status %s" % rc)
        if failures:
            print(daemon.log_text()[-8000:])
    if failures:
        print("jobs_restart_e2e: %d failure(s)" % len(failures))
        return 1
    print("jobs_restart_e2e: OK", resumed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
