#!/usr/bin/env bash
# A forkbox cluster's figures, with ratios measured in the same run (issue: beyond one machine):
#   - a plain exec's round trip through a node that does not own the sandbox against its owner:
#     what forwarding adds at p50 (goal <= 2 ms);
#   - create p50 through the cluster (placed, maybe forwarded, ownership recorded in etcd)
#     against a single daemon on the same machine (goal <= 1.1x);
#   - the placement decision (nodes read from etcd and ranked) with 3 nodes and
#     BENCH_SANDBOXES (default 100) sandboxes in the cluster: p99 (goal <= 10 ms);
#   - from kill -9 of a node to its sandboxes listed lost (goal <= the lease + 1 s);
#   - snapshots between nodes by chunks: a running sandbox (1 GiB, BENCH_WRITE_MB=100 MB written
#     since its template) forked onto another node, one copy answering (goal <= 1.0 s, and <=
#     1.5x the same fork on its own node), bytes moved against what the node lacked (<= 1.1x),
#     a repeat (<= 1 MiB), three copies spread over two nodes (<= 1.5 s); a create on a node of
#     an image it never held (bytes moved ~ the image's data), next to building it.
# BENCH_ONLY=transfer runs the last part alone; BENCH_FRESH=1 gives b and c homes of their own
# (b the image only, c nothing), as fresh nodes.
# Three nodes, each in a network namespace of its own with its own home (sharing the test
# home's kernel and images), on a real 3-member etcd in a fourth; everything is removed at the
# end. Needs root, etcd (Debian's etcd-server) and python3.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
command -v etcd >/dev/null || { echo "bench: etcd is needed (apt-get install etcd-server)" >&2; exit 1; }
shared="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
sandboxes="${BENCH_SANDBOXES:-100}"
execs="${BENCH_EXECS:-200}"
creates="${BENCH_CREATES:-20}"
lease=5
work=$(mktemp -d /var/tmp/forkbox-bench-cluster.XXXXXX)
tag="fbb$(( $$ % 100000 ))"
net="10.251.$(( $$ % 250 ))"
hub="${tag}hub"
secret=$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')
export FORKBOX_CLUSTER_SECRET="$secret" FORKBOX_NO_TCG_NOTICE=1 FORKBOX_POOL_SIZE=0
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for i in 0 1 2; do ip netns del "${tag}n$i" 2>/dev/null || true; done
  ip netns del "$hub" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
home() {  # a home of its own that shares the test home's kernels and images (c: no images)
  mkdir -p "$work/$1"
  for sub in kernels images cache templates; do
    if [ "$1" = node-c ] && [ "$sub" = images ]; then mkdir -p "$work/$1/images"; continue; fi
    # BENCH_FRESH=1: b and c hold no template and no cache of a's (b holds only the image, c
    # nothing): each makes or brings what it needs, as a node does on its first day.
    if [ "${BENCH_FRESH:-0}" = 1 ] && [ "$1" != node-a ] && [ "$sub" != kernels ] \
      && { [ "$sub" != images ] || [ "$1" = node-c ]; }; then
      mkdir -p "$work/$1/$sub"; continue
    fi
    ln -sfn "$shared/$sub" "$work/$1/$sub"
  done
  echo "$work/$1"
}
ip netns add "$hub"
ip -n "$hub" link set lo up
ip -n "$hub" link add br0 type bridge
ip -n "$hub" addr add "$net.1/24" dev br0
ip -n "$hub" link set br0 up
for i in 0 1 2; do
  ns="${tag}n$i"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip -n "$hub" link add "v${i}h" type veth peer name "v${i}n" netns "$ns"
  ip -n "$hub" link set "v${i}h" master br0 up
  ip -n "$ns" addr add "$net.1$i/24" dev "v${i}n"
  ip -n "$ns" link set "v${i}n" up
done
initial="e0=http://$net.1:2380,e1=http://$net.1:2390,e2=http://$net.1:2400"
endpoints="http://$net.1:2379,http://$net.1:2389,http://$net.1:2399"
for i in 0 1 2; do
  c=$(( 2379 + 10 * i )); p=$(( 2380 + 10 * i ))
  ip netns exec "$hub" etcd --name "e$i" --data-dir "$work/etcd$i" \
    --listen-client-urls "http://$net.1:$c" --advertise-client-urls "http://$net.1:$c" \
    --listen-peer-urls "http://$net.1:$p" --initial-advertise-peer-urls "http://$net.1:$p" \
    --initial-cluster "$initial" --initial-cluster-token bench --initial-cluster-state new \
    >"$work/etcd$i.log" 2>&1 &
  pids+=($!)
done
for _ in $(seq 60); do
  ETCDCTL_API=3 ip netns exec "$hub" etcdctl --endpoints "$endpoints" endpoint health >/dev/null 2>&1 && break
  sleep 0.5
done
names=(a b c)
node_pid=()
start_node() {  # $1: index
  local i=$1 h
  h=$(home "node-${names[$i]}")
  FORKBOX_HOME="$h" ip netns exec "${tag}n$i" "$forkbox" serve --listen "$net.1$i:7070" \
    --cluster "$endpoints" --node "${names[$i]}" --advertise "http://$net.1$i:7070" \
    --lease "$lease" >"$work/node$i.out" 2>&1 &
  node_pid[$i]=$!
  pids+=($!)
  for _ in $(seq 120); do [ -S "$h/forkbox.sock" ] && break; sleep 0.5; done
}
for i in 0 1 2; do start_node "$i"; done
token=$(FORKBOX_HOME="$work/node-a" ip netns exec "${tag}n0" "$forkbox" token create --name bench --cluster "$endpoints")
probe() { local ns=$1; shift; ip netns exec "$ns" python3 bench/cluster_probe.py "$@"; }
url() { echo "http://$net.1$1:7070"; }
echo "== snapshots and images between nodes by chunks"
write_mb="${BENCH_WRITE_MB:-100}"
probe "${tag}n0" image "$(url 0)" "$token" c python-bookworm | grep -v IMAGE_MOVED
data=$(stat -c %b "$shared/images/python-bookworm/1/rootfs.ext4")
echo "  the image's data on disk: $(( data * 512 / 1000000 )) MB; building it here took $(python3 -c "import json; print(round(json.load(open('$shared/images/python-bookworm/1/image.json'))['build_seconds']))") s"
probe "${tag}n0" transfer "$(url 0)" "$token" "$write_mb"
grep -h "brought from" "$work"/node-*/daemon.log | sed 's/^[^ ]* *INFO [^ ]* /  /' | cut -c1-260
if [ "${BENCH_ONLY:-}" = transfer ]; then exit 0; fi
echo "== a sandbox on b; exec through b (its owner) and through a, $execs each"
sid=$(probe "${tag}n1" fill "$(url 1)" "$token" 1 | awk '{print $1}')
probe "${tag}n0" exec "$(url 1)" "$(url 0)" "$token" "$sid" "$execs"
echo "== create then delete, $creates each: through the cluster (node a, placed anywhere) and a single daemon"
cluster_out=$(probe "${tag}n0" creates "$(url 0)" "$token" "$creates")
echo "cluster: $cluster_out" | grep -v CREATE_P50
single_home=$(home single)
FORKBOX_HOME="$single_home" "$forkbox" token create --name bench >"$work/single-token"
FORKBOX_HOME="$single_home" ip netns exec "${tag}n0" "$forkbox" serve --listen "$net.10:7071" >"$work/single.out" 2>&1 &
pids+=($!)
for _ in $(seq 120); do [ -S "$single_home/forkbox.sock" ] && break; sleep 0.5; done
single_out=$(probe "${tag}n0" creates "http://$net.10:7071" "$(cat "$work/single-token")" "$creates")
echo "single daemon: $single_out" | grep -v CREATE_P50
c50=$(echo "$cluster_out" | awk '/CREATE_P50_MS/ {print $2}')
s50=$(echo "$single_out" | awk '/CREATE_P50_MS/ {print $2}')
echo "create p50 through the cluster / a single daemon: $(python3 -c "print(f'{$c50 / $s50:.2f}x')") (goal: <= 1.1x)"
if [ "$sandboxes" -eq 0 ]; then
  grep -ho 'recorded in etcd in [0-9.]* ms' "$work"/node-*/daemon.log | awk '{print $5}' | sort -n | awk '{a[NR]=$1} END {print "ownership writes: n=" NR ", p50 " a[int(NR/2)+1] " ms"}'
  exit 0
fi
echo "== $sandboxes sandboxes placed through the three nodes; the placement decisions' p99"
n=$(( sandboxes / 3 ))
fills=()
probe "${tag}n0" fill "$(url 0)" "$token" "$n" >/dev/null & fills+=($!)
probe "${tag}n1" fill "$(url 1)" "$token" "$n" >/dev/null & fills+=($!)
probe "${tag}n2" fill "$(url 2)" "$token" "$(( sandboxes - 2 * n ))" >/dev/null & fills+=($!)
for f in "${fills[@]}"; do wait "$f"; done
cat "$work"/node-*/daemon.log | grep -o 'decided in [0-9]* µs' | awk '{print $3}' | sort -n >"$work/decisions"
python3 - "$work/decisions" <<'PY'
import sys
xs = [int(l) / 1000 for l in open(sys.argv[1]) if l.strip()]
xs.sort()
p = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
print(f"placement decisions: n={len(xs)}, p50 {p(0.5):.2f} ms, p99 {p(0.99):.2f} ms (goal: p99 <= 10 ms)")
PY
echo "== kill -9 of node c: until its sandboxes are listed lost (lease $lease s)"
on_c=$(FORKBOX_HOME="$work/node-a" "$forkbox" sandbox ls --node c -q | wc -l)
t0=$(date +%s%N)
kill -9 "${node_pid[2]}"
while :; do
  lost=$(FORKBOX_HOME="$work/node-a" "$forkbox" sandbox ls --node c --state lost -q | wc -l)
  [ "$lost" -ge "$on_c" ] && [ "$on_c" -gt 0 ] && break
  sleep 0.05
done
t1=$(date +%s%N)
echo "kill -9 to $on_c sandboxes listed lost: $(( (t1 - t0) / 1000000 )) ms (goal: <= $(( lease * 1000 + 1000 )) ms)"
echo "== cleaning up (the sandboxes of a and b, then c's VMs with its restart)"
start_node 2
for i in 0 1 2; do
  FORKBOX_HOME="$work/node-${names[$i]}" "$forkbox" sandbox ls -q --node "${names[$i]}" | xargs -r -n 20 env FORKBOX_HOME="$work/node-${names[$i]}" "$forkbox" sandbox rm >/dev/null || true
done
