#!/usr/bin/env bash
# ux.sh — small output and setup fixes: keygen creates missing directories, doctor names the config
# file, a config value of the wrong type is an error naming the key.
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

run_tests
