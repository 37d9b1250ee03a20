#!/usr/bin/env bash
# The Python package (python/tk) through tests/python/run.py, in the test venv
# ($TK_PY_VENV, default ~/.cache/tk/py-venv: torch CPU, transformers) with the checkout's package and library
# (PYTHONPATH=python, build/libtk.so.0). Prints run.py's "N passed, N failed, N skipped" last.
# Without the venv it skips, except under CI=true, where a missing oracle is a failure.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
. scripts/py-venv.sh   # TK_PY_VENV, default ~/.cache/tk/py-venv
VENV=$TK_PY_VENV
PY=$VENV/bin/python
# found, not imported (run.py imports them; an import costs seconds)
if ! "$PY" -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("torch", "transformers", "numpy")))' 2>/dev/null; then
  if [ "${CI:-}" = true ]; then
    echo "FAIL the test venv $VENV lacks torch/transformers/numpy (run scripts/setup.sh --test)"
    echo "0 passed, 1 failed, 0 skipped"; exit 1
  fi
  echo "skip: no test venv at $VENV with torch and transformers (scripts/setup.sh --test makes it)"
  echo "0 passed, 0 failed, 1 skipped"; exit 0
fi
[ -e "${TK_BUILD:-build}/libtk.so.0" ] || { echo "FAIL ${TK_BUILD:-build}/libtk.so.0 is missing (make lib)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
unset TK_LIBRARY TK_ENDPOINT TK_OFFLINE TK_TOKEN
export PYTHONPATH=$ROOT/python${PYTHONPATH:+:$PYTHONPATH}
export PYTHONDONTWRITEBYTECODE=1
exec "$PY" tests/python/run.py ${TK_TEST_ONLY:-}
