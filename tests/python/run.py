"""A small test runner for the Python package (no pytest needed): runs every test_* function of
tests/python/test_*.py, each in a fresh TK_HOME, and prints "N passed, N failed, N skipped" last, as
tests/run.sh wants. A module's PARAMS = {"test_x": [p1, p2]} runs test_x once per parameter.
A test skips by raising Skip(reason).

usage: python tests/python/run.py [FILTER]   (FILTER: a substring of "module.test[param]")
"""
import importlib.util
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import Skip  # noqa: E402


def main():
    filt = sys.argv[1] if len(sys.argv) > 1 else ""
    passed = failed = skipped = 0
    for fn in sorted(os.listdir(HERE)):
        if not (fn.startswith("test_") and fn.endswith(".py")):
            continue
        modname = fn[:-3]
        spec = importlib.util.spec_from_file_location(modname, os.path.join(HERE, fn))
        mod = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(mod)
        except Skip as e:
            print("skip %s: %s" % (modname, e))
            skipped += 1
            continue
        except Exception:
            print("FAIL %s: import failed\n%s" % (modname, traceback.format_exc()))
            failed += 1
            continue
        params = getattr(mod, "PARAMS", {})
        for name, f in list(vars(mod).items()):
            if not name.startswith("test_") or not callable(f):
                continue
            for p in params.get(name, [None]):
                label = "%s.%s%s" % (modname, name, "" if p is None else "[%s]" % (p,))
                if filt and filt not in label:
                    continue
                home = tempfile.mkdtemp(prefix="tk-py-")
                os.environ["TK_HOME"] = home
                for v in ("TK_ENDPOINT", "TK_OFFLINE", "TK_TOKEN"):
                    os.environ.pop(v, None)
                import tk._lib
                tk._lib.reset_current_context()
                t0 = time.time()
                try:
                    f() if p is None else f(p)
                    print("ok   %s (%.1fs)" % (label, time.time() - t0))
                    passed += 1
                except Skip as e:
                    print("skip %s: %s" % (label, e))
                    skipped += 1
                except Exception:
                    print("FAIL %s\n%s" % (label, traceback.format_exc()))
                    failed += 1
                finally:
                    tk._lib.reset_current_context()
                    shutil.rmtree(home, ignore_errors=True)
                sys.stdout.flush()
    print("%d passed, %d failed, %d skipped" % (passed, failed, skipped))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
