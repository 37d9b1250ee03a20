/*
 * fuzz_ref.c — the short texts tk reads from the command line, lock files, yank statements and
 * registries: package references (org/name@2, @v2, @<commit>), names, versions, in-package paths,
 * public keys and key ids, dtypes, cache sizes ("512MiB"), bounded integers and URL origins.
 *
 * Input: one text, given to every parser (each stops at the first NUL).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kcache.h"
#include "common/common.h"
#include "hub/hub.h"
#include "hub/http.h"
#include "manifest/manifest.h"
#include "hub/sign.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = malloc(size + 1);
    if (!s)
        return 0;
    memcpy(s, data, size);
    s[size] = '\0';

    tk_hub_ref ref;
    if (tk_hub__ref_parse(&ref, s) == TK_OK) {
        /* a parsed reference is whole: its name checks out again and splits into org and pkg */
        char org[65], pkg[65];
        if (tk_manifest__name_check(ref.name, org, pkg) != TK_OK || strcmp(org, ref.org) || strcmp(pkg, ref.pkg) ||
            (ref.commit[0] && !tk__is_hex(ref.commit, 40)) || ref.major < 0)
            abort();
    }
    char org[65], pkg[65];
    tk_manifest__name_check(s, org, pkg);
    tk_manifest__path_check(s);
    int major = -1;
    if (tk_manifest__version_parse(s, &major) == 0 && major < 0)
        abort();
    char keyid[TK_KEYID_LEN];
    if (tk_hub__pubkey_check(s, keyid) == TK_OK && (strlen(keyid) != 39 || !tk__has_prefix(keyid, "SHA256:")))
        abort();
    tk_dtype dt;
    tk_dtype_parse(&dt, s);
    int64_t v;
    tk_kcache__parse_size(s, &v);
    tk__parse_i64(s, INT64_MIN, INT64_MAX, &v);
    tk__parse_i64(s, 1, 1000000, &v);
    char origin[256];
    tk_hub__http_origin(origin, sizeof origin, s);
    tk_hub__http_origin(origin, 8, s);
    uint8_t raw[32];
    tk__unhex(raw, sizeof raw, s);
    free(s);
    return 0;
}
