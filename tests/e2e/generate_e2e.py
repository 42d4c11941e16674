#!/usr/bin/python3
"""End-to-end test of sliced from another stack.

Starts the real `sliced` binary with the embedded default config (4 CPU
devices, tiny-online with weights seed 1 and tiny-offline with seed 2), and
from Python (Debian's python3-grpcio, stubs generated from the .proto now):
  1. sends concurrent Generate calls to both deployments, greedy and nucleus
     sampling, and checks every stream against `slicesim generate-direct`
     (the same operators called directly with the same weights and seeds);
  2. checks bad requests are refused with the field named;
  3. registers a deployment, sends SIGTERM (exit status 0), restarts on the
     same state directory and checks the deployment and the estimator
     samples survived.

usage: generate_e2e.py REPO_ROOT SLICED SLICESIM
"""

import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile

import grpc

REPO, SLICED, SLICESIM = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, os.path.join(REPO, "tools"))
import sliced_client  # noqa: E402

WEIGHT_SEEDS = {"tiny-online": 1, "tiny-offline": 2}  # configs/sliced.yaml
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


def direct(deployment, prompt, max_tokens, temperature, top_p, seed, stop=(), top_k=0):
    cmd = [SLICESIM, "generate-direct", "--model", "tiny", "--weights-seed", str(WEIGHT_SEEDS[deployment]),
           "--prompt", ",".join(map(str, prompt)), "--max-tokens", str(max_tokens),
           "--temperature", str(temperature), "--top-p", str(top_p if top_p > 0 else 1.0), "--seed", str(seed),
           "--top-k", str(top_k)]
    if stop:
        cmd += ["--stop", ",".join(map(str, stop))]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)["tokens"]


def main():
    with tempfile.TemporaryDirectory(prefix="sliced-e2e-") as work:
        stubs = sliced_client.generate_stubs(REPO, os.path.join(work, "stubs"))
        daemon = sliced_client.Daemon(SLICED, work)
        try:
            return run_checks(stubs, daemon)
        except Exception:
            # An RPC that raises instead of failing a check: the daemon's
            # log says why (it is in the temporary directory, gone after).
            print(daemon.log_text()[-6000:], flush=True)
            raise


def run_checks(stubs, daemon):
    channel = daemon.start()
    try:
        # 1. Concurrent streams equal the direct computation.
        cases = []
        for i in range(16):
            dep = "tiny-online" if i % 2 == 0 else "tiny-offline"
            prompt = [(7 * i + k * 13) % 256 for k in range(1 + i % 5)]
            sampled = i % 3 == 0
            cases.append(dict(deployment=dep, prompt=prompt, max_tokens=4 + i % 4,
                              temperature=0.8 if sampled else 0.0, top_p=0.9 if sampled else 0.0,
                              seed=100 + i if sampled else 0, top_k=5 if i % 6 == 0 else 0))
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(cases)) as pool:
            results = list(pool.map(lambda c: sliced_client.generate(stubs, channel, **c), cases))
        for c, (tokens, messages, code) in zip(cases, results):
            check(code == grpc.StatusCode.OK, "Generate %s ended with %s" % (c, code))
            want = direct(c["deployment"], c["prompt"], c["max_tokens"], c["temperature"], c["top_p"], c["seed"],
                          top_k=c["top_k"])
            check(tokens == want, "Generate %s streamed %s, direct computation gives %s" % (c, tokens, want))
            check([m.index for m in messages] == list(range(len(messages))), "indices in order for %s" % c)
            check(messages and messages[-1].finish_reason == stubs.serving_pb2.FINISH_REASON_LENGTH,
                  "last message of %s has finish_reason LENGTH" % c)
        print("concurrent streams: %d requests checked against slicesim generate-direct" % len(cases))

        # 2. Bad requests name the field.
        for kwargs, code, mention in [
            (dict(deployment="nope", prompt=[1], max_tokens=2), grpc.StatusCode.NOT_FOUND, "deployment"),
            (dict(deployment="tiny-online", prompt=[], max_tokens=2), grpc.StatusCode.INVALID_ARGUMENT,
             "prompt_token_ids"),
            (dict(deployment="tiny-online", prompt=[1, 999], max_tokens=2), grpc.StatusCode.INVALID_ARGUMENT,
             "prompt_token_ids[1]"),
            (dict(deployment="tiny-online", prompt=[1], max_tokens=0), grpc.StatusCode.INVALID_ARGUMENT,
             "max_tokens"),
        ]:
            serving = stubs.serving_pb2_grpc.ServingStub(channel)
            req = stubs.serving_pb2.GenerateRequest(deployment=kwargs["deployment"],
                                                    prompt_token_ids=kwargs["prompt"],
                                                    max_tokens=kwargs["max_tokens"])
            try:
                list(serving.Generate(req, timeout=60))
                check(False, "bad request %s was accepted" % kwargs)
            except grpc.RpcError as e:
                check(e.code() == code and mention in e.details(),
                      "bad request %s: got %s %r, want %s mentioning %r" % (kwargs, e.code(), e.details(),
                                                                         code, mention))

        # 3. Restart keeps deployments and estimator state.
        serving = stubs.serving_pb2_grpc.ServingStub(channel)
        spec = stubs.serving_pb2.DeploymentSpec(name="e2e-extra",
                                                model=stubs.serving_pb2.ModelSpec(preset="tiny"),
                                                weights=stubs.serving_pb2.WeightsSpec(seed=5),
                                                role=stubs.serving_pb2.DEPLOYMENT_ROLE_ONLINE)
        serving.RegisterDeployment(stubs.serving_pb2.RegisterDeploymentRequest(spec=spec), timeout=60)
        admin = stubs.admin_pb2_grpc.AdminStub(channel)
        before = {(e.device_type, e.op_key): e.samples for e in admin.Estimators(stubs.admin_pb2.EstimatorsRequest(),
                                                                 timeout=60).ops}
        check(sum(before.values()) > 0, "estimators learned from the requests before the restart")
    finally:
        rc = daemon.stop()
    check(rc == 0, "sliced exited with %s after SIGTERM" % rc)

    channel = daemon.start()
    try:
        serving = stubs.serving_pb2_grpc.ServingStub(channel)
        names = [d.spec.name for d in serving.ListDeployments(stubs.serving_pb2.ListDeploymentsRequest(),
                                                               timeout=60).deployments]
        check("e2e-extra" in names, "deployment registered over gRPC survives a restart (have %s)" % names)
        admin = stubs.admin_pb2_grpc.AdminStub(channel)
        after = {(e.device_type, e.op_key): e.samples for e in admin.Estimators(stubs.admin_pb2.EstimatorsRequest(),
                                                                timeout=60).ops}
        lost = [k for k, n in before.items() if n > 0 and after.get(k, 0) < n]
        check(not lost, "estimator samples survive a restart (lost: %s)" % lost[:5])
        tokens, _, code = sliced_client.generate(stubs, channel, "e2e-extra", [1, 2, 3], 3)
        check(code == grpc.StatusCode.OK and len(tokens) == 3, "the restored deployment serves")
    finally:
        rc = daemon.stop()
    check(rc == 0, "sliced exited with %s after the second SIGTERM" % rc)
    if failures:
        print(daemon.log_text()[-4000:])
        print("%d check(s) failed" % len(failures))
        return 1
    print("generate_e2e: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
