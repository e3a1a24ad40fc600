#!/usr/bin/env bash
# What a volume costs, measured in one run through the daemon of the test home (no warm pool,
# so every create restores the image's template): BENCH_ROUNDS (default 8) rounds of
#   - `forkbox volume create` of 1 GiB (space allocated, file system made on the host);
#   - `forkbox sandbox create` without a volume, and with that volume mounted read-write;
#   - a fork of a sandbox without a volume, and of one with its volume (unmounted while the
#     source is saved, mounted again after);
#   - writing 64 MiB to the volume with an fsync, and to the sandbox's own disk likewise;
# then the medians and the ratios, with and without.
set -euo pipefail
cd "$(dirname "$0")/.."
forkbox="$(scripts/build.sh)"
scripts/build.sh agent >/dev/null
export FORKBOX_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export FORKBOX_NO_TCG_NOTICE=1 FORKBOX_POOL_SIZE=0
rounds="${BENCH_ROUNDS:-8}"
"$forkbox" daemon stop >/dev/null 2>&1 || true
vol="bench-vol-$$"
# The daemon this bench starts goes with it, and so does its volume.
trap '"$forkbox" volume rm "$vol" >/dev/null 2>&1 || true; "$forkbox" daemon stop >/dev/null 2>&1 || true' EXIT
ms() { local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
# The template is made, and the daemon started, outside the figures.
"$forkbox" sandbox rm "$("$forkbox" sandbox create)" >/dev/null
vcreates=(); plain=(); withv=(); fplain=(); fwith=(); wvol=(); wroot=()
write='dd if=/dev/zero of=$0/bench bs=1M count=64 conv=fsync 2>/dev/null; rm $0/bench'
for _ in $(seq "$rounds"); do
  vcreates+=($(ms "$forkbox" volume create "$vol" --size 1g))
  s=$(date +%s%N); a=$("$forkbox" sandbox create --ttl 600); e=$(date +%s%N); plain+=($(( (e - s) / 1000000 )))
  s=$(date +%s%N); b=$("$forkbox" sandbox create --ttl 600 --volume "$vol:/data"); e=$(date +%s%N); withv+=($(( (e - s) / 1000000 )))
  "$forkbox" sandbox exec "$a" -- true; "$forkbox" sandbox exec "$b" -- true
  wroot+=($(ms "$forkbox" sandbox exec "$a" -- sh -c "$write" /root))
  wvol+=($(ms "$forkbox" sandbox exec "$b" -- sh -c "$write" /data))
  s=$(date +%s%N); fa=$("$forkbox" sandbox fork "$a" 2>/dev/null); e=$(date +%s%N); fplain+=($(( (e - s) / 1000000 )))
  s=$(date +%s%N); fb=$("$forkbox" sandbox fork "$b" 2>/dev/null); e=$(date +%s%N); fwith+=($(( (e - s) / 1000000 )))
  "$forkbox" sandbox rm "$a" "$b" "$fa" "$fb" >/dev/null
  "$forkbox" volume rm "$vol" >/dev/null
done
python3 - "${vcreates[*]}" "${plain[*]}" "${withv[*]}" "${fplain[*]}" "${fwith[*]}" "${wroot[*]}" "${wvol[*]}" <<'PY'
import statistics as st, sys
vc, p, w, fp, fw, wr, wv = ([int(x) for x in a.split()] for a in sys.argv[1:8])
med = st.median
def line(what, xs):
    print(f"{what:<48} {med(xs):>5.0f} ms  (min {min(xs)}, max {max(xs)})")
print(f"# bench/volumes.sh: {len(p)} rounds through the daemon (no warm pool), CLI wall times in ms, medians")
line("volume create, 1 GiB", vc)
line("sandbox create", p)
line("sandbox create with a volume (read-write)", w)
print(f"{'  with / without':<48} {med(w) / med(p):>5.2f}x")
line("fork of a sandbox", fp)
line("fork of a sandbox with a volume", fw)
print(f"{'  with / without':<48} {med(fw) / med(fp):>5.2f}x")
line("64 MiB written + fsync, the sandbox's own disk", wr)
line("64 MiB written + fsync, a volume", wv)
print(f"{'  volume / own disk':<48} {med(wv) / med(wr):>5.2f}x")
PY
