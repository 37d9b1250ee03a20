"""tk: kernel hub packages for Python, over libtk.so (ctypes; no compiled extension, no torch coupling).

    from tk import get_kernel
    activation = get_kernel("kernels-community/activation")
    activation.gelu_fast(y, x)          # torch tensors on the CPU or CUDA, or any DLPack tensor

Every op tk knows is also in tk.ops (generated from the library's op registry) and, with torch
installed, a torch.library custom op torch.ops.tk.<name> that torch.compile keeps in its graph.
tk.kernelize(model) runs a transformers model's layers on tk ops. See docs/python.md.
"""
from ._lib import (Context, InvalidArgumentError, NoDeviceError, NotFoundError, SelftestError, TkError,
                   UnsupportedError, UntrustedError, current_context, device_count, library_path, version)
from . import ops
from .hub import (KernelModule, get_kernel, has_kernel, install_locked, list_installed, lock, selftest, selftest_records,
                  selftest_results)

__version__ = version()


def kernelize(model, **kwargs):
    """Replaces the forward of a transformers model's layers by tk ops; see tk.kernelize_mod.kernelize."""
    from .kernelize_mod import kernelize as k
    return k(model, **kwargs)


__all__ = ["get_kernel", "has_kernel", "list_installed", "lock", "install_locked", "kernelize", "ops", "Context",
           "KernelModule", "TkError", "InvalidArgumentError", "NotFoundError", "UntrustedError", "NoDeviceError",
           "UnsupportedError", "SelftestError", "current_context", "device_count", "library_path", "version",
           "selftest", "selftest_results", "selftest_records"]
