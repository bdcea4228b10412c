#!/usr/bin/env bash
# Three NBD clients against the same nbdkit memory export, QD1 4K sequential reads: which one
# is the odd one out? (Context for the fio cross-check's NBD row.) Run from the repo root after
# `cargo build --release`.
set -euo pipefail
sock=$(mktemp -u /tmp/xk.XXXXXX.sock)
nbdkit --foreground --exit-with-parent --unix "$sock" memory 256M >/dev/null 2>&1 &
kit=$!
trap 'kill $kit' EXIT
while [ ! -S "$sock" ]; do sleep 0.05; done
uri="nbd+unix:///?socket=$sock"
echo "qemu-img bench, 50000 x 4K reads at QD1: $(qemu-img bench -f raw -c 50000 -d 1 -s 4k -S 4k -t none "$uri" 2>&1 | tail -1)"
fio --name=x --ioengine=nbd --uri="$uri" --rw=read --bs=4k --size=256M --iodepth=1 --runtime=4 --time_based \
  --output-format=json | python3 -c "import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index('{'):])['jobs'][0]; print('fio nbd engine, QD1:', round(j['read']['iops']), 'IOPS')"
./target/release/trireme --output json bench -b4K -s -t1 -o1 -d4 "$uri" \
  | python3 -c "import json,sys; d=json.load(sys.stdin); print('trireme bench, QD1:', round(d['iops']), 'IOPS, p50', d['read']['latency_us']['p50'], 'us')"
