#!/usr/bin/env bash
# Installs what trireme needs on Debian 12 and checks the Rust toolchain.
# The NBD clients are what the tests and the benchmark drive: fio (nbd engine), nbdkit (the
# benchmark's baseline), libnbd tools (nbdinfo, nbdcopy, nbdfuse: all in libnbd-bin), qemu-img/qemu-io.
# UCX (libucx-dev, ucx-utils for ucx_perftest) with clang/libclang for the bindgen step of
# crates/ucx-sys, and pkg-config to find it. openssl: the TLS tests use s_client as a foreign TLS peer.
# bsdutils: `script`, the pseudo-terminal the progress test runs commands in.
# prometheus, chromium and chromium-driver: the observability tests scrape a cluster with a
# real Prometheus and open its dashboard in headless Chromium over WebDriver.
# gdb: a test that finds a process hung prints its threads' stacks.
# e2fsprogs and mount: tests/full.rs fills a small ext4 file system on a loop device.
# cpio and busybox-static: tests/kernel_devices/ boots a guest (qemu-system-x86 from
# bookworm-backports, to match qemu-utils; Debian 12's 7.2 would replace it) whose kernel
# has the NBD client, ublk and nvme-tcp: a Debian 6.12 kernel, unpacked (not installed) below.
# python3-yaml: tests/csi.rs reads contrib/kubernetes/ and runs trireme with its arguments.
# libisal-dev: crates/erasure codes parity stripes with ISA-L (linked from Debian's package,
# so nothing is built with autotools).
# ceph-common, ceph-mon, ceph-osd: `rbd merge-diff` (no cluster needed) reads what `volume diff`
# writes; tests/ceph.rs starts a one-monitor, one-OSD Ceph cluster for `rbd import-diff` and
# `export-diff` both ways.
# lld: .cargo/config.toml links with it (the test binaries link about four times faster).
set -euo pipefail
pkgs=(fio nbdkit libnbd-bin python3-libnbd qemu-utils iproute2 iptables procps librsvg2-bin fonts-dejavu-core
      libucx-dev ucx-utils libclang-dev clang pkg-config
      etcd-server etcd-client protobuf-compiler libprotobuf-dev openssl bsdutils
      prometheus chromium chromium-driver gdb e2fsprogs mount ceph-common ceph-mon ceph-osd
      python3-yaml libisal-dev lld)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The guest's kernel and qemu: from bookworm-backports (qemu) and bookworm (linux 6.12). Not
# fatal: without them tests/kernel_devices/ says SKIPPED and why.
guest_setup() {
  local guest_dir=/var/cache/trireme-guest sudo="" kpkg kver work m
  [ -e "$guest_dir/ready" ] && [ -e "$guest_dir/modules/nvme-tcp.ko" ] && return 0
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ ! -e /etc/apt/sources.list.d/trireme-backports.sources ]; then
    printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
      | $sudo tee /etc/apt/sources.list.d/trireme-backports.sources >/dev/null
  fi
  $sudo apt-get update -qq || return 1
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    -t bookworm-backports qemu-system-x86 >/dev/null || return 1
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    busybox-static cpio xz-utils >/dev/null || return 1
  kpkg=$(apt-cache search --names-only '^linux-image-6\.12\.[0-9]+\+deb12-amd64$' | awk '{print $1}' | sort -V | tail -1)
  [ -n "$kpkg" ] || return 1
  work=$(mktemp -d)
  (cd "$work" && apt-get download "$kpkg" >/dev/null 2>&1 && dpkg-deb -x ./*.deb root) || return 1
  kver=${kpkg#linux-image-}
  $sudo mkdir -p "$guest_dir/modules"
  $sudo cp "$work/root/boot/vmlinuz-$kver" "$guest_dir/vmlinuz" || return 1
  for m in drivers/block/nbd drivers/block/ublk_drv fs/ext4/ext4 fs/jbd2/jbd2 fs/mbcache lib/crc16 \
           crypto/crc32c_generic drivers/net/virtio_net drivers/net/net_failover net/core/failover \
           drivers/nvme/common/nvme-auth drivers/nvme/common/nvme-keyring drivers/nvme/host/nvme-core \
           drivers/nvme/host/nvme-fabrics drivers/nvme/host/nvme-tcp; do
    xz -dc "$work/root/lib/modules/$kver/kernel/$m.ko.xz" | $sudo tee "$guest_dir/modules/$(basename $m).ko" >/dev/null || return 1
  done
  echo "$kver" | $sudo tee "$guest_dir/ready" >/dev/null
  rm -rf "$work"
}
guest_setup || echo "setup: no guest for the kernel-device test (qemu-system-x86 or the 6.12 kernel could not be had); it will be skipped" >&2
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || { echo "setup: cargo not found; install Rust with rustup (rust-version 1.85+)" >&2; exit 1; }
fi
