/*
 * tensor_util.h — seeded random numbers, dtype constants and host-tensor element access for the op tests (any dtype the CPU references take,
 * honouring strides). Header-only: static inline functions.
 */
#ifndef TK_TEST_TENSOR_UTIL_H
#define TK_TEST_TENSOR_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "tk.h"

/* A seeded splitmix64 stream: tests set `seed`, then rng = seed, and print the seed on failure. */
static uint64_t seed, rng;

static inline uint64_t next_u64(void)
{
    uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline double uniform(double lo, double hi) { return lo + (hi - lo) * ((next_u64() >> 11) * 0x1.0p-53); }

static const tk_dtype F32 = {TK_DL_FLOAT, 32, 1}, F16 = {TK_DL_FLOAT, 16, 1}, BF16 = {TK_DL_BFLOAT, 16, 1};
static const tk_dtype I8 = {TK_DL_INT, 8, 1}, I32 = {TK_DL_INT, 32, 1}, I64 = {TK_DL_INT, 64, 1},
                      E4M3 = {TK_DL_FLOAT8_E4M3FN, 8, 1}, E5M2 = {TK_DL_FLOAT8_E5M2, 8, 1};
/* The float dtypes an op test runs every case in. */
static const tk_dtype *const all_dtypes[] = {&F32, &F16, &BF16};

static inline int64_t numel(const tk_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* Element offset of flat (row-major logical) index i. */
static inline int64_t elem_off(const tk_tensor *t, int64_t i)
{
    if (!t->strides)
        return i;
    int64_t off = 0;
    for (int k = t->ndim - 1; k >= 0; k--) {
        off += (i % t->shape[k]) * t->strides[k];
        i /= t->shape[k];
    }
    return off;
}

static inline double get(const tk_tensor *t, int64_t i)
{
    int64_t o = elem_off(t, i);
    if (t->dtype.bits == 32)
        return ((const float *)t->data)[o];
    uint16_t v = ((const uint16_t *)t->data)[o];
    return t->dtype.code == TK_DL_BFLOAT ? tk_ops__bf16_to_f32(v) : tk_ops__f16_to_f32(v);
}

static inline void set(tk_tensor *t, int64_t i, double v)
{
    int64_t o = elem_off(t, i);
    if (t->dtype.bits == 32)
        ((float *)t->data)[o] = (float)v;
    else if (t->dtype.code == TK_DL_BFLOAT)
        ((uint16_t *)t->data)[o] = tk_ops__f32_to_bf16((float)v);
    else
        ((uint16_t *)t->data)[o] = tk_ops__f32_to_f16((float)v);
}

/* The value v would have once stored in dtype dt (overflow becomes inf). */
static inline double quantize(double v, tk_dtype dt)
{
    float f = (float)v;
    if (dt.bits == 32)
        return f;
    return dt.code == TK_DL_BFLOAT ? tk_ops__bf16_to_f32(tk_ops__f32_to_bf16(f))
                                   : tk_ops__f16_to_f32(tk_ops__f32_to_f16(f));
}

/* ---- host tensors ----------------------------------------------------------------------------- */

/* A host tensor owning its buffer: t describes it, shape/strides back t's arrays. */
typedef struct {
    tk_tensor t;
    int64_t shape[8], strides[8];
    void *buf;
} host_t;

/* A zeroed tensor of `ndim` dims (0 for a scalar []); with pad > 0 each row of the last dimension is
 * pad elements longer than the shape (a strided view of a bigger buffer). Contiguous when pad is 0. */
static inline void host_new(host_t *h, tk_dtype dt, int ndim, const int64_t *shape, int64_t pad)
{
    memset(h, 0, sizeof *h);
    int64_t rowlen = ndim ? shape[ndim - 1] + pad : 1, rows = 1;
    for (int i = 0; i < ndim; i++) {
        h->shape[i] = shape[i];
        if (i < ndim - 1)
            rows *= shape[i];
    }
    h->buf = calloc(1, (size_t)(rows * rowlen) * dt.bits / 8 + 16);
    h->t.data = h->buf;
    h->t.device.device_type = TK_DEV_CPU;
    h->t.ndim = ndim;
    h->t.dtype = dt;
    h->t.shape = h->shape;
    if (pad > 0 && ndim > 0) {
        int64_t s = 1;
        for (int i = ndim - 1; i >= 0; i--) {
            h->strides[i] = s;
            s *= i == ndim - 1 ? rowlen : shape[i];
        }
        h->t.strides = h->strides;
    }
}

static inline void host_free(host_t *h) { free(h->buf); }

/* Uniform values in [-scale, scale], rounded to the tensor's dtype. */
static inline void fill(host_t *h, double scale)
{
    for (int64_t i = 0, n = numel(&h->t); i < n; i++)
        set(&h->t, i, uniform(-scale, scale));
}

#endif
