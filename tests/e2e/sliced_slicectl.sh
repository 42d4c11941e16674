#!/bin/bash
# The real binaries together: `sliced` with a temp config (unix socket and
# the Prometheus listener), driven by `slicectl`, scraped over plain HTTP
# (bash's /dev/tcp), then drained with SIGTERM. Checks exit codes and output.
# Usage: sliced_slicectl.sh PATH/TO/sliced PATH/TO/slicectl
set -u
SLICED=$1
SLICECTL=$2
DIR=$(mktemp -d "${TMPDIR:-/tmp}/sliced-slicectl.XXXXXX")
PID=
trap '[ -n "$PID" ] && kill -KILL $PID 2>/dev/null; rm -rf "$DIR"' EXIT
fail() {
  echo "FAIL: $*" >&2
  [ -f "$DIR/sliced.log" ] && tail -5 "$DIR/sliced.log" >&2
  exit 1
}

# Bad overrides are usage errors naming the flag (exit 2), not a failed
# bind() with an empty path.
"$SLICED" --socket rel.sock --state-dir "$DIR/state" > "$DIR/bad.log" 2>&1
RC=$?
[ $RC -eq 2 ] || fail "sliced --socket rel.sock exited $RC, expected 2"
grep -q "^sliced: --socket: must be an absolute path, got 'rel.sock'$" "$DIR/bad.log" ||
  fail "sliced --socket rel.sock: $(cat "$DIR/bad.log")"

# The metrics port must be fixed in the config; try a few in case one is taken.
for attempt in 1 2 3; do
  PORT=$((20000 + (RANDOM % 20000)))
  cat > "$DIR/sliced.yaml" <<YAML
cluster:
  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]
  links: {default: {bandwidth: 10GB/s, latency: 5us}}
deployments:
  - {name: demo, model: tiny, weights: {seed: 1}, role: online}
listen: {unix_socket: $DIR/sliced.sock, metrics: "127.0.0.1:$PORT"}
state_dir: $DIR/state
log_level: info
YAML
  "$SLICED" --config "$DIR/sliced.yaml" > "$DIR/sliced.log" 2>&1 &
  PID=$!
  i=0
  while [ ! -S "$DIR/sliced.sock" ] && kill -0 $PID 2>/dev/null && [ $i -lt 300 ]; do
    i=$((i + 1))
    sleep 0.1
  done
  [ -S "$DIR/sliced.sock" ] && break
  kill -KILL $PID 2>/dev/null
  wait $PID 2>/dev/null
  PID=
  grep -q "listen.metrics" "$DIR/sliced.log" || fail "sliced did not create its socket"
done
[ -n "$PID" ] || fail "no free metrics port after 3 attempts"

CTL() { "$SLICECTL" --socket "$DIR/sliced.sock" "$@"; }

OUT=$(CTL status) || fail "slicectl status exited $?"
echo "$OUT" | grep -q "^state  *SERVING$" || fail "status: $OUT"
CTL --json devices | grep -q '"name": "v1"' || fail "devices --json"
CTL deployments | grep -q "^demo " || fail "deployments"
CTL timeline --out "$DIR/trace.json" > /dev/null || fail "timeline exited $?"
head -c 30 "$DIR/trace.json" | grep -q '{"displayTimeUnit"' || fail "timeline: not a Chrome trace"
CTL generate demo --prompt "1 2" --max-tokens 2 2> "$DIR/gen.err"
RC=$?
[ $RC -eq 1 ] || fail "generate exited $RC, expected 1 (the virtual backend computes no tokens)"
grep -q "FAILED_PRECONDITION" "$DIR/gen.err" || fail "generate: $(cat "$DIR/gen.err")"
CTL jobs > /dev/null || fail "jobs exited $? (the FineTune service is served)"
CTL frobnicate 2> /dev/null
RC=$?
[ $RC -eq 2 ] || fail "unknown command exited $RC, expected 2"

http_get() {  # PATH -> the whole response
  exec 3<> "/dev/tcp/127.0.0.1/$PORT" || return 1
  printf 'GET %s HTTP/1.1\r\nHost: localhost\r\n\r\n' "$1" >&3
  cat <&3
  exec 3<&-
}
RESP=$(http_get /metrics) || fail "cannot connect to the metrics port"
echo "$RESP" | head -1 | grep -q "^HTTP/1.1 200 OK" || fail "GET /metrics: $(echo "$RESP" | head -1)"
echo "$RESP" | grep -q '^slicesched_device_memory_capacity_bytes{device="v0",type="testdev"} 1073741824' ||
  fail "GET /metrics: no capacity sample"
http_get /nope | head -1 | grep -q "^HTTP/1.1 404" || fail "GET /nope is not 404"

kill -TERM $PID
wait $PID
RC=$?
PID=
[ $RC -eq 0 ] || fail "sliced exited with $RC after SIGTERM"
CTL status 2> /dev/null
RC=$?
[ $RC -eq 3 ] || fail "slicectl after shutdown exited $RC, expected 3"
echo "PASS: slicectl and /metrics against the real sliced"
