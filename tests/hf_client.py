"""The Hugging Face Hub's own client (huggingface_hub, from PyPI) against a tk registry.

Usage: hf_client.py ENDPOINT CACHE_DIR REPO_ID FILE EXPECT_SHA256 EXPECT_V1_COMMIT
Downloads FILE at revision v1 with hf_hub_download(repo_type="kernel"), checks its sha256, lists the
refs with HfApi().list_repo_refs, and checks that missing repos, revisions and files raise the
client's own typed errors (which it derives from the server's X-Error-Code). Prints one line per check;
exits 1 on the first failure.

Usage: hf_client.py --report ENDPOINT CACHE_DIR REPO_ID REV...
Prints, as one JSON document, what the client reads of each revision REV (a branch or a commit):
repo_info's sha, list_repo_files, list_repo_tree (flat and recursive), snapshot_download (the commit
of the snapshot and the sha256 of each file), hf_hub_download of each file (its sha256 and the
metadata of the HEAD: X-Repo-Commit, ETag, size), list_repo_refs, and the error class of a missing
repo, revision and file. Two servers of the same tree must print the same document
(tests/cli/static_hub.sh compares nginx with tk serve); every call that fails is recorded as
{"error": CLASS}, so a difference shows which call differs.
"""
import hashlib
import json
import os
import sys

from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def call(f):
    try:
        return f()
    except Exception as e:  # recorded, so the two servers' answers can be compared call by call
        return {"error": type(e).__name__}


def report(endpoint, cache, repo, revs):
    api = HfApi(endpoint=endpoint)
    kw = dict(repo_type="kernel")
    out = {"revisions": {}}
    for n, rev in enumerate(revs):
        r = {}
        r["repo_info.sha"] = call(lambda: api.repo_info(repo, revision=rev, **kw).sha)
        r["list_repo_files"] = call(lambda: api.list_repo_files(repo, revision=rev, **kw))
        for rec in (False, True):
            r[f"list_repo_tree(recursive={rec})"] = call(lambda: [
                {"type": type(e).__name__, "path": e.path, "size": getattr(e, "size", None),
                 "blob_id": getattr(e, "blob_id", None)}
                for e in api.list_repo_tree(repo, revision=rev, recursive=rec, **kw)])

        def snap():
            d = snapshot_download(repo, revision=rev, endpoint=endpoint, cache_dir=f"{cache}/snap{n}", **kw)
            return {"commit": os.path.basename(d), "files": {f: sha256(os.path.join(d, f)) for f in sorted(os.listdir(d))}}
        r["snapshot_download"] = call(snap)
        files = r["list_repo_files"] if isinstance(r["list_repo_files"], list) else []
        for f in files:
            def meta():
                m = get_hf_file_metadata(hf_hub_url(repo, f, revision=rev, endpoint=endpoint, **kw))
                return {"commit_hash": m.commit_hash, "etag": m.etag, "size": m.size}
            r[f"get_hf_file_metadata {f}"] = call(meta)

            def dl():
                p = hf_hub_download(repo, f, revision=rev, endpoint=endpoint, cache_dir=f"{cache}/dl{n}", **kw)
                return {"sha256": sha256(p), "snapshot": os.path.basename(os.path.dirname(p))}
            r[f"hf_hub_download {f}"] = call(dl)
        out["revisions"][rev] = r
    out["list_repo_refs"] = call(lambda: sorted((b.name, b.target_commit) for b in api.list_repo_refs(repo, **kw).branches))
    rev0 = revs[0]
    out["missing repo"] = call(lambda: hf_hub_download(repo + "-nope", "manifest.json", revision=rev0,
                                                       endpoint=endpoint, cache_dir=f"{cache}/err", **kw))
    out["missing revision"] = call(lambda: hf_hub_download(repo, "manifest.json", revision="v999",
                                                           endpoint=endpoint, cache_dir=f"{cache}/err", **kw))
    out["missing file"] = call(lambda: hf_hub_download(repo, "no-such-file.txt", revision=rev0,
                                                       endpoint=endpoint, cache_dir=f"{cache}/err", **kw))
    out["missing tree path"] = call(lambda: list(api.list_repo_tree(repo, "no-such-dir", revision=rev0, **kw)))
    print(json.dumps(out, indent=1, sort_keys=True))


if len(sys.argv) > 1 and sys.argv[1] == "--report":
    report(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
    sys.exit(0)

endpoint, cache, repo, filename, want_sha, want_commit = sys.argv[1:7]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


path = hf_hub_download(repo_id=repo, filename=filename, repo_type="kernel", revision="v1",
                       endpoint=endpoint, cache_dir=cache)
got = sha256(path)
check(got == want_sha, f"hf_hub_download {repo} {filename} @v1: sha256 {got}")
check(want_commit in path, f"the snapshot path names the commit {want_commit}")

refs = HfApi(endpoint=endpoint).list_repo_refs(repo, repo_type="kernel")
branches = {b.name: b.target_commit for b in refs.branches}
check(branches.get("v1") == want_commit, f"list_repo_refs: v1 -> {branches.get('v1')}")
check("main" in branches, "list_repo_refs: main present")

info = HfApi(endpoint=endpoint).repo_info(repo, repo_type="kernel", revision="v1")
check(info.sha == want_commit, f"repo_info(revision='v1').sha = {info.sha}")

for exc, kwargs, what in [
    (RepositoryNotFoundError, dict(repo_id=repo + "-nope", filename=filename, revision="v1"), "missing repo"),
    (RevisionNotFoundError, dict(repo_id=repo, filename=filename, revision="v99"), "missing revision"),
    (EntryNotFoundError, dict(repo_id=repo, filename="no-such-file.txt", revision="v1"), "missing file"),
]:
    try:
        hf_hub_download(repo_type="kernel", endpoint=endpoint, cache_dir=cache, **kwargs)
        check(False, f"{what}: no error raised")
    except exc:
        check(True, f"{what}: {exc.__name__}")
    except Exception as e:  # a different error class means the protocol differs from the Hub's
        check(False, f"{what}: raised {type(e).__name__}: {e}")
