"""A Python client of sliced, for tests and load generation.

Written against a different stack from the daemon on purpose: Debian's
python3-grpcio and python3-protobuf, with stubs generated from
proto/slicesched/v1/*.proto at run time by protoc and grpc_python_plugin
(protobuf-compiler, protobuf-compiler-grpc). Nothing is checked in.

    stubs = generate_stubs(repo_root, out_dir)     # -> module namespace
    daemon = Daemon(sliced_binary, work_dir)       # embedded config
    daemon.start(); ...; daemon.stop()             # SIGTERM, exit status
"""

import importlib
import os
import signal
import subprocess
import sys
import time
import types

import grpc


def generate_stubs(repo_root, out_dir):
    """Runs protoc on the repository's protos; returns a namespace with the
    serving/admin/finetune message and stub modules."""
    proto_root = os.path.join(repo_root, "proto")
    protos = sorted(
        os.path.join("slicesched", "v1", f)
        for f in os.listdir(os.path.join(proto_root, "slicesched", "v1"))
        if f.endswith(".proto")
    )
    os.makedirs(out_dir, exist_ok=True)
    plugin = "/usr/bin/grpc_python_plugin"
    cmd = [
        "protoc",
        "-I", proto_root,
        "--python_out=" + out_dir,
        "--grpc_python_out=" + out_dir,
        "--plugin=protoc-gen-grpc_python=" + plugin,
    ] + protos
    subprocess.run(cmd, check=True)
    for d in ("slicesched", os.path.join("slicesched", "v1")):
        open(os.path.join(out_dir, d, "__init__.py"), "a").close()
    if out_dir not in sys.path:
        sys.path.insert(0, out_dir)
    ns = types.SimpleNamespace()
    for name in ("serving", "admin", "finetune", "gmg", "batch"):
        setattr(ns, name + "_pb2", importlib.import_module("slicesched.v1.%s_pb2" % name))
        setattr(ns, name + "_pb2_grpc", importlib.import_module("slicesched.v1.%s_pb2_grpc" % name))
    return ns


class Daemon:
    """The real sliced binary on the embedded config, with its socket and
    state under work_dir."""

    def __init__(self, binary, work_dir, extra_args=()):
        self.binary = binary
        self.work_dir = work_dir
        self.socket = os.path.join(work_dir, "sliced.sock")
        self.state_dir = os.path.join(work_dir, "state")
        self.log_path = os.path.join(work_dir, "sliced.log")
        self.extra_args = list(extra_args)
        self.proc = None
        self.log = None
        self.channel = None

    def start(self, ready_timeout_s=240):
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--socket", self.socket, "--state-dir", self.state_dir] + self.extra_args,
            stdout=self.log, stderr=subprocess.STDOUT)
        # Bounded reconnect backoff: the socket appears only once the daemon
        # is up, and gRPC's default backoff grows to minutes.
        # A subchannel of its own: with gRPC's global subchannel pool a new
        # channel to the same socket path shares the connection of the
        # channel to the daemon that just stopped, which may still read
        # READY for a moment, so readiness would be reported before this
        # daemon even started (the RPC after it then fails with ENOENT).
        channel = grpc.insecure_channel("unix:" + self.socket, options=[
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            ("grpc.use_local_subchannel_pool", 1),
        ])
        self.channel = channel
        deadline = time.monotonic() + ready_timeout_s
        while True:
            try:
                # Blocks until the channel connects (the daemon listens only
                # once its master is up), one second at a time so that a
                # daemon that exits during start-up is noticed at once.
                grpc.channel_ready_future(channel).result(timeout=1)
                break
            except grpc.FutureTimeoutError:
                rc = self.proc.poll()
                if rc is None and time.monotonic() < deadline:
                    continue
                if rc is None:
                    self.proc.kill()
                    self.proc.wait()
                self.log.close()
                raise RuntimeError("sliced did not become ready within %d s (%s); its log:\n%s" % (
                    ready_timeout_s, "exited with %s" % rc if rc is not None else "still running, killed",
                    self.log_text()[-6000:]))
        return channel

    def stop(self, timeout_s=120):
        """SIGTERM; returns the exit status."""
        if self.proc is None:
            return None
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        self.log.close()
        return rc

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")


def generate(stubs, channel, deployment, prompt, max_tokens, temperature=0.0, top_p=0.0, seed=0,
             stop=(), timeout_s=300, priority_class=0, top_k=0):
    """One Generate call; returns (tokens, messages, grpc status code)."""
    serving = stubs.serving_pb2_grpc.ServingStub(channel)
    req = stubs.serving_pb2.GenerateRequest(
        deployment=deployment, prompt_token_ids=list(prompt), max_tokens=max_tokens,
        sampling=stubs.serving_pb2.SamplingParams(temperature=temperature, top_p=top_p, seed=seed, top_k=top_k),
        stop_token_ids=list(stop), priority_class=priority_class)
    messages = []
    try:
        for m in serving.Generate(req, timeout=timeout_s):
            messages.append(m)
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    return [m.token_id for m in messages], messages, code
