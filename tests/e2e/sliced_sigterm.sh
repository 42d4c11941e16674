#!/bin/sh
# Starts the real `sliced` with a temp config, waits for its socket (bounded
# polling), sends SIGTERM and checks: exit status 0 and the state file exists.
# Usage: sliced_sigterm.sh PATH/TO/sliced
set -u
SLICED=$1
DIR=$(mktemp -d "${TMPDIR:-/tmp}/sliced-sigterm.XXXXXX")
trap 'rm -rf "$DIR"' EXIT
cat > "$DIR/sliced.yaml" <<YAML
cluster:
  devices: [{name: v, count: 2, type: testdev, memory: 1GiB, backend: virtual}]
  links: {default: {bandwidth: 10GB/s, latency: 5us}}
deployments:
  - {name: demo, model: tiny, weights: {seed: 1}, role: online}
listen: {unix_socket: $DIR/sliced.sock}
state_dir: $DIR/state
log_level: info
YAML
"$SLICED" --config "$DIR/sliced.yaml" &
PID=$!
i=0
while [ ! -S "$DIR/sliced.sock" ]; do
  i=$((i + 1))
  if [ $i -gt 300 ] || ! kill -0 $PID 2>/dev/null; then
    echo "FAIL: sliced did not create its socket" >&2
    kill -KILL $PID 2>/dev/null
    exit 1
  fi
  sleep 0.1
done
kill -TERM $PID
wait $PID
RC=$?
if [ $RC -ne 0 ]; then
  echo "FAIL: sliced exited with $RC after SIGTERM" >&2
  exit 1
fi
if [ ! -f "$DIR/state/sliced.db" ]; then
  echo "FAIL: no state file $DIR/state/sliced.db" >&2
  exit 1
fi
if [ -e "$DIR/sliced.sock" ]; then
  echo "FAIL: the socket was not removed" >&2
  exit 1
fi
echo "PASS: sliced drained on SIGTERM and exited 0"
