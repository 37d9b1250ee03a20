"""The Hugging Face Hub's own client (huggingface_hub, from PyPI) against a tk registry.

Usage: hf_client.py ENDPOINT CACHE_DIR REPO_ID FILE EXPECT_SHA256 EXPECT_V1_COMMIT
Downloads FILE at revision v1 with hf_hub_download(repo_type="kernel"), checks its sha256, lists the
refs with HfApi().list_repo_refs, and checks that missing repos, revisions and files raise the
client's own typed errors (which it derives from the server's X-Error-Code). Prints one line per check;
exits 1 on the first failure.
"""
import hashlib
import sys

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

endpoint, cache, repo, filename, want_sha, want_commit = sys.argv[1:7]


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        sys.exit(1)


path = hf_hub_download(repo_id=repo, filename=filename, repo_type="kernel", revision="v1",
                       endpoint=endpoint, cache_dir=cache)
with open(path, "rb") as f:
    got = hashlib.sha256(f.read()).hexdigest()
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
