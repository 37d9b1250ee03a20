/*
 * fuzz_upload.c — the body of a `tk serve` upload (hub/serve.c): tk_hub__serve_upload_untar unpacks
 * the plain tar into a fresh stage folder; only manifest.json, manifest.json.sig and one
 * source.tar.{gz,zst} may come out, each a regular file within its cap, and nothing beside the stage.
 *
 * Input: the uploaded tar. Seeds: uploads as `tk publish --to` would send them, and refused ones.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "fuzz.h"
#include "hub/serve.h"

static int count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static char in[600], stage[600], box[600];
    if (!in[0]) {
        const char *dir = fz_scratch("upload");
        if (!dir)
            abort();
        snprintf(in, sizeof in, "%s/upload.tar", dir);
        snprintf(box, sizeof box, "%s/box", dir);
        snprintf(stage, sizeof stage, "%s/box/stage", dir);
        atexit(fz_scratch_cleanup);
    }
    if (fz_write_file(in, data, size) != 0 || tk__rmtree(box) != TK_OK || tk__mkdirs(stage, 0700) != TK_OK)
        abort();
    const char *archive = NULL;
    int rc = tk_hub__serve_upload_untar(&archive, in, stage, 1 << 20);
    if (count_entries(box) != 1 || count_entries(stage) > 3)
        abort();
    if (rc == TK_OK && (!archive || count_entries(stage) != 3))
        abort();
    return 0;
}
