#!/usr/bin/env python3
"""layers.py — checks tk's include graph against the layer table of docs/hacking.md.

    python3 tests/layers.py [ROOT]        exit 0 when every #include follows the table, else 1

The table (between <!-- layer-table --> and <!-- /layer-table --> in docs/hacking.md) names each
top-level folder that holds C sources, in order, with the folders whose headers it may include
("*": any; "—": none). A folder always may include its own headers. Every folder a row names must
be a row above it, so the graph cannot have a cycle. The known exceptions (between
<!-- layer-exceptions --> and <!-- /layer-exceptions -->) each name a file, the header it includes
against the table and the issue that removes it; an exception that no longer occurs is an error
too, so the list cannot rot. Includes in quotes are resolved as the compiler does with -I. -Iinclude:
a bare name is the including file's own folder, then include/; one that resolves to neither is a
generated header (build/gen) and is skipped.
"""
import os
import re
import subprocess
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def section(text, name):
    m = re.search(r"<!-- %s -->(.*?)<!-- /%s -->" % (name, name), text, re.S)
    if not m:
        raise SystemExit("docs/hacking.md: no <!-- %s --> section" % name)
    rows = []
    for line in m.group(1).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.strip().startswith("|") or set("".join(cells)) <= set("-: "):
            continue
        rows.append([c.strip("`") for c in cells])
    return rows[1:]  # the header row


def parse(root):
    text = open(os.path.join(root, "docs", "hacking.md"), encoding="utf-8").read()
    order, allowed, errors = [], {}, []
    for row in section(text, "layer-table"):
        folder, may = row[0].rstrip("/"), row[1]
        names = None if may == "*" else [] if may in ("—", "-", "") else [n.strip(" `/") for n in may.split(",")]
        for n in names or []:
            if n not in order:
                errors.append("layer table: %s may include %s, which is not a row above it" % (folder, n))
        order.append(folder)
        allowed[folder] = names
    exceptions = {}
    for row in section(text, "layer-exceptions"):
        exceptions[(row[0], row[1])] = row[2]
    return order, allowed, exceptions, errors


def ignored(root):
    """Paths git ignores in root (build trees such as build-fuzz/ hold generated C): none outside git."""
    try:
        out = subprocess.run(["git", "-C", root, "ls-files", "--others", "--ignored", "--exclude-standard",
                              "--directory"], capture_output=True, text=True, timeout=60)
    except OSError:
        return set()
    return {line.rstrip("/") for line in out.stdout.splitlines()} if out.returncode == 0 else set()


def sources(root):
    skip = ignored(root)
    for top in sorted(os.listdir(root)):
        if top in skip:
            continue
        if top.startswith(".") or top == "build" or not os.path.isdir(os.path.join(root, top)):
            continue
        for d, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(x for x in dirs if not x.startswith("."))
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    yield top, os.path.relpath(os.path.join(d, f), root)


def check(root):
    order, allowed, exceptions, errors = parse(root)
    seen = set()
    for top, path in sources(root):
        if top not in allowed:
            errors.append("%s: folder %s/ holds C sources but has no row in the layer table of docs/hacking.md"
                          % (path, top))
            allowed[top] = None
            continue
        text = open(os.path.join(root, path), encoding="utf-8", errors="replace").read()
        for lineno, inc in ((text.count("\n", 0, m.start()) + 1, m.group(1)) for m in INCLUDE.finditer(text)):
            if "/" in inc:
                target = inc
            elif os.path.exists(os.path.join(root, os.path.dirname(path), inc)):
                target = os.path.join(os.path.dirname(path), inc)
            elif os.path.exists(os.path.join(root, "include", inc)):
                target = "include/" + inc
            else:
                continue  # a generated header
            folder = target.split("/")[0]
            if folder == top or folder not in order or allowed[top] is None or folder in allowed[top]:
                continue
            if (path, target) in exceptions:
                seen.add((path, target))
                continue
            errors.append("%s:%d: includes %s: %s/ may include only %s (the layer table of docs/hacking.md)"
                          % (path, lineno, target, top, ", ".join(allowed[top]) or "nothing"))
    for (path, target), issue in sorted(exceptions.items()):
        if (path, target) not in seen:
            errors.append("layer exceptions: %s no longer includes %s: remove its row (issue %s)"
                          % (path, target, issue))
    return errors


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    errors = check(root)
    for e in errors:
        print(e)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
