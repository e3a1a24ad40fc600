#!/usr/bin/env bash
# QEMU 7.2 (Debian 12's own, unpacked by scripts/qemu-7.2.sh) and the QEMU `forkbox setup`
# installs (10.0), side by side in one run: the fork bench (create from a template, fork of a
# running sandbox x1/x3/x10 to all answering, snapshot pause at 100 MB and 1 GB dirty, fork of
# an existing 1 GiB snapshot, i.e. its restore) under each, then every figure with its ratio
# 10/7.2 and the fork goals beside them; then QEMU's mapped-ram against its plain stream for a
# 1 GiB RAM save and restore (bench/mapped_ram.py). BENCH_CREATES (default 20) creates per median.
set -euo pipefail
cd "$(dirname "$0")/.."
export FORKBOX_TEST_HOME="${FORKBOX_TEST_HOME:-/var/tmp/forkbox-test}"
export BENCH_CREATES="${BENCH_CREATES:-20}"
old="$(scripts/qemu-7.2.sh)"
new="$(command -v qemu-system-x86_64)"
scripts/build.sh agent >/dev/null
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== fork bench on $("$old" --version | head -1) ($old)" >&2
FORKBOX_QEMU="$old" cargo bench --quiet --locked -p forkbox-engine --bench fork | tee "$out/old" >&2
echo "== fork bench on $("$new" --version | head -1) ($new)" >&2
FORKBOX_QEMU="$new" cargo bench --quiet --locked -p forkbox-engine --bench fork | tee "$out/new" >&2
python3 - "$out/old" "$out/new" "$("$old" --version | head -1)" "$("$new" --version | head -1)" <<'PY'
import re, sys
old, new = (open(p).read().splitlines() for p in sys.argv[1:3])
print(f"# bench/qemu.sh: A = {sys.argv[3]}, B = {sys.argv[4]}; figures in ms, B/A")
print("# goals (this machine): create <= 100 ms, fork x3 <= 400 ms, fork x10 <= 1500 ms (all answered)")
# A figure is a name and a number of ms; a line's shape is its text without its measured numbers
# (ms, MiB), so counts and sizes still tell lines apart.
fig = re.compile(r"([A-Za-z][\w ]*?)\s+(\d+(?:\.\d+)?) ms")
shape = lambda l: " ".join(re.sub(r"\d+(?:\.\d+)? (ms|MiB)", "#", l).split())
b_by_shape = {}
for l in new:
    b_by_shape.setdefault(shape(l), l)
for a in old:
    b = b_by_shape.get(shape(a))
    fa, fb = fig.findall(a), fig.findall(b or "")
    if not fa or len(fa) != len(fb):
        continue
    label = " ".join(re.split(r":|\bn=", a)[0].split())
    pairs = []
    for (name, va), (_, vb) in zip(fa, fb):
        x, y = float(va), float(vb)
        pairs.append(f"{name.strip()} {x:g} -> {y:g} ({y / x:.2f}x)" if x > 0 else f"{name.strip()} {x:g} -> {y:g}")
    print(f"{label:<52} " + ";  ".join(pairs))
PY
echo
# mapped-ram (QEMU 9.0+) against the plain stream, for a 1 GiB save and restore of RAM.
python3 bench/mapped_ram.py "$old" 1024
python3 bench/mapped_ram.py "$new" 1024
