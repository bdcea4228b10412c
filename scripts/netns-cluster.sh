#!/usr/bin/env bash
# A cluster of several "servers" on one machine, each in its own network namespace, the way it
# runs on real servers: etcd, one `trireme node run` per server namespace, and `trireme attach`
# in a client namespace serving the volume over NBD.
#
#   sudo scripts/netns-cluster.sh up [SERVERS]   # default 3 servers; prints what to try next
#   sudo scripts/netns-cluster.sh down           # stops everything, removes the namespaces
#
# Layout: namespace trireme-sN holds server N at 10.77.N.2 (its host end 10.77.N.1); the client
# namespace trireme-c holds 10.77.99.2, and etcd runs in trireme-e at 10.77.0.2 (one member:
# enough to try it; use 3 or 5 in production). The host routes between them. Partition a server with: iptables -I FORWARD -s 10.77.N.2 -j DROP (and -d).
# State and logs go to ${TRIREME_NETNS_DIR:-/tmp/trireme-netns}.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TRIREME_BIN:-$PWD/target/release/trireme}
D=${TRIREME_NETNS_DIR:-/tmp/trireme-netns}
ETCD=https://10.77.0.2:2379
# Commands from this host run as the cluster's operator (an admin certificate).
ADMIN=(--etcd "$ETCD" --tls-identity "$D/tls-admin")

need_root() { [ "$(id -u)" -eq 0 ] || { echo "run as root (network namespaces)" >&2; exit 2; }; }

down() {
  need_root
  for p in "$D"/*.pid; do [ -f "$p" ] && kill "$(cat "$p")" 2>/dev/null || true; done
  sleep 1
  for ns in $(ip netns list | awk '/^trireme-(s[0-9]+|c|e)( |$)/{print $1}'); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  for v in $(ip -o link show | awk -F': ' '/trv[0-9ce]+@/{split($2,a,"@"); print a[1]}'); do ip link del "$v" 2>/dev/null || true; done
  [ -f "$D/ip_forward" ] && cat "$D/ip_forward" > /proc/sys/net/ipv4/ip_forward
  rm -f "$D"/*.pid "$D/ip_forward"
  echo "stopped; logs stay in $D"
}

# Namespace NAME at 10.77.K.2, its veth's host end at 10.77.K.1.
mkns() {
  local name=$1 k=$2 veth=trv$3
  ip netns add "$name"
  ip link add "$veth" type veth peer name eth0 netns "$name"
  ip addr add "10.77.$k.1/24" dev "$veth"
  ip link set "$veth" up
  ip -n "$name" addr add "10.77.$k.2/24" dev eth0
  ip -n "$name" link set eth0 up
  ip -n "$name" link set lo up
  ip -n "$name" route add default via "10.77.$k.1"
}

up() {
  need_root
  local n=${1:-3}
  [ -x "$T" ] || { echo "build first: make build (or set TRIREME_BIN)" >&2; exit 2; }
  command -v etcd >/dev/null || { echo "install etcd-server (scripts/setup.sh does)" >&2; exit 2; }
  mkdir -p "$D"
  cat /proc/sys/net/ipv4/ip_forward > "$D/ip_forward"
  echo 1 > /proc/sys/net/ipv4/ip_forward
  mkns trireme-e 0 e
  rm -rf "$D/etcd" "$D"/server-*  # a new cluster each time
  # One CA for the cluster, and every link on TLS: etcd takes only clients with a certificate
  # of it; each server gets a certificate for its address, the operator an admin one, the
  # client host one for its NBD export and one for its links to the servers.
  [ -f "$D/ca/ca-key.pem" ] || "$T" ca init --dir "$D/ca" >/dev/null
  # etcd refuses every connection while its revocation list is missing (a CA of an older run).
  [ -f "$D/ca/crl.pem" ] || "$T" ca crl --ca "$D/ca" >/dev/null
  "$T" ca issue server --san 10.77.0.2 --ca "$D/ca" --out "$D/tls-etcd" >/dev/null
  "$T" ca issue admin --ca "$D/ca" --out "$D/tls-admin" >/dev/null
  ip netns exec trireme-e etcd --name e1 --data-dir "$D/etcd" --listen-client-urls "$ETCD" \
    --advertise-client-urls "$ETCD" --listen-peer-urls http://10.77.0.2:2380 \
    --initial-advertise-peer-urls http://10.77.0.2:2380 --initial-cluster e1=http://10.77.0.2:2380 \
    --cert-file "$D/tls-etcd/server-cert.pem" --key-file "$D/tls-etcd/server-key.pem" \
    --trusted-ca-file "$D/tls-etcd/ca-cert.pem" --client-cert-auth \
    --client-crl-file "$D/ca/crl.pem" \
    --auto-compaction-mode=periodic --auto-compaction-retention=1h \
    --quota-backend-bytes=8589934592 \
    --log-level warn >"$D/etcd.log" 2>&1 &
  echo $! > "$D/etcd.pid"
  # Least privilege inside etcd too: each certificate's name becomes an etcd user whose role
  # covers what it needs (each node: trireme's keys; the client host: its volumes' records),
  # then etcd's access control goes on. Nodes refuse to start on an etcd any certificate may
  # write.
  for _ in $(seq 1 50); do
    "$T" "${ADMIN[@]}" etcd rbac --client client-host --node "$(seq -s, 1 "$n")" \
      >"$D/rbac.out" 2>&1 && break
    sleep 0.2
  done
  for i in $(seq 1 "$n"); do
    mkns "trireme-s$i" "$i" "$i"
    "$T" ca issue node "$i" --san "10.77.$i.2" --ca "$D/ca" --out "$D/tls-s$i" >/dev/null
    # One server = one namespace, with the default transport (TCP between hosts without RDMA).
    ip netns exec "trireme-s$i" "$T" --etcd "$ETCD" node run --id "$i" \
      --listen "10.77.$i.2:7000" --dir "$D/server-$i" --zone "zone-$i" --tls-dir "$D/tls-s$i" \
      >"$D/server-$i.out" 2>"$D/server-$i.log" &
    echo $! > "$D/server-$i.pid"
  done
  mkns trireme-c 99 c
  for _ in $(seq 1 100); do
    [ "$("$T" "${ADMIN[@]}" --output json node list 2>/dev/null | grep -c '"up": true')" -ge "$n" ] && break
    sleep 0.2
  done
  local reps=$(( n < 3 ? n : 3 ))
  # Only the client host (its links) and its NBD clients may use vol0.
  "$T" "${ADMIN[@]}" volume create vol0 --size 1G --replicas "$reps" \
    --allow client-host --allow nbd-user >/dev/null 2>&1 || true
  # The NBD export on TCP speaks TLS only: a server certificate for the client host's address,
  # and credentials for its NBD clients (nbdinfo/qemu read $D/nbd/client).
  "$T" ca issue server --san 10.77.99.2 --ca "$D/ca" --out "$D/nbd/server" >/dev/null
  "$T" ca issue client nbd-user --ca "$D/ca" --out "$D/nbd/client" >/dev/null
  "$T" ca issue client client-host --ca "$D/ca" --out "$D/tls-c" >/dev/null
  ip netns exec trireme-c "$T" --etcd "$ETCD" --tls-identity "$D/tls-c" attach vol0 \
    --listen 10.77.99.2:10809 --tls-dir "$D/nbd/server" --socket "$D/vol0.sock" \
    >"$D/attach.out" 2>"$D/attach.log" &
  echo $! > "$D/attach.pid"
  for _ in $(seq 1 100); do [ -S "$D/vol0.sock" ] && break; sleep 0.2; done
  "$T" "${ADMIN[@]}" status
  cat <<EOF

$n servers (namespaces trireme-s1..s$n), etcd at $ETCD, vol0 attached in namespace trireme-c.
Try:
  T=$T
  \$T --etcd $ETCD --tls-identity $D/tls-admin status
  ip netns exec trireme-c \$T bench --verify -b4K -r -w30 -t2 -o4 -d30 'nbd+unix:///vol0?socket=$D/vol0.sock'
  ip netns exec trireme-c nbdinfo "\$(sed -n 2p $D/attach.out)"   # over TCP with TLS
  \$T --etcd $ETCD --tls-identity $D/tls-admin maintenance rolling   # every server restarted in turn, I/O going on
  kill -9 \$(cat $D/server-2.pid)          # a server dies: I/O goes on, status shows it down
  ip netns exec trireme-s2 \$T --etcd $ETCD node run --id 2 --listen 10.77.2.2:7000 --dir $D/server-2 --zone zone-2 --tls-dir $D/tls-s2 &   # as it was started
  sudo $0 down
EOF
}

case "${1:-}" in
  up) shift; up "$@" ;;
  down) down ;;
  *) echo "usage: $0 up [SERVERS] | down" >&2; exit 2 ;;
esac
