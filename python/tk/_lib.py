"""_lib.py: libtk.so through ctypes, over the stable C ABI of include/tk.h.

Finds the library (TK_LIBRARY, then a copy bundled in the wheel, then the checkout's build/, then the
system loader), declares the structs with tk.h's exact layout (tk_tensor is DLPack's DLTensor), turns
a failed call's status and tk_last_error() into a Python exception, and owns the contexts: one per
thread by default, since a tk_ctx may be used from one thread at a time (tk.h "Threads").

Nothing here imports torch: the ops run on anything that can describe its memory (see _tensor.py).
"""
import ctypes
import ctypes.util
import json
import logging
import os
import threading

__all__ = ["TkError", "Context", "library_path", "lib", "check", "current_context"]

log = logging.getLogger("tk")

# ---- finding the library ----------------------------------------------------------------------

_HERE = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    env = os.environ.get("TK_LIBRARY")
    if env:
        yield env, "TK_LIBRARY"
        return
    yield os.path.join(_HERE, "_lib", "libtk.so.0"), "bundled with the package"
    # python/tk/_lib.py in a checkout: the library is <repo>/build/libtk.so.0 (or $TK_BUILD)
    repo = os.path.dirname(os.path.dirname(_HERE))
    build = os.environ.get("TK_BUILD", "build")
    yield os.path.join(repo, build, "libtk.so.0"), "the checkout's build"
    found = ctypes.util.find_library("tk")
    yield (found or "libtk.so.0"), "the system's library path"


def _load():
    tried = []
    for path, why in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append("%s (%s: missing)" % (path, why))
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s: %s)" % (path, why, e))
    raise ImportError(
        "tk: cannot load libtk.so.0; tried:\n  " + "\n  ".join(tried) +
        "\nHINT: build it with 'make lib' in the tk checkout, or set TK_LIBRARY=/path/to/libtk.so.0")


lib, library_path = _load()

# ---- tk.h's structs ---------------------------------------------------------------------------


class Dtype(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class Tensor(ctypes.Structure):
    """tk_tensor: DLPack's DLTensor layout (dlpack.h v1.x)."""
    _fields_ = [("data", ctypes.c_void_p), ("device", Device), ("ndim", ctypes.c_int32), ("dtype", Dtype),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class Arg(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("name", ctypes.c_char_p), ("t", ctypes.POINTER(Tensor)),
                ("i", ctypes.c_int64), ("f", ctypes.c_double)]


LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p)
PROGRESS_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64)


class CtxOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("home", ctypes.c_char_p), ("endpoint", ctypes.c_char_p),
                ("token", ctypes.c_char_p), ("offline", ctypes.c_int), ("log", LOG_FN),
                ("log_user", ctypes.c_void_p), ("progress", PROGRESS_FN), ("progress_user", ctypes.c_void_p)]


class GetOpts(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("trust_unknown", ctypes.c_int), ("force", ctypes.c_int),
                ("expect_manifest", ctypes.c_char_p)]


class GetOpts2(ctypes.Structure):
    """tk_get_opts at version 2: the layout a struct that embeds it (tk_selftest_opts) has."""
    _fields_ = GetOpts._fields_ + [("registry", ctypes.c_char_p), ("expect_signer", ctypes.c_char_p)]


class SelftestOpts(ctypes.Structure):
    """tk_selftest_opts (version 1)."""
    _fields_ = [("version", ctypes.c_uint), ("device", ctypes.c_int), ("op", ctypes.c_char_p),
                ("kernel", ctypes.c_char_p), ("launch_timeout_s", ctypes.c_double), ("get", GetOpts2),
                ("plan_only", ctypes.c_int), ("arch", ctypes.c_char_p)]


TK_DEV_CPU, TK_DEV_CUDA = 1, 2
TK_ARG_TENSOR, TK_ARG_I64, TK_ARG_F64 = 0, 1, 2

_P = ctypes.c_void_p
_S = ctypes.c_char_p


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


tk_version_string = _fn("tk_version_string", _S)
tk_status_str = _fn("tk_status_str", _S, ctypes.c_int)
tk_last_error = _fn("tk_last_error", _S)
tk_free = _fn("tk_free", None, _P)
tk_ctx_new = _fn("tk_ctx_new", ctypes.c_int, ctypes.POINTER(_P), ctypes.POINTER(CtxOpts))
tk_ctx_free = _fn("tk_ctx_free", None, _P)
tk_ctx_home = _fn("tk_ctx_home", _S, _P)
tk_ctx_endpoint = _fn("tk_ctx_endpoint", _S, _P)
tk_pkg_get = _fn("tk_pkg_get", ctypes.c_int, ctypes.POINTER(_P), _P, _S, ctypes.POINTER(GetOpts))
tk_pkg_info = _fn("tk_pkg_info", ctypes.c_int, ctypes.POINTER(_P), _P, _S)
tk_pkg_free = _fn("tk_pkg_free", None, _P)
tk_pkg_to_json = _fn("tk_pkg_to_json", ctypes.c_int, ctypes.POINTER(_P), _P)
tk_pkg_manifest = _fn("tk_pkg_manifest", _S, _P)
tk_pkg_list_installed = _fn("tk_pkg_list_installed", ctypes.c_int, ctypes.POINTER(_P), _P)
tk_pkg_list_count = _fn("tk_pkg_list_count", ctypes.c_size_t, _P)
tk_pkg_list_at = _fn("tk_pkg_list_at", _P, _P, ctypes.c_size_t)
tk_pkg_list_free = _fn("tk_pkg_list_free", None, _P)
tk_pkg_versions = _fn("tk_pkg_versions", ctypes.c_int, ctypes.POINTER(_P), _P, _S)
tk_version_list_count = _fn("tk_version_list_count", ctypes.c_size_t, _P)
tk_version_list_commit = _fn("tk_version_list_commit", _S, _P, ctypes.c_size_t)
tk_version_list_yanked = _fn("tk_version_list_yanked", ctypes.c_int, _P, ctypes.c_size_t)
tk_version_list_latest = _fn("tk_version_list_latest", _S, _P, ctypes.c_int)
tk_version_list_free = _fn("tk_version_list_free", None, _P)
tk_lock_write = _fn("tk_lock_write", ctypes.c_int, _P, _S, ctypes.POINTER(_S), ctypes.c_size_t)
tk_lock_install = _fn("tk_lock_install", ctypes.c_int, _P, _S, ctypes.POINTER(GetOpts), _P, _P)
tk_op_run = _fn("tk_op_run", ctypes.c_int, _P, _S, ctypes.POINTER(Arg), ctypes.c_size_t, _P, ctypes.POINTER(_S))
tk_ops_json = _fn("tk_ops_json", ctypes.c_int, ctypes.POINTER(_P), _P)
tk_device_count = _fn("tk_device_count", ctypes.c_int, ctypes.POINTER(ctypes.c_int))
tk_selftest = _fn("tk_selftest", ctypes.c_int, ctypes.POINTER(_P), _P, _S, ctypes.POINTER(SelftestOpts))
tk_selftest_results_json = _fn("tk_selftest_results_json", ctypes.c_int, ctypes.POINTER(_P), _P, _S, ctypes.c_int)
tk_selftest_records_json = _fn("tk_selftest_records_json", ctypes.c_int, ctypes.POINTER(_P), _P, _S)
tk_selftest_forget = _fn("tk_selftest_forget", ctypes.c_int, _P, _S, ctypes.POINTER(ctypes.c_int64))

# ---- errors -----------------------------------------------------------------------------------

TK_ERR_INVALID, TK_ERR_NOT_FOUND, TK_ERR_UNTRUSTED, TK_ERR_NO_DEVICE, TK_ERR_UNSUPPORTED = -1, -2, -5, -15, -19
TK_ERR_SELFTEST = -23


class TkError(Exception):
    """A failed tk call: `status` (negative TK_ERR_* code), `status_name` ("not found"), `message` (tk's
    text without the hint) and `hint` (the text after "HINT:", or None)."""

    def __init__(self, status, text):
        self.status = status
        self.status_name = tk_status_str(status).decode()
        head, sep, hint = text.partition("\nHINT: ")
        self.message = head
        self.hint = hint if sep else None
        super().__init__(text)

    def __str__(self):
        s = "%s (%s)" % (self.message, self.status_name)
        return s + ("\nHINT: " + self.hint if self.hint else "")


class InvalidArgumentError(TkError, ValueError):
    """TK_ERR_INVALID: a bad argument, shape, dtype or reference."""


class NotFoundError(TkError, LookupError):
    """TK_ERR_NOT_FOUND: no such package, version or op."""


class UntrustedError(TkError):
    """TK_ERR_UNTRUSTED: the signature is valid but its signer is not trusted for the org."""


class NoDeviceError(TkError, RuntimeError):
    """TK_ERR_NO_DEVICE: no CUDA driver or GPU."""


class UnsupportedError(TkError, RuntimeError):
    """TK_ERR_UNSUPPORTED: a valid request this build, device or package cannot serve."""


class SelftestError(TkError, RuntimeError):
    """TK_ERR_SELFTEST: a kernel failed its self-test on this GPU (tk.selftest, get_kernel(selftest=True));
    `report` holds the self-test's report (a dict) when there is one."""
    report = None


_CLASSES = {TK_ERR_INVALID: InvalidArgumentError, TK_ERR_NOT_FOUND: NotFoundError,
            TK_ERR_UNTRUSTED: UntrustedError, TK_ERR_NO_DEVICE: NoDeviceError,
            TK_ERR_UNSUPPORTED: UnsupportedError, TK_ERR_SELFTEST: SelftestError}


def error(status, text=None):
    """The exception for a status; text defaults to tk_last_error() (read it right after the call)."""
    if text is None:
        text = tk_last_error().decode("utf-8", "replace")
    return _CLASSES.get(status, TkError)(status, text)


def check(rc):
    if rc != 0:
        raise error(rc)


def take_string(p):
    """A char * the caller owns (tk_free), as str."""
    try:
        return ctypes.string_at(p).decode("utf-8")
    finally:
        tk_free(p)


# ---- contexts ---------------------------------------------------------------------------------

_LEVELS = {0: logging.DEBUG, 1: logging.INFO, 2: logging.WARNING}


@LOG_FN
def _log_cb(user, level, msg):
    log.log(_LEVELS.get(level, logging.INFO), "%s", msg.decode("utf-8", "replace"))


class Context:
    """A tk_ctx: the state under a home directory and the registry to use. Arguments left None take
    tk's own defaults: $TK_HOME (else the XDG directories), $TK_ENDPOINT (else config.json, else the
    build's default registry), $TK_TOKEN, $TK_OFFLINE. Use a context from one thread at a time; the
    module-level functions use one context per thread (current_context())."""

    def __init__(self, home=None, endpoint=None, token=None, offline=None):
        self._keep = [home, endpoint, token]
        opts = CtxOpts(1, _b(home), _b(endpoint), _b(token), -1 if offline is None else int(bool(offline)),
                       _log_cb, None, PROGRESS_FN(), None)
        h = _P()
        check(tk_ctx_new(ctypes.byref(h), ctypes.byref(opts)))
        self._h = h
        self._ops = None

    @property
    def handle(self):
        if not self._h:
            raise ValueError("tk: this Context is closed")
        return self._h

    @property
    def home(self):
        return tk_ctx_home(self.handle).decode()

    @property
    def endpoint(self):
        return tk_ctx_endpoint(self.handle).decode()

    def ops_json(self):
        """Every op tk knows with its signature (tk_ops_json), as a list of dicts."""
        p = _P()
        check(tk_ops_json(ctypes.byref(p), self.handle))
        return json.loads(take_string(p))

    def close(self):
        if getattr(self, "_h", None):
            tk_ctx_free(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _b(s):
    return None if s is None else os.fsencode(s)


_local = threading.local()


def current_context():
    """This thread's default Context (created on first use from the environment)."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        ctx = _local.ctx = Context()
    return ctx


def version():
    return tk_version_string().decode()


def device_count():
    """Number of CUDA devices tk sees; 0 when there is no driver or no GPU."""
    n = ctypes.c_int(0)
    return n.value if tk_device_count(ctypes.byref(n)) == 0 else 0


def reset_current_context():
    """Drops this thread's default Context, so the next call makes a new one from the environment (a
    changed TK_HOME, for instance)."""
    ctx = getattr(_local, "ctx", None)
    _local.ctx = None
    if ctx is not None:
        ctx.close()
