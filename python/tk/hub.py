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

__all__ = ["get_kernel", "has_kernel", "list_installed", "lock", "install_locked", "KernelModule", "selftest",
           "selftest_results", "selftest_records"]


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
    `version`, `major`, `commit`, `manifest_sha256`, `signer`, `ops` (the op names it implements),
    `info` (what `tk info --json` prints) and `layers` (torch modules, see _layers)."""

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
        if any(o not in known for o in wanted):  # ops this package declares: read the list again
            known = set(ops._load(refresh=True))
        self.ops = [o for o in wanted if o in known]
        # ops the package defines that tk has no standard signature for: `tk run` / tk_function_call
        self.other_ops = [o for o in wanted if o not in known]
        for o in self.ops:
            setattr(self, o, ops.function(o))
        self.layers = _layers(self.ops)

    def __repr__(self):
        return "<tk kernel %s %s (%s) ops: %s>" % (self.name, self.version, (self.commit or "")[:12],
                                                  ", ".join(self.ops))


# Hugging Face kernels' layer names for ops whose tk name CamelCases differently
_HF_LAYER_NAMES = {"gelu_fast": "FastGELU", "gelu_new": "NewGELU", "gelu_quick": "QuickGELU"}


def _layers(op_names):
    """torch.nn.Module classes for the package's elementwise ops, as Hugging Face kernels' `layers`
    (activation.layers.SiluAndMul()(x)): out-of-place forwards over ops whose signature is
    (out, input, scalars...) with out shaped like input or like its first half ("[..., 2*d]").
    Scalars become constructor arguments with the op's defaults. Empty without torch."""
    ns = types.SimpleNamespace()
    try:
        import torch
    except ImportError:
        return ns
    for name in op_names:
        spec = ops._spec(name)
        ps = spec.params
        if (len(ps) < 2 or ps[0].kind != "tensor" or not ps[0].out or ps[1].kind != "tensor" or ps[1].out
                or any(p.kind == "tensor" for p in ps[2:])):
            continue
        if ps[0].shape == ps[1].shape:
            half = False
        elif ps[1].shape.endswith("2*d]") and ps[0].shape.endswith("d]"):
            half = True
        else:
            continue
        cls = _HF_LAYER_NAMES.get(name) or "".join(w.capitalize() for w in name.split("_"))
        ns.__dict__[cls] = _layer_class(torch, cls, spec, ops.function(name), half)
    return ns


def _layer_class(torch, cls, spec, fn, half):
    scalars = spec.params[2:]

    def __init__(self, *args, **kwargs):
        torch.nn.Module.__init__(self)
        vals = [p.default for p in scalars]
        for i, a in enumerate(args):
            vals[i] = a
        for k, v in kwargs.items():
            vals[[p.name for p in scalars].index(k)] = v
        self.scalars = vals

    def forward(self, x):
        shape = (*x.shape[:-1], x.shape[-1] // 2) if half else x.shape
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
        fn(out, x, *self.scalars)
        return out

    doc = "%s as a module: forward(x) returns a new tensor.\n\n%s" % (spec.name, spec.summary)
    return type(cls, (torch.nn.Module,), {"__init__": __init__, "forward": forward, "__doc__": doc})


def _pkg_json(pkg):
    p = ctypes.c_void_p()
    _lib.check(_lib.tk_pkg_to_json(ctypes.byref(p), pkg))
    return json.loads(_lib.take_string(p))


def get_kernel(repo_id, version=None, revision=None, *, trust=False, force=False, selftest=False, device=0,
               context=None):
    """Installs `repo_id` (as `tk get`) and returns its ops as a module-like object.

    version: an integer major (branch v<N>); revision: a 40-hex commit (or "v2"); neither: the highest
    major. trust=True accepts and remembers an unknown signer (as `tk get --trust`). selftest=True then
    proves every kernel of the package on GPU `device` against tk's CPU references (tk.selftest) and
    raises SelftestError (its .report says which kernel, the worst element, expected and got) when one
    failed, crashed or timed out; NoDeviceError without a GPU. The module's `selftest` attribute holds
    the report (None without selftest=True). Raises TkError subclasses with tk's message and hint:
    NotFoundError, UntrustedError, InvalidArgumentError..."""
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
    report = None
    if selftest:
        report = _selftest(ctx, "%s@%s" % (info["name"], info["commit"]), device, None, None, None, True)
    module = KernelModule(info, manifest)
    module.selftest = report
    return module


def _selftest(ctx, ref, device, op, kernel, timeout, raise_on_failure):
    if not isinstance(device, int) or isinstance(device, bool) or device < 0:
        raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "device must be a CUDA ordinal (0, 1, ...), got %r" % (device,))
    o = _lib.SelftestOpts()
    o.version = 1
    o.device = device
    o.op = op.encode() if op else None
    o.kernel = kernel.encode() if kernel else None
    o.launch_timeout_s = float(timeout or 0)
    o.get.version = 2
    out = ctypes.c_void_p()
    rc = _lib.tk_selftest(ctypes.byref(out), ctx.handle, ref.encode(), ctypes.byref(o))
    text = _lib.tk_last_error().decode("utf-8", "replace") if rc else None
    report = json.loads(_lib.take_string(out)) if out.value else None
    if rc == _lib.TK_ERR_SELFTEST and not raise_on_failure:
        return report
    if rc:
        e = _lib.error(rc, text)
        e.report = report
        raise e
    return report


def selftest(repo_id, version=None, revision=None, *, device=0, op=None, kernel=None, timeout=None, context=None):
    """Proves the kernels of `repo_id` (installed first if needed; or a package directory, "./dir") on GPU
    `device` against tk's CPU references, records the results (tk_op_run then never uses a kernel that
    failed on this GPU) and returns the report as a dict, as `tk selftest --json` prints it: "kernels"
    (each with "status": passed, failed, crashed, timed_out, untested or skipped, and "detail"), "counts",
    "ok" (False when one failed), "device". op / kernel narrow it to one op or kernel; timeout is the
    limit of one launch in seconds (default 5). Raises NoDeviceError without a GPU, NotFoundError for an
    unknown package. See docs/selftest.md."""
    ctx = context or _lib.current_context()
    local = isinstance(repo_id, str) and (repo_id.startswith(("./", "../", "/")) or repo_id == ".")
    ref = repo_id if local else _ref(repo_id, version, revision)
    return _selftest(ctx, ref, device, op, kernel, timeout, False)


def selftest_results(repo_id=None, *, device=0, context=None):
    """What is recorded for the installed packages (or `repo_id`) on GPU `device`, running nothing: each
    kernel's result for its current binary on this GPU, driver and tk, or "never_tested" (as
    `tk selftest --results --json`). Raises NoDeviceError without a GPU."""
    ctx = context or _lib.current_context()
    out = ctypes.c_void_p()
    _lib.check(_lib.tk_selftest_results_json(ctypes.byref(out), ctx.handle,
                                             repo_id.encode() if repo_id else None, int(device)))
    return json.loads(_lib.take_string(out))


def selftest_records(repo_id=None, *, context=None):
    """Every self-test result recorded for any GPU (no GPU needed), newest first per kernel: a list of
    dicts with "package", "kernel", "status", "gpu_name", "gpu_uuid", "driver", "tk_version", "detail"."""
    ctx = context or _lib.current_context()
    out = ctypes.c_void_p()
    _lib.check(_lib.tk_selftest_records_json(ctypes.byref(out), ctx.handle, repo_id.encode() if repo_id else None))
    return json.loads(_lib.take_string(out))


def has_kernel(repo_id, version=None, revision=None, *, context=None):
    """True when the registry has the package with a version that is not yanked (of major `version`, or
    the commit `revision`), False when it does not. Nothing is downloaded beyond the registry's version
    list and signed manifests, and nothing is installed. tk compiles for the GPU at hand, so there is no
    build matrix to miss: unlike the Hub's loader, any package that exists fits. Other failures
    (network, a bad signature) raise."""
    ref = _ref(repo_id, version, revision)
    ctx = context or _lib.current_context()
    lst = ctypes.c_void_p()
    try:
        _lib.check(_lib.tk_pkg_versions(ctypes.byref(lst), ctx.handle, repo_id.encode()))
    except _lib.NotFoundError:
        return False
    try:
        n = _lib.tk_version_list_count(lst)
        if revision is not None and re.fullmatch(r"[0-9a-f]{40}", str(revision)):
            return any(_lib.tk_version_list_commit(lst, i).decode() == revision for i in range(n))
        if revision is not None:  # a branch: v<major>, or main (the newest major)
            m = re.fullmatch(r"v([0-9]+)", str(revision))
            if not m and revision != "main":
                raise _lib.InvalidArgumentError(_lib.TK_ERR_INVALID, "%s: revision %r is neither a 40-hex commit "
                                                "nor a branch (v1, v2, ..., main)" % (ref, revision))
            return _lib.tk_version_list_latest(lst, int(m.group(1)) if m else 0) is not None
        major = int(str(version).lstrip("v")) if version is not None else 0
        return _lib.tk_version_list_latest(lst, major) is not None
    finally:
        _lib.tk_version_list_free(lst)


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
