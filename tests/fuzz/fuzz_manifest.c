/*
 * fuzz_manifest.c — a package manifest as tk reads it after its signature checked out:
 * tk_manifest__parse (name, version, files, archive) and the install-time kernel validation
 * tk_api__validate_kernels (params, launch rules, constraints, compile options).
 *
 * Input: the manifest's bytes. Seeds: the manifests `tk publish` writes for kernels-src/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "manifest/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tk_manifest *m = NULL;
    if (tk_manifest__parse(&m, (const char *)data, size) == TK_OK) {
        /* what the get path reads next: every field is there and its strings are whole */
        size_t sum = strlen(m->name) + strlen(m->version) + strlen(m->org) + strlen(m->pkg) +
                     strlen(m->archive.path) + strlen(m->archive.sha256) + strlen(m->compression);
        for (size_t i = 0; i < m->nfiles; i++)
            sum += strlen(m->files[i].path) + strlen(m->files[i].sha256);
        if (sum == 0 || m->major < 0)
            abort();
    } else if (m) {
        abort(); /* *out stays NULL on failure */
    }
    tk_manifest__free(m);
    tk_api__validate_kernels(NULL, (const char *)data, size);
    return 0;
}
