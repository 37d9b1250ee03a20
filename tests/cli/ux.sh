#!/usr/bin/env bash
# ux.sh — small output and setup fixes: keygen creates missing directories, doctor names the config
# file, a config value of the wrong type is an error naming the key; and issue 23's everyday rough
# edges: misspelt config keys (item 9), trust add FILE.pub, the auth exit code, tk help CMD, the
# grouped --help, did-you-mean for options and ops, one-line remove/yank, names said once, doctor
# without a GPU (item 14).
. "$(dirname "$0")/lib.sh"

t_keygen_creates_directories() {
  expect_rc 0 "$TK" keygen "$WORK/keys/deep/er/publisher.pem"
  [ -f "$WORK/keys/deep/er/publisher.pem" ] || fail "no key written"
  [ "$(stat -c %a "$WORK/keys/deep/er")" = 700 ] || fail "key directory is not 0700"
  expect_out "ed25519:"
  # a parent that is a file is refused clearly, and nothing is written
  : >"$WORK/afile"
  expect_rc 6 "$TK" keygen "$WORK/afile/key.pem"
  expect_out "cannot create $WORK/afile"
  # the message says it once, with the reason (it once printed itself twice and ended in garbage)
  [ "$(grep -o "cannot create $WORK/afile for the key" <<<"$OUT" | wc -l)" = 1 ] || fail "message repeated: $OUT"
  expect_out "exists and is not a directory"
  [ -e "$WORK/afile/key.pem" ] && fail "a key was written"
  return 0
}

t_doctor_names_config_file() {
  OUT=$("$TK" doctor 2>&1)
  expect_out "config:   $TK_HOME/config.json (none: the defaults)"
  echo '{"archs": ["sm_90"]}' >"$TK_HOME/config.json"
  OUT=$("$TK" doctor --json 2>&1)
  echo "$OUT" | python3 -c 'import json,sys,os; d=json.load(sys.stdin); assert d["config_file"] == os.environ["TK_HOME"] + "/config.json" and d["config_exists"] is True, d; assert "driver_error" not in d or ("HINT" not in d["driver_error"] and "driver_hint" in d), d' \
    || fail "doctor --json config_file: $OUT"
}

t_config_wrong_type_is_an_error() {
  local bad
  for bad in '{"archs": "sm_90"}' '{"archs": [90]}' '{"endpoint": 5}' '{"autotune": "no"}' '{"ops": ["x"]}' '{"cache_max": -1}'; do
    echo "$bad" >"$TK_HOME/config.json"
    OUT=$("$TK" list 2>&1) && fail "config $bad accepted"
    local key; key=$(echo "$bad" | python3 -c 'import json,sys; print(next(iter(json.load(sys.stdin))))')
    expect_out "\"$key\" must be"
    expect_out "HINT: for example"
  done
  # the right types, and keys tk does not know, are fine
  echo '{"archs": ["sm_80", "sm_90"], "autotune": false, "cache_max": "4G", "ops": {}, "future_key": [1]}' >"$TK_HOME/config.json"
  expect_rc 0 "$TK" list
}

t_verbose_shows_urls_and_statuses() {
  command -v nginx >/dev/null || { skip "no nginx"; return; }
  start_nginx "$B/registry" || { fail "nginx"; return; }
  export TK_ENDPOINT=$NGINX_URL
  expect_rc 0 "$TK" -v get kernels-community/activation
  expect_out "GET $NGINX_URL/api/kernels/kernels-community/activation/refs -> HTTP 200 (attempt 1)"
  expect_out "/manifest.json -> HTTP 200"
  expect_rc 3 "$TK" -v get kernels-community/no-such-thing
  expect_out "-> HTTP 404"
  # without -v: no request lines
  expect_rc 0 "$TK" get --force kernels-community/activation
  expect_no_out "GET $NGINX_URL"
  stop_nginx
}

t_dead_registry_says_so() {
  # a file:// registry that does not exist: a network-class failure naming it, no did-you-mean
  TK_ENDPOINT=file://$WORK/no-registry expect_rc 4 "$TK" get kernels-community/activation
  expect_out "the registry file://$WORK/no-registry cannot be read"
  expect_no_out "did you mean"; expect_no_out "not found in the registry"
  # an http registry nobody listens on
  TK_ENDPOINT=http://127.0.0.1:$(free_port) expect_rc 4 "$TK" get kernels-community/activation
  expect_out "Couldn't connect"; expect_no_out "did you mean"
  OUT=$(TK_ENDPOINT=file://$WORK/no-registry "$TK" --json get kernels-community/activation 2>/dev/null)
  expect_out '"status": "network"'
}

# ---- issue 23, item 9: misspelt keys of tk's own config.json ------------------------------------------

t_config_misspelt_keys_are_named() {
  printf '{\n  "endpont": "file:///nowhere",\n  "arch": ["sm_90"],\n  "cache_max": "1G",\n  "qqqqqq": 1\n}\n' \
    >"$TK_HOME/config.json"
  expect_rc 0 "$TK" list
  expect_out "$TK_HOME/config.json:2:3: unknown key \"endpont\""
  expect_out 'did you mean "endpoint"?'
  expect_out "$TK_HOME/config.json:3:3: unknown key \"arch\""
  expect_out 'did you mean "archs"?'
  # nothing close: the known settings, no guess
  expect_out "$TK_HOME/config.json:5:3: unknown key \"qqqqqq\""
  expect_no_out 'did you mean "cache_max"'
  # tk doctor lists them and says so in its exit status
  OUT=$("$TK" doctor 2>/dev/null); local rc=$?
  [ $rc = 1 ] || [ $rc = 7 ] || fail "doctor exited $rc with unknown config keys"
  expect_out "config.json:2:3: unknown key \"endpont\" (ignored); did you mean \"endpoint\"?"
  expect_out "3 keys tk does not know"
  OUT=$("$TK" doctor --json 2>/dev/null)
  echo "$OUT" | python3 -c '
import json, sys
w = {x["key"]: x for x in json.load(sys.stdin)["config_warnings"]}
assert set(w) == {"endpont", "arch", "qqqqqq"}, w
assert w["endpont"]["line"] == 2 and w["endpont"]["column"] == 3 and w["endpont"]["suggestion"] == "endpoint", w
assert w["qqqqqq"]["suggestion"] is None, w
' || fail "doctor --json config_warnings: $OUT"
  # a clean config: nothing said
  echo '{"archs": ["sm_90"]}' >"$TK_HOME/config.json"
  expect_rc 0 "$TK" list
  expect_no_out "unknown key"
}

# ---- issue 23, item 14 ------------------------------------------------------------------------------------

t_trust_add_takes_the_pub_file() {
  expect_rc 0 "$TK" keygen "$WORK/k14.pem"
  expect_rc 0 "$TK" trust add acme "$WORK/k14.pem.pub"
  expect_out "trusted SHA256:"
  OUT=$("$TK" --json trust list)
  echo "$OUT" | python3 -c 'import json,sys; k=[x for x in json.load(sys.stdin) if x["org"]=="acme"]; assert len(k)==1 and k[0]["pubkey"]==open(sys.argv[1]).read().strip(), k' "$WORK/k14.pem.pub" \
    || fail "the key from the file is not the one trusted: $OUT"
  # the private key by mistake: refused, and nothing trusted
  expect_rc 2 "$TK" trust add other "$WORK/k14.pem"
  expect_out "private key"; expect_out "k14.pem.pub"
  echo "not a key" >"$WORK/junk.pub"
  expect_rc 2 "$TK" trust add other "$WORK/junk.pub"
  expect_out "junk.pub"
  OUT=$("$TK" --json trust list); expect_no_out '"other"'
}

t_auth_failures_have_their_own_exit_code() {
  local srv=$WORK/srv14 token url pid
  token=$("$TK" serve token add --org acme --root "$srv" -q) || { fail "token add"; return; }
  "$TK" keygen "$WORK/a.pem" >/dev/null
  "$TK" serve trust add acme "$(cat "$WORK/a.pem.pub")" --root "$srv" >/dev/null
  "$TK" serve --root "$srv" --listen 127.0.0.1:0 >"$WORK/url14" 2>"$WORK/serve14.log" & pid=$!
  for _ in $(seq 100); do url=$(head -n 1 "$WORK/url14"); [ -n "$url" ] && break; sleep 0.05; done
  [ -n "$url" ] || { fail "tk serve did not start"; kill $pid; return; }
  mkdir -p "$WORK/p14"
  cat >"$WORK/p14/kernel.json" <<'EOF'
{"name": "acme/x", "version": "1.0.0", "license": "MIT", "description": "auth test",
 "kernels": [{"name": "scale_f32", "op": "scale", "source": "scale.cu", "symbol": "scale",
   "params": [{"name": "out", "type": "tensor", "dtype": "f32"}, {"name": "n", "type": "i64", "value": "numel(out)"}],
   "launch": {"grid": ["cdiv(n, 256)"], "block": ["256"], "smem": "0"}}]}
EOF
  printf 'extern "C" __global__ void scale(float *out, long long n) { }\n' >"$WORK/p14/scale.cu"
  # a wrong token: 401
  TK_TOKEN=0000000000000000000000000000000000000000000000000000000000000000 \
    expect_rc 9 "$TK" publish "$WORK/p14" --registry "$url" --key "$WORK/a.pem"
  expect_out "HTTP 401"; expect_out "HINT"
  OUT=$(TK_TOKEN=0000000000000000000000000000000000000000000000000000000000000000 "$TK" --json publish "$WORK/p14" \
        --registry "$url" --key "$WORK/a.pem" 2>/dev/null)
  expect_out '"status": "auth"'; expect_out '"exit_code": 9'
  # a token for another org: 403
  local other; other=$("$TK" serve token add --org other --root "$srv" -q)
  TK_TOKEN=$other expect_rc 9 "$TK" yank acme/x@1.0.0 --registry "$url" --key "$WORK/a.pem"
  expect_out "HTTP 403"
  # the right token works
  TK_TOKEN=$token expect_rc 0 "$TK" publish "$WORK/p14" --registry "$url" --key "$WORK/a.pem"
  kill $pid; wait $pid 2>/dev/null
  # documented where exit codes are
  expect_rc 0 "$TK" --help; expect_out "8"; expect_out "auth"
  grep -q "8.*401\|401.*8" "$ROOT/docs/json.md" || fail "docs/json.md does not give exit code 8 for 401/403"
}

t_help_cmd_is_cmd_help() {
  local c
  for c in get list publish doctor trust; do
    [ "$("$TK" help $c 2>&1)" = "$("$TK" $c --help 2>&1)" ] || fail "tk help $c differs from tk $c --help"
  done
  expect_rc 0 "$TK" help
  expect_out "Install and use packages"
  expect_rc 2 "$TK" help nosuch
  expect_out "unknown command 'nosuch'"
}

t_top_help_grouped_and_narrow() {
  expect_rc 0 "$TK" --help
  local long; long=$(echo "$OUT" | awk 'length > 80' | head -n 3)
  [ -z "$long" ] || fail "tk --help has lines over 80 columns: $long"
  # grouped by task: a heading above each group, and every command of main.c's table listed
  expect_out "Install and use packages"; expect_out "Publish"; expect_out "Kernels and ops"; expect_out "Models"
  local c
  for c in $(sed -n 's/^ *{"\([a-z-]*\)", tk_cmd_[a-z_]*,.*/\1/p' "$ROOT/cli/main.c"); do
    echo "$OUT" | grep -qE "^  $c( |$)" || fail "tk --help does not list '$c'"
  done
  expect_out "EXIT STATUS"
}

t_did_you_mean_options_and_ops() {
  expect_rc 2 "$TK" get --forse kernels-community/activation
  expect_out "unknown option '--forse'"; expect_out "did you mean '--force'?"
  expect_rc 2 "$TK" list --outdate
  expect_out "did you mean '--outdated'?"
  expect_rc 2 "$TK" publish ./x --to /tmp/x --key k --zstdd
  expect_out "did you mean '--zstd'?"
  # nothing close: no guess
  expect_rc 2 "$TK" list --qqqqqqqq
  expect_no_out "did you mean"
  # ops
  expect_rc 3 "$TK" run-op rms_nrm --shape 2,8
  expect_out "did you mean 'rms_norm'?"
  expect_rc 3 "$TK" ops rms_nrm
  expect_out "did you mean 'rms_norm'?"
  expect_rc 3 "$TK" ops qqqqqqqqqq
  expect_no_out "did you mean"
}

t_remove_and_yank_print_one_line_and_names_once() {
  export TK_ENDPOINT=file://$B/registry
  "$TK" get -q kernels-community/rmsnorm >/dev/null 2>&1 || { fail "get rmsnorm"; return; }
  expect_rc 0 "$TK" remove kernels-community/rmsnorm
  [ "$(echo "$OUT" | grep -c .)" = 1 ] || fail "remove printed more than one line: $OUT"
  expect_out "removed kernels-community/rmsnorm"
  # not installed: the name once
  expect_rc 3 "$TK" remove kernels-community/rmsnorm
  [ "$(grep -o "kernels-community/rmsnorm" <<<"$OUT" | wc -l)" -le 2 ] || fail "name repeated: $OUT"
  expect_no_out "kernels-community/rmsnorm: kernels-community/rmsnorm"
  expect_rc 2 "$TK" remove rmsnorm
  expect_no_out "rmsnorm: 'rmsnorm'"; expect_no_out "rmsnorm: rmsnorm"
  expect_rc 3 "$TK" info kernels-community/rmsnorm@1.0.0
  expect_no_out "kernels-community/rmsnorm@1.0.0: kernels-community/rmsnorm"
  unset TK_ENDPOINT
}

run_tests
