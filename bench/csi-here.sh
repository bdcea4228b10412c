#!/bin/sh
# How long a CO's CSI calls take on this host, end to end, against a cluster on etcd with
# mutual TLS (three node processes, 127.0.0.1), the volume staged as a loop device over FUSE
# (`trireme csi --node --device loop`: this host's kernel has neither ublk nor the NBD client):
#
# - create-to-mounted: CreateVolume (256 MiB, 2 copies), ControllerPublish, NodeStage
#   (map, mkfs.ext4, mount), NodePublish (bind mount): the pod's path holds a file system;
# - node-death-to-mounted-elsewhere: node A's service and its `map` killed -9, then
#   ControllerPublish to node B (which fences A's writer), NodeStage and NodePublish there;
# - unpublish-to-deleted: NodeUnpublish, NodeUnstage (unmount, unmap), ControllerUnpublish,
#   DeleteVolume.
#
#   bench/csi-here.sh [RUNS]     # root; /dev/fuse, nbdfuse, losetup, etcd; default 5 runs
#
# Each run is one run of tests/csi_here.rs (release build), which prints the three times;
# this prints each run's and their medians. Kubernetes adds its own sidecars' and kubelet's
# delays on top (Kubernetes' default before a pod moves off a dead node is 6 minutes, the
# out-of-service taint cuts it to what is measured here).
set -eu
runs="${1:-5}"
cd "$(dirname "$0")/.."
bin=$(cargo test --release -p trireme --test csi_here --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*csi_here[^"]*\)".*/\1/p' | tail -1)
[ -x "$bin" ] || { echo "could not build tests/csi_here.rs" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
cd crates/cli
i=0
while [ "$i" -lt "$runs" ]; do
  if ! "$bin" --nocapture --test-threads 1 >"$out.run" 2>&1; then
    tail -30 "$out.run" >&2
    exit 1
  fi
  # (the first may follow libtest's "test NAME ... " on its line)
  grep -o '@@ .*' "$out.run" | sed "s/^@@ /$i /" >>"$out"
  i=$((i + 1))
done
rm -f "$out.run"
echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs; loop device over FUSE (nbdfuse), etcd with mutual TLS"
echo "# seconds per run, then the median of $runs runs"
for what in create-to-mounted node-death-to-mounted-elsewhere unpublish-to-deleted; do
  all=$(awk -v w="$what" '$2 == w { print $3 }' "$out" | sort -n)
  med=$(echo "$all" | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }')
  printf '%-34s %s   median %s\n' "$what" "$(echo $all | tr '\n' ' ')" "$med"
done
