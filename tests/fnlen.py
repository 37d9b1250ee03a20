#!/usr/bin/env python3
"""fnlen.py — the house rule "no function over ~120 lines outside tests and kernels" (docs/hacking.md).

    fnlen.py ROOT [--max N]   # lists every C function longer than N lines (120); exit 1 if any

A function is counted from its first signature line to the closing brace at column 0, as tk's style
writes them (the opening brace alone on its line at column 0, or after the signature for one-line
bodies). Files: every .c under ROOT except tests/, kernels-src/, build*/ and the fuzz harnesses.
"""
import os
import re
import sys

SKIP_DIRS = ("tests", "kernels-src", ".git", "python")
SIG = re.compile(r"^[A-Za-z_][A-Za-z0-9_ \*\(\),\[\]]*\(")  # a declaration starting at column 0


def functions(path):
    """(name, first line, length) of each function in path."""
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if lines[i] == "{":
            # the signature: back up over the lines that continue it (indented or starting at col 0)
            s = i - 1
            while s > 0 and lines[s] and lines[s][0] in " \t" and not lines[s].strip().endswith(";"):
                s -= 1
            j = i + 1
            while j < len(lines) and lines[j] != "}":
                j += 1
            if SIG.match(lines[s]) and not lines[s].startswith(("typedef", "struct", "enum", "static const", "const")):
                m = re.search(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", lines[s])
                out.append((m.group(1) if m else "?", s + 1, j - s + 1))
            i = j
        i += 1
    return out


def main():
    root = sys.argv[1]
    limit = int(sys.argv[sys.argv.index("--max") + 1]) if "--max" in sys.argv else 120
    bad = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        top = rel.split(os.sep)[0]
        if rel != "." and (top in SKIP_DIRS or top.startswith("build") or top.startswith(".")):
            dirs[:] = []
            continue
        for f in sorted(files):
            if f.endswith(".c"):
                p = os.path.join(d, f)
                for name, line, n in functions(p):
                    if n > limit:
                        bad.append((n, os.path.relpath(p, root), line, name))
    for n, p, line, name in sorted(bad, reverse=True):
        print(f"{p}:{line}: {name} is {n} lines (the limit is {limit}; split it into steps: docs/hacking.md)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
