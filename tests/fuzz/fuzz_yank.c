/*
 * fuzz_yank.c — yank statements (hub/yank.c), the signed JSON a publisher sends to withdraw a version
 * and a client downloads beside it: tk_hub__yank_parse.
 *
 * Input: the statement's bytes. Seeds: statements as tk_hub__yank_make writes them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "hub/hub.h"
#include "manifest/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tk_hub_yank y;
    if (tk_hub__yank_parse(&y, (const char *)data, size) == TK_OK) {
        /* what tree_yank builds file names from: a checked name and a plain version */
        int major = -1;
        if (tk_manifest__name_check(y.ref.name, NULL, NULL) != TK_OK ||
            tk_manifest__version_parse(y.version, &major) != 0 || major != y.major || strchr(y.version, '/') ||
            y.version[0] == '.' || strnlen(y.reason, sizeof y.reason) == sizeof y.reason)
            abort();
    }
    return 0;
}
