/*
 * fuzz_sig.c — detached signature files (hub/sign.c): tk_hub__sig_parse, then tk_hub__verify of the
 * parsed signature over a message, as the get path checks a manifest or a yank statement.
 *
 * Input: "SIGFILE\0MESSAGE" (no NUL: all signature file, empty message). Seeds: real
 * manifest.json.sig files with their manifests.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "hub/sign.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, '\0', size);
    size_t slen = nul ? (size_t)(nul - data) : size;
    const uint8_t *msg = nul ? nul + 1 : data + size;
    size_t mlen = nul ? size - slen - 1 : 0;
    char keyid[TK_KEYID_LEN], pubkey[TK_PUBKEY_LEN];
    uint8_t sig[64];
    if (tk_hub__sig_parse(keyid, pubkey, sig, (const char *)data, slen) == TK_OK) {
        char check[TK_KEYID_LEN];
        if (tk_hub__pubkey_check(pubkey, check) != TK_OK || strcmp(check, keyid) != 0)
            abort(); /* the parser promised the key id is the key's fingerprint */
        int rc = tk_hub__verify(pubkey, sig, msg, mlen);
        if (rc != TK_OK && rc != TK_ERR_SIGNATURE)
            abort();
    }
    return 0;
}
