#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<name>/) from real inputs: the manifests,
signatures and archives `make` publishes for kernels-src/ (build/registry), the launch rules in the
kernel packages' kernel.json, and the request and file formats the tests use. The seeds are committed;
run this again (python3 tests/fuzz/seeds.py [BUILD]) after a format change and commit the difference.
Each seed is small: libFuzzer's default input cap follows the largest seed."""
import glob, gzip, hashlib, io, json, os, shutil, struct, subprocess, sys, tarfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build")
corpus = os.path.join(root, "tests", "fuzz", "corpus")


def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def published():
    """(package, manifest bytes, sig bytes, archive bytes) for each package of build/registry."""
    out = []
    for res in sorted(glob.glob(os.path.join(build, "registry/kernels/*/*/resolve"))):
        commit = os.readlink(os.path.join(res, "v1"))
        d = os.path.join(res, commit)
        read = lambda n: open(os.path.join(d, n), "rb").read()
        out.append((os.path.basename(os.path.dirname(res)), read("manifest.json"), read("manifest.json.sig"),
                    read("source.tar.gz")))
    return out


def tar(members, compress=None, fmt=tarfile.PAX_FORMAT):
    """members: (name, bytes or None for a directory, type override or None, linkname)."""
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=fmt) as t:
        for name, data, typ, link in members:
            ti = tarfile.TarInfo(name)
            ti.mtime = 0
            if typ is not None:
                ti.type = typ
                ti.linkname = link or ""
            elif data is None:
                ti.type = tarfile.DIRTYPE
            if data is not None:
                ti.size = len(data)
            t.addfile(ti, io.BytesIO(data) if data is not None else None)
    raw = bio.getvalue()
    if compress == "gz":
        return gzip.compress(raw, mtime=0)
    if compress == "zst":
        return subprocess.run(["zstd", "-q", "-c"], input=raw, stdout=subprocess.PIPE, check=True).stdout
    return raw


pkgs = published()
if not pkgs:
    sys.exit("seeds.py: no packages under %s/registry; run make first" % build)

# manifest: each package's manifest trimmed to its first kernel, and the two smallest whole
for name, man, sig, arc in pkgs:
    m = json.loads(man)
    m["kernels"] = m["kernels"][:1]
    put("manifest", name + "-1kernel.json", json.dumps(m, indent=2))
for name, man, sig, arc in sorted(pkgs, key=lambda p: len(p[1]))[:2]:
    put("manifest", name + ".json", man)

# sig: signature file, NUL, the manifest it signs (the smallest package: a valid signature)
name, man, sig, arc = min(pkgs, key=lambda p: len(p[1]))
put("sig", name + "-valid", sig + b"\0" + man)
put("sig", name + "-other-message", sig + b"\0" + b"{}")
put("sig", "empty-message", sig)

# expr: every distinct launch rule and constraint expression of kernels-src/, with default values
exprs = set()
for spec in sorted(glob.glob(os.path.join(root, "kernels-src/*/kernel.json"))):
    for k in json.load(open(spec)).get("kernels", []):
        L = k.get("launch", {})
        exprs.update(L.get("grid", []) + L.get("block", []) + ([L["smem"]] if "smem" in L else []))
        for b in ("min", "max"):
            exprs.update(k.get("constraints", {}).get(b, {}).keys())
for i, e in enumerate(sorted(exprs)[:40]):
    put("expr", "rule-%02d" % i, e.encode() + b"\n\x02" + struct.pack("<qq", 4, 4096))
put("expr", "strided", b"out.stride[0] * out.shape[1]\n\x02" + struct.pack("<qq", 4, 8) + b"\x01" +
    struct.pack("<qq", 8, 1))
put("expr", "scalars", "cdiv(n, 256) + align(d, 32) - min(max(n, d), 7) % 3\n")

# ref: references, names, versions, paths, keys, dtypes, sizes, URLs
refs = ["kernels-community/activation", "kernels-community/activation@1", "kernels-community/activation@v2",
        "kernels-community/activation@" + "0123456789abcdef0123456789abcdef01234567", "org/name@",
        "1.0.0", "10.20.30", "include/b.cuh", "../etc/passwd", "bf16", "fp8_e4m3", "512MiB", "2G",
        "-9223372036854775808", "https://hub.example:8443/api/x?y#z", "file:///tmp/registry",
        json.loads(sig)["pubkey"], json.loads(sig)["keyid"]]
for i, r in enumerate(refs):
    put("ref", "ref-%02d" % i, r)

# yank: statements as tk_hub__yank_make writes them
put("yank", "yank", json.dumps({"format_version": 1, "type": "yank", "name": "kernels-community/activation",
                                "version": "1.0.2", "reason": "wrong results for bf16 inputs"}))
put("yank", "no-reason", '{"format_version": 1, "type": "yank", "name": "org/name", "version": "2.0.0"}')
put("yank", "bad-version", '{"format_version": 1, "type": "yank", "name": "org/name", "version": "../1.0.0"}')

# lock: lock files as `tk lock` writes them
put("lock", "tk.lock", json.dumps({"format_version": 1, "registry": "file:///tmp/registry", "packages": [
    {"name": "kernels-community/activation", "major": 1, "version": "1.0.0",
     "commit": "093b4a703d75df8ae4cd7b2b365efe104712238f", "manifest_sha256": hashlib.sha256(man).hexdigest()}]},
    indent=2) + "\n")
put("lock", "empty", '{"format_version": 1, "registry": "x", "packages": []}\n')
put("lock", "long-name", json.dumps({"format_version": 1, "packages": [
    {"name": "o/" + "n" * 300, "commit": "0" * 40, "manifest_sha256": "0" * 64}]}))

# blob: compiled binaries in the cache's blob format ("TKJB", version 1)
def blob(cubin, ptx, lowered):
    b = b"TKJB" + struct.pack("<I", 1)
    b += struct.pack("<Q", len(cubin)) + cubin + struct.pack("<Q", len(ptx)) + ptx
    b += struct.pack("<I", len(lowered))
    for l in lowered:
        b += struct.pack("<Q", len(l)) + l
    return b
put("blob", "cubin", blob(b"\x7fELF" + bytes(60), b"", [b"_Z4silu", b"tk_silu_and_mul"]))
put("blob", "ptx", blob(b"", b".version 8.0\n.target sm_90\n", [b"k"]))
put("blob", "both", blob(b"\x7fELF", b".version 8.0\n", []))

# archive: the three files fuzz_archive.c expects, good and hostile
files = [("a.cu", b"__global__ void k(float *x) { x[0] = 1.0f; }\n"), ("include/b.cuh", b"#pragma once\n"),
         ("README.md", b"# fuzz\n")]
good = [(n, d, None, None) for n, d in files]
put("archive", "good.tar.gz", tar(good, "gz"))
put("archive", "good.tar.zst", tar(good, "zst"))
put("archive", "with-dirs.tar.gz", tar([("include/", None, None, None)] + good, "gz"))
put("archive", "symlink.tar.gz", tar(good[:2] + [("README.md", None, tarfile.SYMTYPE, "/etc/passwd")], "gz"))
put("archive", "hardlink.tar.gz", tar(good[:2] + [("README.md", None, tarfile.LNKTYPE, "a.cu")], "gz"))
put("archive", "dotdot.tar.gz", tar(good + [("../escape", b"x", None, None)], "gz"))
put("archive", "absolute.tar.gz", tar(good + [("/tmp/escape", b"x", None, None)], "gz"))
put("archive", "duplicate.tar.gz", tar(good + [good[0]], "gz"))
put("archive", "wrong-size.tar.gz", tar(good[:2] + [("README.md", b"# fuzz!\n", None, None)], "gz"))
put("archive", "ustar.tar.gz", tar(good, "gz", tarfile.USTAR_FORMAT))
put("archive", "plain.tar", tar(good))

# upload: the plain tar `tk publish` uploads (the smallest package), and refused ones
name, man, sig, arc = min(pkgs, key=lambda p: len(p[3]))
up = [("manifest.json", man, None, None), ("manifest.json.sig", sig, None, None), ("source.tar.gz", arc, None, None)]
put("upload", "upload.tar", tar(up))
put("upload", "dot-slash.tar", tar([("./" + n, d, t, l) for n, d, t, l in up]))
put("upload", "extra-file.tar", tar(up + [("evil.sh", b"x", None, None)]))
put("upload", "symlink.tar", tar(up[:2] + [("source.tar.gz", None, tarfile.SYMTYPE, "/etc/passwd")]))

# http: responses as registries, CDNs and proxies send them (first byte: the call, see fuzz_http.c)
R = lambda mode, text: bytes([mode]) + text.encode()
put("http", "ok", R(0, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nETag: \"abc\"\r\nX-Repo-Commit: "
                    + "0" * 40 + "\r\n\r\nok"))
put("http", "chunked", R(0, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"))
put("http", "not-found", R(0, "HTTP/1.1 404 Not Found\r\nX-Error-Code: EntryNotFound\r\nContent-Length: 0\r\n\r\n"))
put("http", "retry-after", R(0, "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"))
put("http", "redirect", R(0, "HTTP/1.1 302 Found\r\nLocation: http://cdn.example/x\r\nContent-Length: 0\r\n\r\n"))
put("http", "over-cap", R(4, "HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + "x" * 40))
put("http", "truncated", R(0, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"))
put("http", "file", R(1, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n"))
put("http", "resume", R(3, "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-11/12\r\nContent-Length: 2\r\n\r\n\nx"))
put("http", "resume-ignored", R(3, "HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\nhello world\n"))
put("http", "range-416", R(3, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */10\r\n\r\n"))
put("http", "upload", R(8, "HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 60\r\n\r\n"
                        + json.dumps({"commit": "0" * 40, "created": True}).ljust(60)))
put("http", "http10", R(0, "HTTP/1.0 200 OK\r\n\r\nbody until close"))

# serve: PATH \n RANGE \n IF-NONE-MATCH (then a size byte)
put("serve", "resolve", "/kernels/org/name/resolve/v1/manifest.json\nbytes=0-99\n\"0123456789abcdef\"\n\x02")
put("serve", "suffix", "/api/kernels/org/name/revision/main\nbytes=-10\nW/\"x\", \"0123456789abcdef\"\n\x01")
put("serve", "open", "/api/kernels/org/name/refs\nbytes=5-\n*\n\x03")
put("serve", "dots", "/kernels/../name/resolve/./x\nbytes=1-2,4-5\n\n")

# serve_live: requests to a live `tk serve` (fuzz_serve_live.c: package fuzz/pkg, @TOKEN@)
G = lambda path, extra="": "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" % (path, extra)
put("serve_live", "info", G("/api/kernels/fuzz/pkg"))
put("serve_live", "refs", G("/api/kernels/fuzz/pkg/refs"))
put("serve_live", "tree", G("/api/kernels/fuzz/pkg/tree/v1"))
put("serve_live", "range", G("/kernels/fuzz/pkg/resolve/v1/manifest.json", "Range: bytes=10-20\r\n"))
put("serve_live", "etag", G("/kernels/fuzz/pkg/resolve/main/manifest.json.sig", "If-None-Match: \"x\", *\r\n"))
put("serve_live", "page", G("/"))
put("serve_live", "encoded", G("/kernels/fuzz/pkg/resolve/v1/%2e%2e/%00"))
put("serve_live", "upload-unauth", "PUT /api/upload/fuzz/pkg HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd")
yank = json.dumps({"format_version": 1, "type": "yank", "name": "fuzz/pkg", "version": "1.0.0", "reason": "x"})
put("serve_live", "yank", "PUT /api/yank/fuzz/pkg HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer @TOKEN@\r\n"
    "Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(yank), yank))
# a valid upload of fuzz/pkg 1.0.1 signed with the target's committed test key
import tempfile
with tempfile.TemporaryDirectory() as t:
    pk, tree = os.path.join(t, "pkg"), os.path.join(t, "tree")
    os.makedirs(pk)
    spec = {"name": "fuzz/pkg", "version": "1.0.1", "license": "MIT", "description": "fuzz", "kernels": [
        {"name": "k", "op": "fuzz_k", "source": "k.cu", "symbol": "k",
         "params": [{"name": "out", "type": "tensor", "dtype": "f32"}],
         "launch": {"grid": ["numel(out)"], "block": ["32"]}}]}
    open(os.path.join(pk, "kernel.json"), "w").write(json.dumps(spec))
    open(os.path.join(pk, "k.cu"), "w").write('extern "C" __global__ void k(float *out) { out[threadIdx.x] = 1; }\n')
    key = os.path.join(root, "tests/fuzz/serve_live-key.pem")
    tk = lambda *a: subprocess.run([os.path.join(build, "tk")] + list(a) + ["--key", key, "--quiet"], check=True,
                                   env=dict(os.environ, TK_HOME=os.path.join(t, "home")))
    res = os.path.join(tree, "kernels/fuzz/pkg/resolve")
    spec["version"] = "1.0.0"
    open(os.path.join(pk, "kernel.json"), "w").write(json.dumps(spec))
    tk("publish", pk, "--to", tree)
    spec["version"] = "1.0.1"
    open(os.path.join(pk, "kernel.json"), "w").write(json.dumps(spec))
    tk("publish", pk, "--to", tree)
    d = os.path.join(res, os.readlink(os.path.join(res, "v1")))
    up = [(n, open(os.path.join(d, n), "rb").read(), None, None)
          for n in ("manifest.json", "manifest.json.sig", "source.tar.gz")]
    tk("yank", "fuzz/pkg@1.0.0", "--to", tree, "--reason", "fuzz seed")
    ydir = os.path.join(tree, "kernels/fuzz/pkg/yanked")
    signed_yank = json.dumps({"statement": open(os.path.join(ydir, "1.0.0.json")).read(),
                              "signature": open(os.path.join(ydir, "1.0.0.json.sig")).read()})
    # get: a registry's answers for fuzz/pkg (refs, manifest, signature, archive, yank), "@@PART@@\n" apart
    refs = open(os.path.join(tree, "api/kernels/fuzz/pkg/refs"), "rb").read()
    ystmt = open(os.path.join(ydir, "1.0.0.json"), "rb").read()
    SEP = b"@@PART@@\n"
    put("get", "install", SEP.join([refs] + [u[1] for u in up] + [b""]))
    put("get", "yanked-statement", SEP.join([refs] + [u[1] for u in up] + [ystmt]))
    put("get", "bad-signature", SEP.join([refs, up[0][1], up[1][1].replace(b'"sig": "', b'"sig": "00'), up[2][1], b""]))
    put("get", "no-branches", SEP.join([b'{"branches": [], "tags": []}', b"", b"", b"", b""]))
    put("get", "not-found", b"")
put("serve_live", "yank-signed", "PUT /api/yank/fuzz/pkg HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer @TOKEN@\r\n"
    "Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(signed_yank), signed_yank))
body = tar(up).decode("latin-1")
put("serve_live", "upload", ("PUT /api/upload/fuzz/pkg HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer @TOKEN@\r\n"
                             "Content-Type: application/x-tar\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                             % len(body) + body).encode("latin-1"))
put("serve_live", "chunked-upload", "POST /api/upload/fuzz/pkg HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer @TOKEN@\r\n"
    "Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n")
print("seeds written under", corpus)
