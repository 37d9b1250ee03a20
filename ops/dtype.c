/*
 * dtype.c — dtype names, IEEE half / bfloat16 conversions and strided float loads and stores for the
 * CPU references.
 *
 * The conversions work on the bits (no compiler _Float16 or hardware F16C needed) and round to
 * nearest even, as __float2half_rn and __float2bfloat16_rn do on the GPU, so a CPU reference and a
 * kernel that compute the same fp32 value store the same bits.
 */
#include <math.h>
#include <string.h>
#include <strings.h>

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
    {"float32", "f32"},  {"fp32", "f32"},   {"float", "f32"},        {"float16", "f16"},
    {"fp16", "f16"},     {"half", "f16"},   {"bfloat16", "bf16"},    {"float64", "f64"},
    {"fp64", "f64"},     {"double", "f64"}, {"int32", "i32"},        {"int64", "i64"},
    {"int8", "i8"},      {"uint8", "u8"},   {"float8_e4m3fn", "fp8_e4m3"}, {"float8_e4m3", "fp8_e4m3"},
    {"e4m3", "fp8_e4m3"}, {"float8_e5m2", "fp8_e5m2"}, {"e5m2", "fp8_e5m2"},
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

/* ---- conversions ------------------------------------------------------------------------------ */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

float tk_ops__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return bits_f32(sign);
        /* subnormal: man * 2^-24; normalise so the leading one lands on bit 10 */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        return bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, or NaN with its payload */
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t tk_ops__f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf (65504 is the largest half) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a subnormal half, round(|f| * 2^24) */
        uint32_t e = ax >> 23;
        if (e < 102) /* |f| < 2^-25: rounds to zero */
            return sign;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t s = 126 - e; /* 14 .. 24 */
        uint32_t r = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r); /* r == 0x400 is the smallest normal, as it should be */
    }
    uint32_t h = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right answer */
    return (uint16_t)(sign | h);
}

float tk_ops__bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

uint16_t tk_ops__f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);          /* round to nearest even; overflow carries to inf */
    return (uint16_t)(x >> 16);
}

/* ---- strided loads and stores ----------------------------------------------------------------- */

/* ---- fp8 (OCP e4m3fn and e5m2) and int8 ------------------------------------------------------- */

/* The encoding of one fp8 format: mantissa bits, exponent bias, the largest finite code. */
typedef struct {
    int mbits, bias;
    uint8_t maxcode; /* 0x7e (448) for e4m3fn, 0x7b (57344) for e5m2 */
    int ieee;        /* 1: the top exponent is inf/NaN (e5m2); 0: only S.1111.111 is NaN (e4m3fn) */
} fp8_fmt;

static const fp8_fmt E4M3 = {3, 7, 0x7e, 0}, E5M2 = {2, 15, 0x7b, 1};

static float fp8_to_f32(uint8_t c, const fp8_fmt *f)
{
    float sign = (c & 0x80) ? -1.0f : 1.0f;
    int e = (c & 0x7f) >> f->mbits, m = c & ((1 << f->mbits) - 1);
    int emax = 0x7f >> f->mbits;
    if (f->ieee ? e == emax : (c & 0x7f) == 0x7f)
        return (f->ieee && m == 0) ? sign * INFINITY : NAN;
    if (e == 0)
        return sign * ldexpf((float)m, 1 - f->bias - f->mbits);
    return sign * ldexpf(1.0f + (float)m / (float)(1 << f->mbits), e - f->bias);
}

/* Round to nearest even, saturating to the largest finite value (as __NV_SATFINITE); NaN stays NaN. */
static uint8_t f32_to_fp8(float x, const fp8_fmt *f)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    if (isnan(x))
        return (uint8_t)(sign | (f->ieee ? 0x7f : 0x7f));
    double a = fabs((double)x);
    if (isinf(x))
        return (uint8_t)(sign | f->maxcode);
    int code;
    int emin = 1 - f->bias; /* the exponent of the smallest normal */
    if (a < ldexp(1.0, emin)) {
        code = (int)nearbyint(a / ldexp(1.0, emin - f->mbits)); /* subnormal; may round up to the min normal */
    } else {
        int k;
        frexp(a, &k);
        int e = k - 1;                              /* a = mant * 2^e, mant in [1, 2) */
        double q = nearbyint((a / ldexp(1.0, e) - 1.0) * (1 << f->mbits));
        if (q >= (1 << f->mbits)) {
            q = 0;
            e++;
        }
        int field = e + f->bias;
        code = field > (0x7f >> f->mbits) ? 0x7f : (field << f->mbits) | (int)q;
    }
    if (code > f->maxcode)
        code = f->maxcode;
    return (uint8_t)(sign | code);
}

float tk_ops__fp8_e4m3_to_f32(uint8_t c) { return fp8_to_f32(c, &E4M3); }
uint8_t tk_ops__f32_to_fp8_e4m3(float f) { return f32_to_fp8(f, &E4M3); }
float tk_ops__fp8_e5m2_to_f32(uint8_t c) { return fp8_to_f32(c, &E5M2); }
uint8_t tk_ops__f32_to_fp8_e5m2(float f) { return f32_to_fp8(f, &E5M2); }

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
            dst[i] = tk_ops__bf16_to_f32(p[i * stride]);
    } else {
        const uint16_t *p = (const uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = tk_ops__f16_to_f32(p[i * stride]);
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
                                                           : (uint8_t)(isnan(v) ? 0 : v < 0 ? 0 : v > 255 ? 255 : nearbyintf(v));
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
            p[i * stride] = tk_ops__f32_to_bf16(src[i]);
    } else {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t i = 0; i < n; i++)
            p[i * stride] = tk_ops__f32_to_f16(src[i]);
    }
}
