/*
 * fuzz.h — small helpers the fuzz targets share (header-only, static functions).
 *
 * Inputs are split into NUL- or newline-terminated fields with fz_field, and a target that needs files
 * makes a private scratch folder once with fz_scratch.
 */
#ifndef TK_FUZZ_H
#define TK_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"

/* The next field of (*p, *n) up to the separator sep (or the end), malloc'd and NUL-terminated;
 * advances past it. Never NULL unless out of memory. */
static inline char *fz_field(const uint8_t **p, size_t *n, char sep)
{
    const uint8_t *end = memchr(*p, sep, *n);
    size_t len = end ? (size_t)(end - *p) : *n;
    char *s = malloc(len + 1);
    if (s) {
        memcpy(s, *p, len);
        s[len] = '\0';
    }
    *p += end ? len + 1 : len;
    *n -= end ? len + 1 : len;
    return s;
}

/* A fresh folder of this process's own under $TMPDIR (default /tmp), made once; NULL on failure. */
static inline const char *fz_scratch(const char *name)
{
    static char dir[512];
    if (dir[0])
        return dir;
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tk-fuzz-%s-XXXXXX", t && *t ? t : "/tmp", name);
    if (!mkdtemp(dir)) {
        dir[0] = '\0';
        return NULL;
    }
    return dir;
}

/* Writes data to path (no fsync: scratch files only). 0 or -1. */
static inline int fz_write_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = n ? fwrite(data, 1, n, f) : 0;
    return (fclose(f) == 0 && w == n) ? 0 : -1;
}

/* Removes the scratch folder at exit. */
static inline void fz_scratch_cleanup(void)
{
    const char *d = fz_scratch("x");
    if (d)
        tk__rmtree(d);
}

#endif
