# Sourced by the benchmark scripts that run `trireme up`: the release build ($T, unless T names
# one already), a scratch directory ($dir, removed at exit with the cluster), and a cluster
# started in "$dir/c".
# shellcheck shell=bash
if [ -z "${T:-}" ]; then
  cargo build --release --locked -q -p trireme
  T=$PWD/target/release/trireme
fi
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

# serve VOLUME: `trireme nbd VOLUME` (a volume, or VOLUME@SNAPSHOT read-only) on a socket of its
# own in "$dir", its log appended to "$dir/VOLUME.log"; sets $curi (its URI) and $cpid.
serve() {
  "$T" --data-dir "$dir/c" nbd "$1" --socket "$dir/$1.sock" >"$dir/$1.uri" 2>>"$dir/$1.log" &
  cpid=$!
  for _ in $(seq 100); do [ -s "$dir/$1.uri" ] && break; sleep 0.1; done
  curi=$(head -1 "$dir/$1.uri")
}
