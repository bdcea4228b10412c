# Sourced by the benchmark scripts that run `trireme up`: the release build ($T), a scratch
# directory ($dir, removed at exit with the cluster), and a cluster started in "$dir/c".
# shellcheck shell=bash
cargo build --release --locked -q -p trireme
T=$PWD/target/release/trireme
dir=$(mktemp -d)
up=
trap '[ -n "$up" ] && kill $up 2>/dev/null; rm -rf "$dir"' EXIT

# start_up ARGS...: a fresh `trireme up ARGS --port 0` in "$dir/c" (its log in "$dir/up.log");
# sets $up (its pid) and $uri (its NBD unix socket URI) once it serves.
start_up() {
  rm -rf "$dir/c" && mkdir "$dir/c"
  "$T" --data-dir "$dir/c" up "$@" --port 0 >"$dir/up.log" 2>&1 &
  up=$!
  for _ in $(seq 150); do [ -f "$dir/c/exports" ] && break; sleep 0.2; done
  [ -f "$dir/c/exports" ] || { echo "trireme up did not start:" >&2; cat "$dir/up.log" >&2; exit 1; }
  uri=$(head -1 "$dir/c/exports")
}

# stop_up: stops the cluster start_up started.
stop_up() {
  kill "$up"; wait "$up" || true
  up=
}
