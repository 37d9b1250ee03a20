/*
 * device.c — the dtype names and the device memory calls of tk.h (tk_dtype_name, tk_dtype_parse,
 * tk_device_alloc/free/copy/memset/sync): thin wrappers over the op registry's dtype table and the
 * JIT's driver calls.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "ops/ops.h"
#include "jit/jit.h"

/* ---- dtypes ----------------------------------------------------------------------------------- */

/* The dtype names are the op registry's (ops/dtype.c), so manifests, ops and the API agree. */
const char *tk_dtype_name(tk_dtype dt) { return tk_ops__dtype_str(dt); }

int tk_dtype_parse(tk_dtype *out, const char *name)
{
    if (!out)
        return tk__err(TK_ERR_INVALID, "tk_dtype_parse: out is NULL");
    memset(out, 0, sizeof *out);
    return tk_ops__dtype_parse_any(out, name);
}

/* ---- devices ---------------------------------------------------------------------------------- */

int tk_device_count(int *n) { return tk_jit__device_count(n); }
int tk_device_info_get(tk_device_info *out, int ordinal) { return tk_jit__device_info(out, ordinal); }

int tk_device_alloc(void **dptr, int device, size_t bytes)
{
    uint64_t p = 0;
    if (!dptr)
        return tk__err(TK_ERR_INVALID, "tk_device_alloc: dptr is NULL");
    *dptr = NULL;
    int rc = tk_jit__mem_alloc(&p, device, bytes);
    if (rc == TK_OK)
        *dptr = (void *)(uintptr_t)p;
    return rc;
}

int tk_device_free(void *dptr, int device)
{
    return dptr ? tk_jit__mem_free((uint64_t)(uintptr_t)dptr, device) : TK_OK;
}

int tk_device_copy(void *dst, const void *src, size_t bytes, tk_copy_kind kind, int device)
{
    if (kind != TK_COPY_H2D && kind != TK_COPY_D2H && kind != TK_COPY_D2D)
        return tk__err(TK_ERR_INVALID, "tk_device_copy: kind %d is not TK_COPY_H2D, _D2H or _D2D", (int)kind);
    if (!bytes)
        return TK_OK;
    if (!dst || !src)
        return tk__err(TK_ERR_INVALID, "tk_device_copy: %s is NULL", dst ? "src" : "dst");
    return tk_jit__mem_copy(dst, src, bytes, (int)kind, device);
}

int tk_device_memset(void *dptr, int value, size_t bytes, int device)
{
    if (!bytes)
        return TK_OK;
    if (!dptr)
        return tk__err(TK_ERR_INVALID, "tk_device_memset: dptr is NULL");
    return tk_jit__mem_set((uint64_t)(uintptr_t)dptr, value, bytes, device);
}

int tk_device_sync(int device) { return tk_jit__sync(device); }
