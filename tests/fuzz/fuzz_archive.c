/*
 * fuzz_archive.c — source archive extraction (hub/archive.c): tk_hub__archive_extract of the input
 * into a fresh empty folder, with the allowlist, the limits and the expected files of a small package
 * (a.cu, include/b.cuh, README.md below). Whatever happens, nothing may land outside that folder, and a
 * refused archive leaves the folder empty.
 *
 * Input: the archive's bytes (tar in gzip or zstd). Seeds: archives of those three files, as
 * `tk publish` makes them, and hostile ones (links, "..", absolute paths, duplicates, wrong sizes).
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "fuzz.h"
#include "hub/archive.h"

static const char *const names[3] = {"a.cu", "include/b.cuh", "README.md"};
static const char *const texts[3] = {"__global__ void k(float *x) { x[0] = 1.0f; }\n", "#pragma once\n", "# fuzz\n"};

/* Entries in dir besides . and .. (-1 when it cannot be read). */
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
    static char shas[3][TK_SHA256_HEX];
    static tk_manifest_file expect[3];
    static char in[600], out[600], outside[600];
    if (!in[0]) {
        const char *dir = fz_scratch("archive");
        if (!dir)
            abort();
        for (int i = 0; i < 3; i++) {
            tk__sha256_hex(shas[i], texts[i], strlen(texts[i]));
            expect[i] = (tk_manifest_file){names[i], shas[i], (int64_t)strlen(texts[i])};
        }
        snprintf(in, sizeof in, "%s/in.tar", dir);
        snprintf(out, sizeof out, "%s/box/out", dir);
        snprintf(outside, sizeof outside, "%s/box", dir);
        atexit(fz_scratch_cleanup);
    }
    if (fz_write_file(in, data, size) != 0 || tk__rmtree(outside) != TK_OK || tk__mkdirs(out, 0755) != TK_OK)
        abort();
    tk_hub_unpack_limits lim = {64, 1 << 20, 1 << 19, 200};
    int rc = tk_hub__archive_extract(in, out, expect, 3, &lim);
    if (count_entries(outside) != 1)
        abort(); /* something was written beside the destination */
    if (rc != TK_OK && count_entries(out) != 0)
        abort(); /* a refused archive must leave nothing behind */
    if (rc == TK_OK) {
        for (int i = 0; i < 3; i++) { /* every expected file is there with its digest */
            char path[700], sha[TK_SHA256_HEX];
            snprintf(path, sizeof path, "%s/%s", out, names[i]);
            if (tk__sha256_file(sha, NULL, path) != TK_OK || strcmp(sha, shas[i]) != 0)
                abort();
        }
    }
    return 0;
}
