"""_tensor.py: a framework's tensor as a tk_tensor, without copying.

torch tensors are described from data_ptr/shape/stride/device/dtype, so a strided view stays a view:
tk's CPU references read and write strided tensors, and for CUDA tensors tk_op_run refuses a
non-contiguous one with a clear error (nothing is copied behind the caller's back). Anything else is
taken through DLPack: obj.__dlpack__() gives a capsule holding a DLManagedTensor, whose first member
is a DLTensor, which is tk_tensor's exact layout.
"""
import ctypes

from . import _lib

try:
    import torch
except ImportError:  # the package works without torch, on DLPack tensors
    torch = None

_TORCH_DTYPES = {}
if torch is not None:
    _TORCH_DTYPES = {
        torch.float32: (2, 32), torch.float16: (2, 16), torch.bfloat16: (4, 16), torch.float64: (2, 64),
        torch.int8: (0, 8), torch.uint8: (1, 8), torch.int32: (0, 32), torch.int64: (0, 64),
    }
    for _name, _code in (("float8_e4m3fn", 10), ("float8_e5m2", 12)):
        if hasattr(torch, _name):
            _TORCH_DTYPES[getattr(torch, _name)] = (_code, 8)


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def via_torch_op(*xs):
    """1 when the call should go through torch.ops.tk: every tensor argument given is a torch tensor
    (None: an optional one left out) and torch is tracing (torch.compile, export) or a tensor has no
    memory (meta). Eager calls on real tensors go straight to tk_op_run: the custom op's Python
    dispatch would cost more than the op on small tensors, and does nothing more in eager mode."""
    if torch is None:
        return False
    meta = False
    for x in xs:
        if x is None:
            continue
        if not isinstance(x, torch.Tensor):
            return False
        meta = meta or x.device.type == "meta"
    return meta or torch.compiler.is_compiling()


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_is_valid.restype = ctypes.c_int
_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


class Described:
    """A tk_tensor for one argument, and whatever must stay alive while tk reads it."""
    __slots__ = ("t", "keep", "device")

    def __init__(self, t, keep, device):
        self.t = t          # ctypes Tensor (or a pointer to one, for DLPack)
        self.keep = keep    # shape/stride arrays, the DLPack capsule
        self.device = device  # (device_type, device_id)

    def pointer(self):
        return ctypes.pointer(self.t) if isinstance(self.t, _lib.Tensor) else self.t


def describe(x, name):
    """The tk_tensor of x (a torch tensor, or any object with __dlpack__)."""
    if is_torch(x):
        return _describe_torch(x, name)
    if hasattr(x, "__dlpack__"):
        return _describe_dlpack(x, name)
    raise _lib.InvalidArgumentError(
        _lib.TK_ERR_INVALID,
        "'%s' is a %s, not a tensor\nHINT: pass a torch tensor, or an array that supports DLPack "
        "(numpy, cupy, jax)" % (name, type(x).__name__))


def _describe_torch(x, name):
    dt = _TORCH_DTYPES.get(x.dtype)
    if dt is None:
        raise _lib.InvalidArgumentError(
            _lib.TK_ERR_INVALID, "'%s' has dtype %s, which tk has no name for\nHINT: tk's dtypes are f32, f16, "
            "bf16, f64, i8, u8, i32, i64, fp8_e4m3, fp8_e5m2" % (name, x.dtype))
    if x.is_cuda:
        dev = (_lib.TK_DEV_CUDA, x.device.index if x.device.index is not None else torch.cuda.current_device())
    elif x.device.type == "cpu":
        dev = (_lib.TK_DEV_CPU, 0)
    else:
        raise _lib.UnsupportedError(
            _lib.TK_ERR_UNSUPPORTED, "'%s' is on %s; tk runs ops on cpu and cuda tensors\nHINT: move it with "
            ".to('cpu') or .to('cuda')" % (name, x.device))
    nd = x.dim()
    dims = _DIMS[nd](*x.shape, *x.stride()) if nd else _DIMS[1]()  # shape, then strides: one allocation
    t = _lib.Tensor(x.data_ptr() or None, _lib.Device(*dev), nd, _lib.Dtype(dt[0], dt[1], 1), dims,
                    ctypes.cast(ctypes.addressof(dims) + 8 * nd, _I64P) if nd else None, 0)
    return Described(t, dims, dev)


_I64P = ctypes.POINTER(ctypes.c_int64)
_DIMS = [ctypes.c_int64 * (2 * n) for n in range(17)]
_DIMS[0] = _DIMS[1]


def _describe_dlpack(x, name):
    try:
        cap = x.__dlpack__()
    except Exception as e:  # read-only numpy arrays, unsupported devices...
        raise _lib.InvalidArgumentError(
            _lib.TK_ERR_INVALID, "'%s': %s.__dlpack__() failed: %s" % (name, type(x).__name__, e)) from None
    if not _is_valid(cap, b"dltensor"):
        raise _lib.InvalidArgumentError(
            _lib.TK_ERR_INVALID, "'%s': %s.__dlpack__() did not return an unused 'dltensor' capsule"
            % (name, type(x).__name__))
    # The capsule keeps ownership: its destructor calls the producer's deleter when it is collected.
    ptr = _get_pointer(cap, b"dltensor")
    t = ctypes.cast(ptr, ctypes.POINTER(_lib.Tensor))
    dev = (t.contents.device.device_type, t.contents.device.device_id)
    return Described(t, cap, dev)


def cuda_stream(device_id):
    """torch's current stream on a CUDA device, as the CUstream tk launches on (None: legacy default)."""
    if torch is None:
        return None
    return torch.cuda.current_stream(device_id).cuda_stream or None
