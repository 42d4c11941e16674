#!/usr/bin/python3
"""Batch jobs end to end, from Python, against the real sliced binary.

On the embedded default config (4 CPU devices; tiny-online with weights
seed 1, tiny-offline with seed 2):
  1. online load alone: Generate streams on tiny-online with a TTFT SLO;
  2. a 500-request batch on tiny-offline submitted while the same online
     load runs; the daemon is killed with SIGKILL twice during the batch
     and started again on the same state directory each time;
  3. the results: 500 lines, each custom_id once, every token sequence equal
     to `slicesim generate-direct --batch` (the same operators called
     directly with the same seeds);
  4. online SLO attainment during the batch at least as high as without it;
  5. bad input is refused by line number, and a cancelled batch keeps its
     finished results.

  6. slicectl batch list / get / results / cancel against the same daemon.

usage: batch_e2e.py REPO_ROOT SLICED SLICESIM SLICECTL
"""

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time

import grpc

REPO, SLICED, SLICESIM, SLICECTL = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
sys.path.insert(0, os.path.join(REPO, "tools"))
import sliced_client  # noqa: E402

TTFT_SLO_MS = 500
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def batch_input(n, rng):
    lines = []
    for i in range(n):
        body = {"model": "tiny-offline", "prompt": [rng.randrange(1, 256) for _ in range(rng.randrange(4, 13))],
                "max_tokens": rng.randrange(8, 25)}
        if i % 3:
            body.update(temperature=0.9, top_p=0.95, seed=1000 + i)
        else:
            body.update(temperature=0)
        if i % 7 == 0:
            body["stop"] = [rng.randrange(1, 256)]
        lines.append(json.dumps({"custom_id": "req-%03d" % i, "method": "POST", "url": "/v1/completions",
                                 "body": body}))
    return "\n".join(lines) + "\n"


class OnlineLoad:
    """Two closed-loop clients sending short online requests; records the
    server-side TTFT of every completed one."""

    def __init__(self, stubs, channel):
        self.stubs, self.channel = stubs, channel
        self.ttft_ms = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(k,)) for k in range(2)]

    def run(self, k):
        rng = random.Random(k)
        while not self.stop.is_set():
            prompt = [rng.randrange(1, 256) for _ in range(rng.randrange(4, 17))]
            _, messages, code = sliced_client.generate(self.stubs, self.channel, "tiny-online", prompt, 4,
                                                       timeout_s=30)
            if code == grpc.StatusCode.OK and messages:
                self.ttft_ms.append(messages[0].time_from_arrival_ms)
            elif code != grpc.StatusCode.OK:
                return  # the daemon went away

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join()

    def attainment(self):
        return sum(1 for t in self.ttft_ms if t <= TTFT_SLO_MS) / max(len(self.ttft_ms), 1)


def submit(stubs, channel, text, **options):
    pb = stubs.batch_pb2
    stub = stubs.batch_pb2_grpc.BatchStub(channel)
    data = text.encode()
    chunks = [data[i:i + 4096] for i in range(0, len(data), 4096)]

    def gen():
        yield pb.SubmitBatchChunk(data=chunks[0], **options)
        for c in chunks[1:]:
            yield pb.SubmitBatchChunk(data=c)
    return stub.Submit(gen(), timeout=60)


def get(stubs, channel, batch_id):
    return stubs.batch_pb2_grpc.BatchStub(channel).Get(stubs.batch_pb2.GetBatchRequest(batch_id=batch_id), timeout=30)


def results(stubs, channel, batch_id):
    stub = stubs.batch_pb2_grpc.BatchStub(channel)
    data = b"".join(c.data for c in stub.Results(stubs.batch_pb2.BatchResultsRequest(batch_id=batch_id), timeout=120))
    return [json.loads(l) for l in data.decode().splitlines()]


def kill9(daemon):
    daemon.channel.close()
    daemon.channel = None
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait()
    daemon.proc = None
    daemon.log.close()


def wait_done(stubs, channel, batch_id, at_least, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        b = get(stubs, channel, batch_id)
        if b.succeeded + b.failed >= at_least or b.state != stubs.batch_pb2.BATCH_STATE_IN_PROGRESS:
            return b
        time.sleep(0.02)
    return get(stubs, channel, batch_id)


def pct(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else float("nan")


def main():
    with tempfile.TemporaryDirectory(prefix="sliced-batch-e2e-") as work:
        stubs = sliced_client.generate_stubs(REPO, os.path.join(work, "stubs"))
        daemon = sliced_client.Daemon(SLICED, work)
        try:
            run_checks(stubs, daemon, work)
        except Exception:
            if os.path.exists(daemon.log_path):
                print(daemon.log_text()[-6000:], flush=True)
            raise
        finally:
            if daemon.proc is not None:
                daemon.stop()
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("batch e2e: all checks passed")
    return 0


def run_checks(stubs, daemon, work):
    pb = stubs.batch_pb2
    text = batch_input(500, random.Random(7))
    path = os.path.join(work, "batch.jsonl")
    with open(path, "w") as f:
        f.write(text)
    want = {}
    out = subprocess.run([SLICESIM, "generate-direct", "--batch", path, "--model", "tiny", "--weights-seed", "2"],
                         check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        r = json.loads(line)
        want[r["custom_id"]] = r["tokens"]
    check(len(want) == 500, "generate-direct --batch answered %d of 500" % len(want))

    channel = daemon.start()
    # 1. Online load alone.
    with OnlineLoad(stubs, channel) as alone:
        time.sleep(4)
    base = alone.attainment()
    print("online alone: %d requests, TTFT <= %d ms for %.1f%%, TTFT p50 %.1f ms p99 %.1f ms" % (
        len(alone.ttft_ms), TTFT_SLO_MS, 100 * base, pct(alone.ttft_ms, 0.5), pct(alone.ttft_ms, 0.99)))

    # 2. The batch under online load, killed twice.
    during = []
    kills = []
    resp = submit(stubs, channel, text, deployment="tiny-offline", completion_window="24h")
    batch_id = resp.batch.id
    check(resp.accepted == 500 and resp.rejected == 0, "500 requests accepted: %s" % resp)
    for target in (150, 320):
        with OnlineLoad(stubs, channel) as load:
            b = wait_done(stubs, channel, batch_id, target)
        during.extend(load.ttft_ms)
        done = b.succeeded + b.failed
        check(b.state == pb.BATCH_STATE_IN_PROGRESS and done < 500,
              "the kill comes during the batch (%d/500 done, %s)" % (done, pb.BatchState.Name(b.state)))
        kills.append(done)
        kill9(daemon)
        channel = daemon.start()
        after = get(stubs, channel, batch_id)
        check(after.succeeded + after.failed >= done,
              "results stored before the kill survive it (%d before, %d after)" % (done, after.succeeded + after.failed))
    with OnlineLoad(stubs, channel) as load:
        b = wait_done(stubs, channel, batch_id, 500)
    during.extend(load.ttft_ms)
    print("batch %d: killed at %s done; finished %s with %d succeeded, %d failed, %d tokens" % (
        batch_id, kills, pb.BatchState.Name(b.state), b.succeeded, b.failed, b.completion_tokens))
    check(b.state == pb.BATCH_STATE_COMPLETED, "the batch completes after two kills: %s" % b)

    # 3. Every custom_id once, tokens equal to the direct computation.
    lines = results(stubs, channel, batch_id)
    ids = [l["custom_id"] for l in lines]
    check(len(lines) == 500, "the output has %d lines, want 500" % len(lines))
    check(len(set(ids)) == len(ids), "each custom_id once (%d duplicates)" % (len(ids) - len(set(ids))))
    wrong = [l["custom_id"] for l in lines
             if l["error"] is not None or l["response"]["body"]["choices"][0]["token_ids"] != want[l["custom_id"]]]
    check(not wrong, "%d answers differ from generate-direct, e.g. %s" % (len(wrong), wrong[:3]))

    # 4. Online SLO attainment during the batch.
    att = sum(1 for t in during if t <= TTFT_SLO_MS) / max(len(during), 1)
    print("online during the batch: %d requests, TTFT <= %d ms for %.1f%% (alone: %.1f%%), TTFT p50 %.1f ms "
          "p99 %.1f ms" % (len(during), TTFT_SLO_MS, 100 * att, 100 * base, pct(during, 0.5), pct(during, 0.99)))
    check(len(during) > 0 and att >= base, "online SLO attainment during the batch %.3f >= alone %.3f" % (att, base))

    # 5. Bad input by line number; cancel keeps finished results.
    bad = text.splitlines()[:3] + ['{"custom_id": "x", "method": "POST"}'] + text.splitlines()[3:5]
    try:
        submit(stubs, channel, "\n".join(bad) + "\n", deployment="tiny-offline", strict=True)
        check(False, "a strict submit with a bad line was accepted")
    except grpc.RpcError as e:
        check(e.code() == grpc.StatusCode.INVALID_ARGUMENT and "line 4:" in e.details(),
              "strict refusal names line 4: %s %s" % (e.code(), e.details()))
    loose = submit(stubs, channel, "\n".join(bad) + "\n", deployment="tiny-offline")
    check(loose.accepted == 5 and loose.rejected == 1 and loose.rejected_lines[0].startswith("line 4:"),
          "non-strict submit keeps the good lines and names line 4: %s" % loose)
    big = submit(stubs, channel, batch_input(300, random.Random(8)).replace("req-", "c-"), deployment="tiny-offline")
    wait_done(stubs, channel, big.batch.id, 20)
    cancelled = stubs.batch_pb2_grpc.BatchStub(channel).Cancel(pb.CancelBatchRequest(batch_id=big.batch.id),
                                                               timeout=30)
    check(cancelled.state == pb.BATCH_STATE_CANCELLED, "cancel: %s" % cancelled)
    kept = results(stubs, channel, big.batch.id)
    finished = [l for l in kept if l["error"] is None]
    check(len(kept) == 300 and len(finished) == cancelled.succeeded and len(finished) >= 20,
          "a cancelled batch lists all 300 requests and keeps its %d finished results (%d listed)" % (
              cancelled.succeeded, len(finished)))
    # 6. slicectl against the same daemon.
    def ctl(*args):
        return subprocess.run([SLICECTL, "--socket", daemon.socket] + list(args), capture_output=True, text=True)
    listed = ctl("batch", "list")
    check(listed.returncode == 0 and "completed" in listed.stdout and "cancelled" in listed.stdout,
          "slicectl batch list: %s %s" % (listed.stdout, listed.stderr))
    shown = ctl("batch", "get", str(batch_id))
    check(shown.returncode == 0 and "500/500" in shown.stdout, "slicectl batch get: %s %s" % (shown.stdout, shown.stderr))
    out = ctl("batch", "results", str(batch_id))
    check(out.returncode == 0 and len(out.stdout.splitlines()) == 500,
          "slicectl batch results prints 500 lines (%d)" % len(out.stdout.splitlines()))
    sub = ctl("batch", "submit", path, "--deployment", "tiny-offline", "--completion-window", "1h")
    check(sub.returncode == 0 and "500 request(s)" in sub.stdout, "slicectl batch submit: %s %s" % (sub.stdout, sub.stderr))
    new_id = sub.stdout.split()[1] if sub.returncode == 0 else "0"
    gone = ctl("batch", "cancel", new_id)
    check(gone.returncode == 0 and "cancelled" in gone.stdout, "slicectl batch cancel: %s %s" % (gone.stdout, gone.stderr))
    missing = ctl("batch", "get", "999")
    check(missing.returncode == 1 and "NOT_FOUND" in missing.stderr, "unknown batch: %s" % missing.stderr)
    rc = daemon.stop()
    check(rc == 0, "sliced exited with %s after SIGTERM" % rc)


if __name__ == "__main__":
    sys.exit(main())
