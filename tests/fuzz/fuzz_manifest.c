/*
 * fuzz_manifest.c — a package manifest as tk reads it after its signature checked out:
 * tk_manifest__parse (name, version, files, archive) and the parse of its kernels,
 * tk_manifest__kernels_parse (params, launch rules, constraints, compile options, declared ops), both
 * strict (install) and lenient (an installed manifest, read by the op registry and tk_pkg).
 *
 * Input: the manifest's bytes. Seeds: the manifests `tk publish` writes for kernels-src/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "manifest/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tk_manifest *m = NULL;
    if (tk_manifest__parse(&m, (const char *)data, size) == TK_OK) {
        /* what the get path reads next: every field is there and its strings are whole */
        size_t sum = strlen(m->name) + strlen(m->version) + strlen(m->org) + strlen(m->pkg) + strlen(m->archive.path) +
                     strlen(m->archive.sha256) + strlen(m->compression);
        for (size_t i = 0; i < m->nfiles; i++)
            sum += strlen(m->files[i].path) + strlen(m->files[i].sha256);
        if (sum == 0 || m->major < 0)
            abort();
    } else if (m) {
        abort(); /* *out stays NULL on failure */
    }
    tk_manifest__free(m);
    json_t *j = json_loadb((const char *)data, size, 0, NULL);
    for (unsigned flags = 0; j && flags <= TK_MANIFEST_LENIENT; flags++) {
        tk_manifest_kernels ks;
        if (tk_manifest__kernels_parse(&ks, j, flags, NULL, NULL) == TK_OK) {
            for (size_t i = 0; i < ks.nk; i++) /* every kernel whole: strings and a launch rule */
                if (!ks.k[i].name || !ks.k[i].op || !ks.k[i].symbol || !ks.k[i].source || !ks.k[i].grid[0] ||
                    !ks.k[i].block[0] || !ks.k[i].smem)
                    abort();
        } else if (ks.nk || ks.k) {
            abort(); /* cleared on failure */
        }
        tk_manifest__kernels_free(&ks);
    }
    json_decref(j);
    return 0;
}
