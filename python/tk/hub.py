"""hub.py: get_kernel, has_kernel, list_installed and lock files, over tk_pkg_get and friends.

get_kernel resolves, downloads, verifies (Ed25519 signature, digests) and installs a package exactly as
`tk get` does, and returns a module-like object whose functions are the package's ops (see ops.py).
An op runs through tk's dispatch: on CUDA tensors the best installed kernel for the call (this
package's, unless another installed one ranks higher or the config's "ops" override says otherwise),
on host tensors tk's CPU reference.
"""
import ctypes
import json
import re
import types

from . import _lib, ops

__all__ = ["get_kernel", "has_kernel", "list_installed", "lock", "install_locked", "KernelModule"]


def _ref(repo_id, version=None, revision=None):
    if not isinstance(repo_id, str) or "@" in repo_id:
        raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "repo_id must be 'org/name', got %r\nHINT: give the "
                                        "version with version=2 or revision='<40-hex commit>'" % (repo_id,))
    if version is not None and revision is not None:
        raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: give version or revision, not both" % repo_id)
    if version is not None:
        v = str(version)
        if not re.fullmatch(r"v?[0-9]+", v):
            raise _lib.InvalidArgumentError(
                _lib.TK_ERR_INVALID, "%s: version %r is not a major version\nHINT: tk's versions are integer majors "
                "(version=1), as the Hub's kernels use them" % (repo_id, version))
        return "%s@%s" % (repo_id, v)
    if revision is not None:
        return "%s@%s" % (repo_id, revision)
    return repo_id


class KernelModule(types.ModuleType):
    """A package's ops as functions (`activation.gelu_fast(out, x)`), plus its metadata: `name`,
    `version`, `major`, `commit`, `manifest_sha256`, `signer`, `ops` (the op names it implements) and
    `info` (what `tk info --json` prints)."""

    def __init__(self, info, manifest):
        super().__init__(info["name"].replace("/", "."), info.get("description"))
        self.info = info
        self.name = info["name"]
        self.version = self.__version__ = info.get("version")
        self.major = info.get("major")
        self.commit = info.get("commit")
        self.manifest_sha256 = info.get("manifest_sha256")
        self.signer = info.get("signer")
        known = set(ops.names())
        wanted = []
        for k in manifest.get("kernels", []):
            op = k.get("op")
            if op and op not in wanted:
                wanted.append(op)
        self.ops = [o for o in wanted if o in known]
        # ops the package defines that tk has no standard signature for: `tk run` / tk_function_call
        self.other_ops = [o for o in wanted if o not in known]
        for o in self.ops:
            setattr(self, o, ops.function(o))

    def __repr__(self):
        return "<tk kernel %s %s (%s) ops: %s>" % (self.name, self.version, (self.commit or "")[:12],
                                                  ", ".join(self.ops))


def _pkg_json(pkg):
    p = ctypes.c_void_p()
    _lib.check(_lib.tk_pkg_to_json(ctypes.byref(p), pkg))
    return json.loads(_lib.take_string(p))


def get_kernel(repo_id, version=None, revision=None, *, trust=False, force=False, context=None):
    """Installs `repo_id` (as `tk get`) and returns its ops as a module-like object.

    version: an integer major (branch v<N>); revision: a 40-hex commit (or "v2"); neither: the highest
    major. trust=True accepts and remembers an unknown signer (as `tk get --trust`). Raises TkError
    subclasses with tk's message and hint: NotFoundError, UntrustedError, InvalidArgumentError..."""
    ctx = context or _lib.current_context()
    ref = _ref(repo_id, version, revision)
    opts = _lib.GetOpts(1, int(bool(trust)), int(bool(force)), None)
    pkg = ctypes.c_void_p()
    _lib.check(_lib.tk_pkg_get(ctypes.byref(pkg), ctx.handle, ref.encode(), ctypes.byref(opts)))
    try:
        info = _pkg_json(pkg)
        manifest = json.loads(_lib.tk_pkg_manifest(pkg).decode())
    finally:
        _lib.tk_pkg_free(pkg)
    return KernelModule(info, manifest)


def has_kernel(repo_id, version=None, revision=None, *, context=None):
    """True when the registry has the package (and version) and it installs and verifies; False when it
    is not found. tk compiles for the GPU at hand, so there is no build matrix to miss: unlike the
    Hub's loader, any package that exists fits. Other failures (network, untrusted signer) raise."""
    try:
        get_kernel(repo_id, version, revision, context=context)
        return True
    except _lib.NotFoundError:
        return False


def list_installed(*, context=None):
    """The installed packages, as `tk list --json` prints them."""
    ctx = context or _lib.current_context()
    lst = ctypes.c_void_p()
    _lib.check(_lib.tk_pkg_list_installed(ctypes.byref(lst), ctx.handle))
    try:
        return [_pkg_json(_lib.tk_pkg_list_at(lst, i)) for i in range(_lib.tk_pkg_list_count(lst))]
    finally:
        _lib.tk_pkg_list_free(lst)


def lock(path="tk.lock", repo_ids=None, *, context=None):
    """Writes a lock file pinning the installed commit and manifest digest of each ref (default: every
    installed package), as `tk lock`."""
    ctx = context or _lib.current_context()
    refs = list(repo_ids) if repo_ids is not None else [p["name"] + "@" + str(p["major"]) for p in
                                                          list_installed(context=ctx)]
    arr = (ctypes.c_char_p * max(len(refs), 1))(*[r.encode() for r in refs])
    _lib.check(_lib.tk_lock_write(ctx.handle, path.encode(), arr, len(refs)))
    return path


def install_locked(path="tk.lock", *, trust=False, context=None):
    """Installs exactly what the lock file pins (as `tk get --locked`): each commit, whose manifest must
    have the pinned digest. Returns the installed packages' names."""
    ctx = context or _lib.current_context()
    opts = _lib.GetOpts(1, int(bool(trust)), 0, None)
    got = []
    each_t = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
    each = each_t(lambda user, pkg: got.append(_pkg_json(pkg)["name"]))
    _lib.check(_lib.tk_lock_install(ctx.handle, path.encode(), ctypes.byref(opts),
                                    ctypes.cast(each, ctypes.c_void_p), None))
    return got
