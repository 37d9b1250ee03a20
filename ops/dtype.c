/*
 * dtype.c — dtype names, the conversions' tk_ops__ names (the one copy is common/convert.h) and
 * strided float loads and stores for the CPU references.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

#include "common/convert.h"
#include "ops/ops.h"

static const struct {
    uint8_t code, bits;
    unsigned bit;
    const char *name;
} dtypes[] = {
    {TK_DL_FLOAT, 32, TK_OPS_F32, "f32"},
    {TK_DL_FLOAT, 16, TK_OPS_F16, "f16"},
    {TK_DL_BFLOAT, 16, TK_OPS_BF16, "bf16"},
    {TK_DL_FLOAT, 64, TK_OPS_F64, "f64"},
    {TK_DL_INT, 32, TK_OPS_I32, "i32"},
    {TK_DL_INT, 64, TK_OPS_I64, "i64"},
    {TK_DL_INT, 8, TK_OPS_I8, "i8"},
    {TK_DL_UINT, 8, TK_OPS_U8, "u8"},
    {TK_DL_FLOAT8_E4M3FN, 8, TK_OPS_FP8_E4M3, "fp8_e4m3"},
    {TK_DL_FLOAT8_E5M2, 8, TK_OPS_FP8_E5M2, "fp8_e5m2"},
};
#define NDTYPES (sizeof dtypes / sizeof dtypes[0])

unsigned tk_ops__dtype_bit(tk_dtype dt)
{
    if (dt.lanes != 1)
        return 0;
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtypes[i].code == dt.code && dtypes[i].bits == dt.bits)
            return dtypes[i].bit;
    return 0;
}

const char *tk_ops__dtype_str(tk_dtype dt)
{
    if (dt.lanes == 1)
        for (size_t i = 0; i < NDTYPES; i++)
            if (dtypes[i].code == dt.code && dtypes[i].bits == dt.bits)
                return dtypes[i].name;
    return "?";
}

const char *tk_ops__dtype_bit_str(unsigned bit)
{
    for (size_t i = 0; i < NDTYPES; i++)
        if (dtypes[i].bit == bit)
            return dtypes[i].name;
    return NULL;
}

int tk_ops__dtype_parse(tk_dtype *out, const char *name)
{
    for (size_t i = 0; name && i < NDTYPES; i++)
        if (strcmp(dtypes[i].name, name) == 0) {
            out->code = dtypes[i].code;
            out->bits = dtypes[i].bits;
            out->lanes = 1;
            return TK_OK;
        }
    return tk__err(TK_ERR_INVALID,
                   "unknown dtype '%s'\nHINT: use one of f32, f16, bf16, f64, i8, u8, i32, i64, fp8_e4m3, "
                   "fp8_e5m2",
                   name ? name : "(null)");
}

/* Other spellings people type: torch's names (float16, bfloat16, int8, float8_e4m3fn, ...), fp16 and
 * half. Never in manifests, which keep one name per dtype. */
static const struct {
    const char *alias, *name;
} aliases[] = {
    {"float32", "f32"},
    {"fp32", "f32"},
    {"float", "f32"},
    {"float16", "f16"},
    {"fp16", "f16"},
    {"half", "f16"},
    {"bfloat16", "bf16"},
    {"float64", "f64"},
    {"fp64", "f64"},
    {"double", "f64"},
    {"int32", "i32"},
    {"int64", "i64"},
    {"int8", "i8"},
    {"uint8", "u8"},
    {"float8_e4m3fn", "fp8_e4m3"},
    {"float8_e4m3", "fp8_e4m3"},
    {"e4m3", "fp8_e4m3"},
    {"float8_e5m2", "fp8_e5m2"},
    {"e5m2", "fp8_e5m2"},
};

int tk_ops__dtype_parse_any(tk_dtype *out, const char *name)
{
    for (size_t i = 0; name && i < sizeof aliases / sizeof *aliases; i++)
        if (!strcasecmp(name, aliases[i].alias))
            return tk_ops__dtype_parse(out, aliases[i].name);
    for (size_t i = 0; name && i < NDTYPES; i++) /* "F32", "BF16" */
        if (!strcasecmp(name, dtypes[i].name))
            return tk_ops__dtype_parse(out, dtypes[i].name);
    return tk__err(TK_ERR_INVALID,
                   "unknown dtype '%s'\nHINT: use one of f32, f16, bf16, f64, i8, u8, i32, i64, fp8_e4m3, fp8_e5m2 "
                   "(or float32, float16/fp16/half, bfloat16, float64, int8, uint8, int32, int64, float8_e4m3fn, "
                   "float8_e5m2)",
                   name ? name : "(null)");
}

size_t tk_ops__dtype_size(tk_dtype dt) { return tk_ops__dtype_bit(dt) ? dt.bits / 8u : 0; }

/* ---- conversions (common/convert.h, the one copy) ---------------------------------------------- */

float tk_ops__f16_to_f32(uint16_t h) { return tk__f16_to_f32(h); }
uint16_t tk_ops__f32_to_f16(float f) { return tk__f32_to_f16(f); }
float tk_ops__bf16_to_f32(uint16_t h) { return tk__bf16_to_f32(h); }
uint16_t tk_ops__f32_to_bf16(float f) { return tk__f32_to_bf16(f); }
float tk_ops__fp8_e4m3_to_f32(uint8_t c) { return tk__fp8_e4m3_to_f32(c); }
uint8_t tk_ops__f32_to_fp8_e4m3(float f) { return tk__f32_to_fp8_e4m3(f); }
float tk_ops__fp8_e5m2_to_f32(uint8_t c) { return tk__fp8_e5m2_to_f32(c); }
uint8_t tk_ops__f32_to_fp8_e5m2(float f) { return tk__f32_to_fp8_e5m2(f); }

int8_t tk_ops__f32_to_i8(float f)
{
    if (isnan(f))
        return 0;
    float r = nearbyintf(f);
    return (int8_t)(r > 127.0f ? 127 : r < -127.0f ? -127 : r);
}

/* ---- strided loads and stores ----------------------------------------------------------------- */

void tk_ops__load_f32(float *dst, const void *base, int64_t off, int64_t stride, int64_t n, tk_dtype dt)
{
    if (dt.bits == 8) {
        const uint8_t *p = (const uint8_t *)base + off;
        for (int64_t i = 0; i < n; i++) {
            uint8_t c = p[i * stride];
            dst[i] = dt.code == TK_DL_FLOAT8_E4M3FN ? tk_ops__fp8_e4m3_to_f32(c)
                     : dt.code == TK_DL_FLOAT8_E5M2 ? tk_ops__fp8_e5m2_to_f32(c)
                     : dt.code == TK_DL_INT         ? (float)(int8_t)c
                                                    : (float)c;
        }
        return;
    }
    if (dt.bits == 32) {
        const float *p = (const float *)base + off;
        if (stride == 1)
            memcpy(dst, p, (size_t)n * sizeof(float));
        else
            for (int64_t i = 0; i < n; i++)
                dst[i] = p[i * stride];
    } else if (dt.code == TK_DL_BFLOAT) {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = tk__bf16_to_f32(p[i * stride]);
    } else {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = tk__f16_to_f32(p[i * stride]);
    }
}

void tk_ops__store_f32(void *base, int64_t off, int64_t stride, const float *src, int64_t n, tk_dtype dt)
{
    if (dt.bits == 8) {
        uint8_t *p = (uint8_t *)base + off;
        for (int64_t i = 0; i < n; i++) {
            float v = src[i];
            p[i * stride] = dt.code == TK_DL_FLOAT8_E4M3FN ? tk_ops__f32_to_fp8_e4m3(v)
                            : dt.code == TK_DL_FLOAT8_E5M2 ? tk_ops__f32_to_fp8_e5m2(v)
                            : dt.code == TK_DL_INT         ? (uint8_t)tk_ops__f32_to_i8(v)
                                                           : (uint8_t)(isnan(v)  ? 0
                                                                       : v < 0   ? 0
                                                                       : v > 255 ? 255
                                                                                 : nearbyintf(v));
        }
        return;
    }
    if (dt.bits == 32) {
        float *p = (float *)base + off;
        if (stride == 1)
            memcpy(p, src, (size_t)n * sizeof(float));
        else
            for (int64_t i = 0; i < n; i++)
                p[i * stride] = src[i];
    } else if (dt.code == TK_DL_BFLOAT) {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i * stride] = tk__f32_to_bf16(src[i]);
    } else {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i * stride] = tk__f32_to_f16(src[i]);
    }
}
