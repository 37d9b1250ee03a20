/*
 * convert.c — OCP fp8 conversions (convert.h) and the public tk_convert over every float dtype tk
 * stores: f32, f64, f16, bf16, fp8_e4m3, fp8_e5m2.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "common/convert.h"

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
        return (uint8_t)(sign | 0x7f);
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
        int e = k - 1; /* a = mant * 2^e, mant in [1, 2) */
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

float tk__fp8_e4m3_to_f32(uint8_t c) { return fp8_to_f32(c, &E4M3); }
uint8_t tk__f32_to_fp8_e4m3(float f) { return f32_to_fp8(f, &E4M3); }
float tk__fp8_e5m2_to_f32(uint8_t c) { return fp8_to_f32(c, &E5M2); }
uint8_t tk__f32_to_fp8_e5m2(float f) { return f32_to_fp8(f, &E5M2); }

/* ---- tk_convert -------------------------------------------------------------------------------- */

enum { CV_F32, CV_F64, CV_F16, CV_BF16, CV_E4M3, CV_E5M2, CV_NONE };

static int kind(tk_dtype dt)
{
    if (dt.lanes != 1)
        return CV_NONE;
    if (dt.code == TK_DL_FLOAT)
        return dt.bits == 32 ? CV_F32 : dt.bits == 64 ? CV_F64 : dt.bits == 16 ? CV_F16 : CV_NONE;
    if (dt.code == TK_DL_BFLOAT && dt.bits == 16)
        return CV_BF16;
    if (dt.code == TK_DL_FLOAT8_E4M3FN && dt.bits == 8)
        return CV_E4M3;
    if (dt.code == TK_DL_FLOAT8_E5M2 && dt.bits == 8)
        return CV_E5M2;
    return CV_NONE;
}

static const char *kind_name(int k)
{
    static const char *const names[] = {"f32", "f64", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"};
    return k < CV_NONE ? names[k] : "a dtype it does not take";
}

/* Element i of src (not f64) as a float: exact, and a NaN keeps its bits (no double in between). */
static float loadf(const unsigned char *p, size_t i, int k)
{
    float f;
    uint16_t h;
    switch (k) {
    case CV_F32: memcpy(&f, p + 4 * i, 4); return f;
    case CV_F16: memcpy(&h, p + 2 * i, 2); return tk__f16_to_f32(h);
    case CV_BF16: memcpy(&h, p + 2 * i, 2); return tk__bf16_to_f32(h);
    case CV_E4M3: return tk__fp8_e4m3_to_f32(p[i]);
    default: return tk__fp8_e5m2_to_f32(p[i]);
    }
}

static void storef(unsigned char *p, size_t i, int k, float f)
{
    uint16_t h;
    switch (k) {
    case CV_F32: memcpy(p + 4 * i, &f, 4); break;
    case CV_F16:
        h = tk__f32_to_f16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    case CV_BF16:
        h = tk__f32_to_bf16(f);
        memcpy(p + 2 * i, &h, 2);
        break;
    case CV_E4M3: p[i] = tk__f32_to_fp8_e4m3(f); break;
    default: p[i] = tk__f32_to_fp8_e5m2(f); break;
    }
}

TK_API int tk_convert(void *dst, tk_dtype dst_dtype, const void *src, tk_dtype src_dtype, size_t n)
{
    int to = kind(dst_dtype), from = kind(src_dtype);
    if (to == CV_NONE || from == CV_NONE)
        return tk__err(TK_ERR_INVALID,
                       "tk_convert: cannot convert %s to %s\nHINT: tk_convert takes f32, f64, f16, bf16, fp8_e4m3 "
                       "and fp8_e5m2",
                       kind_name(from), kind_name(to));
    if (n && (!dst || !src))
        return tk__err(TK_ERR_INVALID, "tk_convert: NULL %s", dst ? "src" : "dst");
    unsigned char *d = dst;
    const unsigned char *s = src;
    double v;
    float f;
    for (size_t i = 0; i < n; i++) {
        if (from == CV_F64 && to == CV_F64) {
            memcpy(d + 8 * i, s + 8 * i, 8);
        } else if (from == CV_F64) { /* narrowing from f64 goes through f32 */
            memcpy(&v, s + 8 * i, 8);
            storef(d, i, to, (float)v);
        } else if (to == CV_F64) {
            v = loadf(s, i, from);
            memcpy(d + 8 * i, &v, 8);
        } else {
            f = loadf(s, i, from);
            storef(d, i, to, f);
        }
    }
    return TK_OK;
}
