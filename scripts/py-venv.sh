# py-venv.sh — sourced, not run: exports TK_PY_VENV, the test venv (the Python oracles: torch,
# transformers, tokenizers, ...). Default: one venv per user, ${XDG_CACHE_HOME:-$HOME/.cache}/tk/py-venv,
# so every checkout shares the ~6 GB that scripts/setup.sh --test installs there once. The C tests
# compute the same default (th_py_venv in tests/harness.h).
if [ -z "${TK_PY_VENV:-}" ]; then
  if [ -n "${XDG_CACHE_HOME:-}" ] && [ "${XDG_CACHE_HOME#/}" != "$XDG_CACHE_HOME" ]; then
    TK_PY_VENV=$XDG_CACHE_HOME/tk/py-venv
  else
    TK_PY_VENV=${HOME:-/tmp}/.cache/tk/py-venv
  fi
fi
export TK_PY_VENV
