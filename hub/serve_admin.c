/*
 * serve_admin.c — the admin state of `tk serve`: upload tokens and trusted publisher keys in the
 * tree's .tk-serve/{tokens,trust}.json (tk serve token add|list|revoke, tk serve trust
 * add|list|remove, and the lookups the request path makes). Every change takes the state lock and
 * rewrites the file atomically; a token is stored only as its sha256.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "common/common.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/serve.h"
#include "hub/serve_int.h"
#include "hub/sign.h"

/* ---- server state files: .tk-serve/{tokens,trust}.json -------------------------------------- */

static char *state_path(const char *root, const char *name) { return tk__fmt("%s/" STATE_DIR "/%s", root, name); }

/* Loads a state document {"format_version": 1, key: [...]}; a missing file gives an empty one. */
int tk_hub__serve_state_load(json_t **out, const char *root, const char *name, const char *key)
{
    *out = NULL;
    char *path = state_path(root, name), *text = NULL;
    size_t n = 0;
    if (!path)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = tk__read_file(&text, &n, path, JSON_DOC_MAX);
    json_t *j = NULL;
    if (rc == TK_ERR_NOT_FOUND) {
        rc = TK_OK;
        j = json_pack("{s:i, s:[]}", "format_version", 1, key);
    } else if (rc == TK_OK) {
        json_error_t e;
        j = json_loadb(text, n, 0, &e);
        if (!json_is_object(j) || !json_is_array(json_object_get(j, key)))
            rc = tk__err(TK_ERR_IO, "%s is damaged (line %d: %s)\nHINT: fix or remove it", path, e.line,
                         j ? "not the expected object" : e.text);
    }
    if (rc == TK_OK && !j)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    if (rc == TK_OK)
        *out = j;
    else
        json_decref(j);
    free(path);
    free(text);
    return rc;
}

static int state_save(const char *root, const char *name, json_t *j)
{
    char *path = state_path(root, name);
    char *text = json_dumps(j, JSON_INDENT(2));
    int rc =
        (!path || !text) ? tk__err(TK_ERR_NOMEM, "out of memory") : tk__write_atomic(path, text, strlen(text), 0600);
    free(path);
    free(text);
    return rc;
}

/* Creates .tk-serve/ (0700) and takes its lock; returns the fd (>= 0) or a status. */
static int state_lock(const char *root)
{
    char *dir = tk__path_join(root, STATE_DIR);
    char *lock = dir ? tk__path_join(dir, "lock") : NULL;
    int rc = TK_OK, fd = -1;
    if (!lock)
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    else if ((rc = tk__mkdirs(dir, 0700)) == TK_OK &&
             ((fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0 || flock(fd, LOCK_EX) != 0))
        rc = tk__err_sys("cannot lock the server state", lock);
    if (rc != TK_OK && fd >= 0)
        close(fd);
    free(dir);
    free(lock);
    return rc == TK_OK ? fd : rc;
}

int tk_serve_token_add(char **token, const char *root, const char *org)
{
    if (token)
        *token = NULL;
    if (!token || !root || !org)
        return tk__err(TK_ERR_INVALID, "tk_serve_token_add: token, root and org are required");
    char name[140];
    snprintf(name, sizeof name, "%s/x", org);
    if (strlen(org) > 64 || tk_manifest__name_check(name, NULL, NULL) != TK_OK)
        return tk__err(TK_ERR_INVALID, "'%s' is not an org name ([A-Za-z0-9][A-Za-z0-9._-]{0,63})", org);
    uint8_t raw[32];
    char hex[65], sha[TK_SHA256_HEX];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return tk__err(TK_ERR_INTERNAL, "OpenSSL RAND_bytes failed");
    tk__hex(hex, raw, sizeof raw);
    OPENSSL_cleanse(raw, sizeof raw);
    tk__sha256_hex(sha, hex, 64);
    json_t *doc = NULL;
    int fd = state_lock(root);
    if (fd < 0)
        return fd;
    int rc = tk_hub__serve_state_load(&doc, root, "tokens.json", "tokens");
    if (rc == TK_OK) {
        json_array_append_new(json_object_get(doc, "tokens"), json_pack("{s:s, s:s, s:I}", "org", org, "sha256", sha,
                                                                        "created", (json_int_t)tk__now()));
        rc = state_save(root, "tokens.json", doc);
    }
    if (rc == TK_OK && !(*token = tk__strdup(hex)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    OPENSSL_cleanse(hex, sizeof hex);
    json_decref(doc);
    close(fd);
    return rc;
}

int tk_serve_trust_add(char **keyid_out, const char *root, const char *org, const char *pubkey)
{
    if (keyid_out)
        *keyid_out = NULL;
    if (!root || !org || !pubkey)
        return tk__err(TK_ERR_INVALID, "tk_serve_trust_add: root, org and pubkey are required");
    char name[140], keyid[TK_KEYID_LEN];
    snprintf(name, sizeof name, "%s/x", org);
    if (strlen(org) > 64 || tk_manifest__name_check(name, NULL, NULL) != TK_OK)
        return tk__err(TK_ERR_INVALID, "'%s' is not an org name ([A-Za-z0-9][A-Za-z0-9._-]{0,63})", org);
    int rc = tk_hub__pubkey_check(pubkey, keyid);
    if (rc != TK_OK)
        return rc;
    json_t *doc = NULL;
    int fd = state_lock(root);
    if (fd < 0)
        return fd;
    if ((rc = tk_hub__serve_state_load(&doc, root, "trust.json", "keys")) == TK_OK) {
        json_t *keys = json_object_get(doc, "keys"), *k;
        size_t i;
        int have = 0;
        json_array_foreach(keys, i, k) {
            if (tk__streq(json_string_value(json_object_get(k, "org")), org) &&
                tk__streq(json_string_value(json_object_get(k, "keyid")), keyid))
                have = 1;
        }
        if (!have) {
            json_array_append_new(keys, json_pack("{s:s, s:s, s:s, s:I}", "org", org, "keyid", keyid, "pubkey", pubkey,
                                                  "added", (json_int_t)tk__now()));
            rc = state_save(root, "trust.json", doc);
        }
    }
    if (rc == TK_OK && keyid_out && !(*keyid_out = tk__strdup(keyid)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    json_decref(doc);
    close(fd);
    return rc;
}

/* ---- listing and revoking (tk serve token list|revoke, tk serve trust list|remove) ------------- */

/* A token's id: the first 16 hex of its sha256 (what tokens.json keeps), enough to name it. */
#define TOKEN_ID_LEN 16

int tk_serve_token_list_json(char **out, const char *root)
{
    if (!out || !root)
        return tk__err(TK_ERR_INVALID, "tk_serve_token_list_json: out and root are required");
    *out = NULL;
    json_t *doc = NULL, *t, *list = json_array();
    int rc =
        list ? tk_hub__serve_state_load(&doc, root, "tokens.json", "tokens") : tk__err(TK_ERR_NOMEM, "out of memory");
    size_t i;
    if (rc == TK_OK)
        json_array_foreach(json_object_get(doc, "tokens"), i, t) {
            const char *sha = json_string_value(json_object_get(t, "sha256"));
            json_array_append_new(list, json_pack("{s:s%, s:s?, s:O?}", "id", sha ? sha : "",
                                                  (size_t)(sha && strlen(sha) >= TOKEN_ID_LEN ? TOKEN_ID_LEN : 0),
                                                  "org", json_string_value(json_object_get(t, "org")), "created",
                                                  json_object_get(t, "created")));
        }
    if (rc == TK_OK && !(*out = json_dumps(list, JSON_INDENT(2))))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    json_decref(list);
    json_decref(doc);
    return rc;
}

int tk_serve_token_revoke(const char *root, const char *id_or_token)
{
    if (!root || !id_or_token)
        return tk__err(TK_ERR_INVALID, "tk_serve_token_revoke: root and the token id are required");
    char sha[TK_SHA256_HEX];
    size_t n = strlen(id_or_token);
    if (n == 64) /* the token itself: match by its sha256 */
        tk__sha256_hex(sha, id_or_token, 64);
    else if (n >= 8 && n <= 64 && strspn(id_or_token, "0123456789abcdef") == n)
        snprintf(sha, sizeof sha, "%s", id_or_token);
    else
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a token id\nHINT: 'tk serve token list --root %s' shows the "
                       "ids (16 hex digits); the token itself works too",
                       id_or_token, root);
    json_t *doc = NULL;
    int fd = state_lock(root);
    if (fd < 0)
        return fd;
    int rc = tk_hub__serve_state_load(&doc, root, "tokens.json", "tokens");
    if (rc == TK_OK) {
        json_t *arr = json_object_get(doc, "tokens");
        size_t removed = 0;
        for (size_t i = 0; i < json_array_size(arr);) {
            const char *h = json_string_value(json_object_get(json_array_get(arr, i), "sha256"));
            if (h && !strncmp(h, sha, strlen(sha))) {
                json_array_remove(arr, i);
                removed++;
            } else {
                i++;
            }
        }
        if (!removed)
            rc = tk__err(TK_ERR_NOT_FOUND, "no token %s on the server at %s\nHINT: 'tk serve token list --root %s'",
                         id_or_token, root, root);
        else if (removed > 1 && n < 64)
            rc = tk__err(TK_ERR_INVALID, "'%s' names %zu tokens\nHINT: give more digits of the id", id_or_token,
                         removed);
        else
            rc = state_save(root, "tokens.json", doc);
    }
    json_decref(doc);
    close(fd);
    return rc;
}

int tk_serve_trust_list_json(char **out, const char *root)
{
    if (!out || !root)
        return tk__err(TK_ERR_INVALID, "tk_serve_trust_list_json: out and root are required");
    *out = NULL;
    json_t *doc = NULL;
    int rc = tk_hub__serve_state_load(&doc, root, "trust.json", "keys");
    if (rc == TK_OK && !(*out = json_dumps(json_object_get(doc, "keys"), JSON_INDENT(2))))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
    json_decref(doc);
    return rc;
}

int tk_serve_trust_remove(const char *root, const char *org, const char *key)
{
    if (!root || !org || !key)
        return tk__err(TK_ERR_INVALID, "tk_serve_trust_remove: root, org and the key are required");
    char keyid[TK_KEYID_LEN];
    if (tk__has_prefix(key, "ed25519:")) {
        int rc = tk_hub__pubkey_check(key, keyid);
        if (rc != TK_OK)
            return rc;
        key = keyid;
    }
    json_t *doc = NULL;
    int fd = state_lock(root);
    if (fd < 0)
        return fd;
    int rc = tk_hub__serve_state_load(&doc, root, "trust.json", "keys");
    if (rc == TK_OK) {
        json_t *arr = json_object_get(doc, "keys");
        size_t removed = 0;
        for (size_t i = 0; i < json_array_size(arr);) {
            json_t *k = json_array_get(arr, i);
            const char *id = json_string_value(json_object_get(k, "keyid"));
            if (tk__streq(json_string_value(json_object_get(k, "org")), org) && id &&
                (tk__streq(id, key) ||
                 (!tk__has_prefix(key, "SHA256:") && tk__has_prefix(id, "SHA256:") && tk__streq(id + 7, key)))) {
                json_array_remove(arr, i);
                removed++;
            } else {
                i++;
            }
        }
        rc = removed ? state_save(root, "trust.json", doc)
                     : tk__err(TK_ERR_NOT_FOUND,
                               "org '%s' has no key %s on the server at %s\nHINT: 'tk serve trust "
                               "list --root %s'",
                               org, key, root, root);
    }
    json_decref(doc);
    close(fd);
    return rc;
}

/* The org a token may write to: TK_OK and org filled, TK_ERR_NOT_FOUND for an unknown token. */
int tk_hub__serve_token_org(char org[65], const char *root, const char *token)
{
    char sha[TK_SHA256_HEX];
    tk__sha256_hex(sha, token, strlen(token));
    json_t *doc = NULL;
    int rc = tk_hub__serve_state_load(&doc, root, "tokens.json", "tokens");
    if (rc != TK_OK)
        return rc;
    rc = TK_ERR_NOT_FOUND;
    json_t *t;
    size_t i;
    json_array_foreach(json_object_get(doc, "tokens"), i, t) {
        const char *h = json_string_value(json_object_get(t, "sha256"));
        const char *o = json_string_value(json_object_get(t, "org"));
        if (h && o && strlen(h) == 64 && CRYPTO_memcmp(h, sha, 64) == 0 && rc != TK_OK) {
            snprintf(org, 65, "%s", o);
            rc = TK_OK;
        }
    }
    json_decref(doc);
    return rc;
}

/* Writing a version into the tree uses hub/tree.h, shared with hub/publish.c. */
