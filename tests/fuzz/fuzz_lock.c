/*
 * fuzz_lock.c — lock files (api/project.c): tk_lock_install reads the file, checks each entry and asks
 * for exactly the pinned commit and manifest digest. The context is offline with an empty home, so
 * every well-formed entry ends in "not installed" after its name, commit and digest were read.
 *
 * Input: the lock file's bytes. Seeds: lock files as `tk lock` writes them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fuzz.h"
#include "tk.h"

static tk_ctx *ctx;
static char path[600];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx) {
        const char *dir = fz_scratch("lock");
        if (!dir)
            abort();
        char home[600];
        snprintf(home, sizeof home, "%s/home", dir);
        snprintf(path, sizeof path, "%s/tk.lock", dir);
        tk_ctx_opts o = TK_CTX_OPTS_INIT;
        o.home = home;
        o.offline = 1;
        o.endpoint = "http://127.0.0.1:9/";
        if (tk_ctx_new(&ctx, &o) != TK_OK)
            abort();
        atexit(fz_scratch_cleanup);
    }
    if (fz_write_file(path, data, size) != 0)
        abort();
    tk_lock_install(ctx, path, NULL, NULL, NULL);
    return 0;
}
