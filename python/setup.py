"""Builds the tk Python package. A wheel (`pip wheel python/`, `python -m build python/`) bundles the
checkout's build/libtk.so.0 as tk/_lib/libtk.so.0 when it exists (set TK_LIBRARY to bundle another one,
or TK_WHEEL_NO_LIB=1 to bundle none and use the system's libtk.so.0); the wheel is then tagged for this
platform. An editable install (`pip install -e python/`) uses the checkout's build/ in place."""
import os
import re
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    h = open(os.path.join(HERE, "..", "include", "tk.h")).read() if os.path.exists(
        os.path.join(HERE, "..", "include", "tk.h")) else ""
    m = re.search(r'#define TK_VERSION_STRING "([^"]+)"', h)
    return m.group(1) if m else "0.1.0"


def lib_to_bundle():
    if os.environ.get("TK_WHEEL_NO_LIB"):
        return None
    p = os.environ.get("TK_LIBRARY") or os.path.join(HERE, "..", os.environ.get("TK_BUILD", "build"), "libtk.so.0")
    return p if os.path.exists(p) else None


class BuildPy(build_py):
    def run(self):
        super().run()
        lib = lib_to_bundle()
        if lib and not self.editable_mode:
            dst = os.path.join(self.build_lib, "tk", "_lib")
            os.makedirs(dst, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), os.path.join(dst, "libtk.so.0"))


class BinaryDistribution(Distribution):
    def has_ext_modules(self):  # a bundled shared library makes the wheel platform-specific
        return lib_to_bundle() is not None


setup(version=version(), cmdclass={"build_py": BuildPy}, distclass=BinaryDistribution)
