/*
 * sign.c — Ed25519 key generation, signing and verification with OpenSSL 3's EVP interface.
 * OpenSSL errors are turned into tk statuses here, at the module's edge.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "common/common.h"
#include "hub/sign.h"

#define PUB_PREFIX "ed25519:"

struct tk_hub_key {
    EVP_PKEY *pkey;
};

static const char *ossl_err(void)
{
    static _Thread_local char buf[256];
    unsigned long e = ERR_get_error();
    if (!e)
        return "unknown OpenSSL error";
    ERR_error_string_n(e, buf, sizeof buf);
    ERR_clear_error();
    return buf;
}

static int pub_text(char **out, EVP_PKEY *pkey)
{
    uint8_t raw[32];
    size_t len = sizeof raw;
    if (EVP_PKEY_get_raw_public_key(pkey, raw, &len) != 1 || len != 32)
        return tk__err(TK_ERR_INTERNAL, "cannot read the public key: %s", ossl_err());
    char hex[65];
    tk__hex(hex, raw, 32);
    if (!(*out = tk__fmt(PUB_PREFIX "%s", hex)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

int tk_hub__pubkey_check(const char *pubkey, char keyid[TK_KEYID_LEN])
{
    uint8_t raw[32];
    if (!pubkey || !tk__has_prefix(pubkey, PUB_PREFIX) || tk__unhex(raw, 32, pubkey + strlen(PUB_PREFIX)) != 0)
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a public key\nHINT: keys look like ed25519:<64 hex digits>; "
                       "'tk keygen' prints one",
                       pubkey ? pubkey : "(null)");
    if (keyid) {
        uint8_t md[TK_SHA256_LEN];
        char hex[33];
        tk__sha256(md, raw, 32);
        tk__hex(hex, md, 16);
        snprintf(keyid, TK_KEYID_LEN, "SHA256:%s", hex);
    }
    return TK_OK;
}

int tk_hub__key_generate(char **pubkey, const char *key_path)
{
    *pubkey = NULL;
    int rc = TK_OK, fd = -1;
    FILE *f = NULL;
    char *pubpath = NULL, *pub = NULL;
    EVP_PKEY *pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    if (!pkey) {
        rc = tk__err(TK_ERR_INTERNAL, "cannot generate an Ed25519 key: %s", ossl_err());
        goto done;
    }
    fd = open(key_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            rc = tk__err(TK_ERR_IO,
                         "'%s' exists already; tk keygen never overwrites a key\n"
                         "HINT: choose another path, or remove the old key if you are sure",
                         key_path);
        else
            rc = tk__err_sys("cannot create", key_path);
        goto done;
    }
    if (!(f = fdopen(fd, "w"))) {
        rc = tk__err_sys("cannot open", key_path);
        goto done;
    }
    fd = -1;
    if (PEM_write_PrivateKey(f, pkey, NULL, NULL, 0, NULL, NULL) != 1 || fflush(f) != 0 || fsync(fileno(f)) != 0) {
        rc = tk__err(TK_ERR_IO, "cannot write the key to '%s'", key_path);
        goto done;
    }
    if ((rc = pub_text(&pub, pkey)) != TK_OK)
        goto done;
    if (!(pubpath = tk__fmt("%s.pub", key_path))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    char line[128];
    int n = snprintf(line, sizeof line, "%s\n", pub);
    if ((rc = tk__write_atomic(pubpath, line, (size_t)n, 0644)) != TK_OK)
        goto done;
    *pubkey = pub;
    pub = NULL;
done:
    if (f && fclose(f) != 0 && rc == TK_OK)
        rc = tk__err_sys("cannot close", key_path);
    if (fd >= 0)
        close(fd);
    if (rc != TK_OK && f)
        unlink(key_path);
    EVP_PKEY_free(pkey);
    free(pubpath);
    free(pub);
    return rc;
}

int tk_hub__key_load(tk_hub_key **out, const char *key_path)
{
    *out = NULL;
    FILE *f = fopen(key_path, "r");
    if (!f)
        return tk__err_sys("cannot open the private key", key_path);
    EVP_PKEY *pkey = PEM_read_PrivateKey(f, NULL, NULL, NULL);
    fclose(f);
    if (!pkey)
        return tk__err(TK_ERR_INVALID, "'%s' is not a PEM private key: %s\nHINT: 'tk keygen' makes one", key_path,
                       ossl_err());
    if (EVP_PKEY_get_base_id(pkey) != EVP_PKEY_ED25519) {
        EVP_PKEY_free(pkey);
        return tk__err(TK_ERR_INVALID, "'%s' is not an Ed25519 key", key_path);
    }
    tk_hub_key *k = calloc(1, sizeof *k);
    if (!k) {
        EVP_PKEY_free(pkey);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    k->pkey = pkey;
    *out = k;
    return TK_OK;
}

void tk_hub__key_free(tk_hub_key *k)
{
    if (!k)
        return;
    EVP_PKEY_free(k->pkey);
    free(k);
}

int tk_hub__key_pubkey(char **pubkey, const tk_hub_key *k)
{
    *pubkey = NULL;
    return pub_text(pubkey, k->pkey);
}

int tk_hub__sign(char **sigfile, const tk_hub_key *k, const void *msg, size_t n)
{
    *sigfile = NULL;
    int rc = TK_OK;
    char *pub = NULL;
    uint8_t sig[64];
    size_t siglen = sizeof sig;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!md)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (EVP_DigestSignInit(md, NULL, NULL, NULL, k->pkey) != 1 || EVP_DigestSign(md, sig, &siglen, msg, n) != 1 ||
        siglen != 64) {
        rc = tk__err(TK_ERR_INTERNAL, "signing failed: %s", ossl_err());
        goto done;
    }
    char keyid[TK_KEYID_LEN], hex[129];
    if ((rc = pub_text(&pub, k->pkey)) != TK_OK || (rc = tk_hub__pubkey_check(pub, keyid)) != TK_OK)
        goto done;
    tk__hex(hex, sig, 64);
    if (!(*sigfile = tk__fmt("{\"format_version\": 1, \"alg\": \"ed25519\", \"keyid\": \"%s\", "
                             "\"pubkey\": \"%s\", \"sig\": \"%s\"}\n",
                             keyid, pub, hex)))
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
done:
    EVP_MD_CTX_free(md);
    free(pub);
    return rc;
}

int tk_hub__sig_parse(char keyid[TK_KEYID_LEN], char pubkey[TK_PUBKEY_LEN], uint8_t sig[64], const char *sigfile,
                      size_t n)
{
    json_error_t jerr;
    json_t *j = json_loadb(sigfile, n, JSON_REJECT_DUPLICATES, &jerr);
    int rc = TK_OK;
    if (!j || !json_is_object(j)) {
        rc = tk__err(TK_ERR_SIGNATURE, "the signature file is not valid JSON (line %d: %s)", jerr.line, jerr.text);
        goto done;
    }
    json_t *fv = json_object_get(j, "format_version");
    const char *alg = json_string_value(json_object_get(j, "alg"));
    const char *kid = json_string_value(json_object_get(j, "keyid"));
    const char *hex = json_string_value(json_object_get(j, "sig"));
    if (!json_is_integer(fv) || json_integer_value(fv) != 1) {
        rc = tk__err(TK_ERR_SIGNATURE, "the signature file has an unsupported format_version\n"
                                       "HINT: upgrade tk");
        goto done;
    }
    if (!alg || strcmp(alg, "ed25519") != 0) {
        rc = tk__err(TK_ERR_SIGNATURE, "unsupported signature algorithm '%s' (tk accepts ed25519)",
                     alg ? alg : "(none)");
        goto done;
    }
    if (!kid || strlen(kid) != 39 || !tk__has_prefix(kid, "SHA256:") || !tk__is_hex(kid + 7, 32)) {
        rc = tk__err(TK_ERR_SIGNATURE, "the signature file has a malformed keyid");
        goto done;
    }
    if (!hex || tk__unhex(sig, 64, hex) != 0) {
        rc = tk__err(TK_ERR_SIGNATURE, "the signature file has a malformed signature (want 128 hex digits)");
        goto done;
    }
    const char *pk = json_string_value(json_object_get(j, "pubkey"));
    char pkid[TK_KEYID_LEN];
    if (!pk || tk_hub__pubkey_check(pk, pkid) != TK_OK || strcmp(pkid, kid) != 0) {
        rc = tk__err(TK_ERR_SIGNATURE, "the signature file's public key is missing or does not match its keyid");
        goto done;
    }
    snprintf(keyid, TK_KEYID_LEN, "%s", kid);
    snprintf(pubkey, TK_PUBKEY_LEN, "%s", pk);
done:
    json_decref(j);
    return rc;
}

int tk_hub__verify(const char *pubkey, const uint8_t sig[64], const void *msg, size_t n)
{
    uint8_t raw[32];
    int rc = tk_hub__pubkey_check(pubkey, NULL);
    if (rc != TK_OK)
        return rc;
    tk__unhex(raw, 32, pubkey + strlen(PUB_PREFIX));
    EVP_PKEY *pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, raw, 32);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    if (!pkey || !md) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if (EVP_DigestVerifyInit(md, NULL, NULL, NULL, pkey) != 1) {
        rc = tk__err(TK_ERR_INTERNAL, "cannot start verification: %s", ossl_err());
        goto done;
    }
    if (EVP_DigestVerify(md, sig, 64, msg, n) != 1) {
        ERR_clear_error();
        rc = tk__err(TK_ERR_SIGNATURE, "the signature does not match the manifest");
    }
done:
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(pkey);
    return rc;
}
