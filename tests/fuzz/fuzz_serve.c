/*
 * fuzz_serve.c — the request parsing of `tk serve` (hub/serve.c): the URL path split into components,
 * the Range header against a file size, and If-None-Match against an ETag.
 *
 * Input: three lines, "PATH\nRANGE\nIF-NONE-MATCH", then bytes that pick the file size.
 * Example: "/kernels/org/name/resolve/v1/manifest.json\nbytes=0-99\n\"abc\"".
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "hub/serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *p = data;
    size_t n = size;
    char *path = fz_field(&p, &n, '\n'), *range = fz_field(&p, &n, '\n'), *inm = fz_field(&p, &n, '\n');
    if (!path || !range || !inm)
        goto done;

    char *copy = strdup(path), *parts[32];
    int np = -1;
    if (copy && tk_hub__serve_split_path(parts, 32, &np, copy)) {
        if (np < 0 || np > 32)
            abort();
        for (int i = 0; i < np; i++) /* each part is a whole component inside the copy */
            if (!parts[i][0] || strchr(parts[i], '/') || parts[i][0] == '.' || parts[i] < copy ||
                parts[i] >= copy + strlen(path))
                abort();
    }
    free(copy);

    static const int64_t sizes[] = {0, 1, 100, 4096, (int64_t)1 << 40, INT64_MAX};
    int64_t fsize = sizes[n ? p[0] % 6 : 2];
    int64_t from = -7, to = -7;
    int r = tk_hub__serve_parse_range(range, fsize, &from, &to);
    if (r == 1 && !(0 <= from && from <= to && to < fsize))
        abort(); /* a range the server would serve must lie inside the file */
    if (r < -1 || r > 1)
        abort();

    tk_hub__serve_etag_matches(inm, "\"0123456789abcdef\"");
    tk_hub__serve_etag_matches(inm, "");
    tk_hub__serve_etag_matches(range, inm);
done:
    free(path);
    free(range);
    free(inm);
    return 0;
}
