#!/usr/bin/env python3
"""Prints the slowest tests of a nextest JUnit report: slowest.py REPORT [N]."""
import sys
import xml.etree.ElementTree as ET

report, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 20
try:
    root = ET.parse(report).getroot()
except (OSError, ET.ParseError) as e:
    sys.exit(f"== no slowest tests: the run left no readable report ({e})")
tests = sorted(
    ((float(t.get("time", 0)), t.get("classname", ""), t.get("name", "")) for t in root.iter("testcase")),
    reverse=True,
)
total = sum(t[0] for t in tests)
print(f"== the {min(n, len(tests))} slowest of {len(tests)} tests ({total / 60:.0f} min of test time in {float(root.get('time', 0)) / 60:.0f} min)")
for secs, binary, name in tests[:n]:
    print(f"{secs:8.1f} s  {binary} {name}")
