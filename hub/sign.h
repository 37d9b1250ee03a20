/*
 * sign.h — Ed25519 keys and detached manifest signatures, on OpenSSL (nothing hand-written).
 *
 * Text forms: a public key is "ed25519:<64 hex>"; a key id is "SHA256:<32 hex>" (the first 16 bytes
 * of sha256 over the raw 32-byte key); a signature file is the JSON document described in
 * docs/package-format.md.
 */
#ifndef TK_HUB_SIGN_H
#define TK_HUB_SIGN_H

#include <stddef.h>
#include <stdint.h>

#define TK_KEYID_LEN 40  /* "SHA256:" + 32 hex + NUL, rounded */
#define TK_PUBKEY_LEN 80 /* "ed25519:" + 64 hex + NUL, rounded */

typedef struct tk_hub_key tk_hub_key;

/* Creates a key pair: private key PEM at key_path (0600, O_EXCL), public text at key_path.pub. */
int tk_hub__key_generate(char **pubkey, const char *key_path);
/* Loads a private Ed25519 key (PEM). */
int tk_hub__key_load(tk_hub_key **out, const char *key_path);
void tk_hub__key_free(tk_hub_key *k);
/* The public key text of a loaded private key. */
int tk_hub__key_pubkey(char **pubkey, const tk_hub_key *k);

/* Validates a public key text; fills keyid (may be NULL). TK_ERR_INVALID if malformed. */
int tk_hub__pubkey_check(const char *pubkey, char keyid[TK_KEYID_LEN]);

/* Signs msg; *sigfile receives the signature file's JSON text. */
int tk_hub__sign(char **sigfile, const tk_hub_key *k, const void *msg, size_t n);
/* Parses a signature file: fills the signer's key id and public key (the key id is checked to be the
 * public key's fingerprint) and the 64-byte signature. TK_ERR_SIGNATURE if malformed. Whether the
 * signer is trusted is the caller's decision. */
int tk_hub__sig_parse(char keyid[TK_KEYID_LEN], char pubkey[TK_PUBKEY_LEN], uint8_t sig[64], const char *sigfile,
                      size_t n);
/* Verifies sig over msg with pubkey. TK_OK or TK_ERR_SIGNATURE. */
int tk_hub__verify(const char *pubkey, const uint8_t sig[64], const void *msg, size_t n);

#endif
