#!/usr/bin/env python3
"""gpu_coverage.py ROOT LISTED — checks that every kernel entry of ROOT/kernels-src/*/kernel.json
implements an op listed in LISTED (one op a line: what `test_gpu_* --list-ops` print). Prints the
count and every kernel without a GPU test; exits 1 if there is one (or no kernel at all)."""
import glob
import json
import os
import sys

root, listed = sys.argv[1], sys.argv[2]
ops = set(line.strip() for line in open(listed) if line.strip())
total, missing = 0, []
for f in sorted(glob.glob(os.path.join(root, "kernels-src", "*", "kernel.json"))):
    m = json.load(open(f))
    for k in m.get("kernels", []):
        total += 1
        if k.get("op") not in ops:
            missing.append(f"{m.get('name')}:{k.get('name')} (op {k.get('op')}, {os.path.relpath(f, root)})")
print(f"{total} kernel entries, {total - len(missing)} implement an op a GPU test declares")
for x in missing:
    print("no GPU test:", x)
if missing:
    print("HINT: add a case to a tests/test_gpu_*.c that reaches the kernel, and its op to that test's gpu_main list")
sys.exit(1 if missing or total == 0 else 0)
