/*
 * test_convert.c — the one float converter (common/convert.h, tk_convert) over every f16 and bf16
 * bit pattern and every fp8 code, against an oracle computed here in double from the formats'
 * definitions (sign, exponent, mantissa; ldexp): widening must give the exact value, narrowing the
 * nearest value with ties to the even code, at every midpoint between two neighbours and just
 * either side of it, with overflow to inf (f16, bf16) or saturation (fp8).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "common/convert.h"
#include "harness.h"
#include "tk.h"

static const tk_dtype F32 = {TK_DL_FLOAT, 32, 1}, F64 = {TK_DL_FLOAT, 64, 1}, F16 = {TK_DL_FLOAT, 16, 1},
                      BF16 = {TK_DL_BFLOAT, 16, 1}, E4M3 = {TK_DL_FLOAT8_E4M3FN, 8, 1},
                      E5M2 = {TK_DL_FLOAT8_E5M2, 8, 1};

/* The value of a code of an IEEE-like format with ebits exponent and mbits mantissa bits (bias
 * 2^(ebits-1) - 1). e4m3fn: no inf, only S.1111.111 is NaN. */
static double decode(uint32_t code, int ebits, int mbits, int fn)
{
    int sign = (code >> (ebits + mbits)) & 1;
    uint32_t e = (code >> mbits) & ((1u << ebits) - 1), m = code & ((1u << mbits) - 1);
    int bias = (1 << (ebits - 1)) - 1;
    double v;
    if (fn ? (e == (1u << ebits) - 1 && m == (1u << mbits) - 1) : e == (1u << ebits) - 1)
        v = (fn || m) ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp((double)(m | (1u << mbits)), (int)e - bias - mbits);
    return sign ? -v : v;
}

static int same(double a, double b) { return (isnan(a) && isnan(b)) || (a == b && signbit(a) == signbit(b)); }

/* Every 16-bit pattern widens to its exact value; a narrowing of that value gives the pattern back
 * (NaN: a NaN); the midpoint to the next pattern up rounds to the even one of the two and a value a
 * hair either side to the nearer. */
static void check_16(int ebits, int mbits, float (*widen)(uint16_t), uint16_t (*narrow)(float), tk_dtype dt)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536 && bad < 8; h++) {
        double want = decode(h, ebits, mbits, 0);
        float got = widen((uint16_t)h);
        if (!same(got, want)) {
            fprintf(stderr, "  %s %04x widens to %.9g, want %.17g\n", tk_dtype_name(dt), h, got, want);
            bad++;
            continue;
        }
        uint16_t back = narrow(got);
        if (isnan(want) ? !isnan(decode(back, ebits, mbits, 0)) : back != h) {
            fprintf(stderr, "  %s %04x -> %.9g -> %04x\n", tk_dtype_name(dt), h, got, back);
            bad++;
        }
        uint32_t up = h + 1;
        double next = decode(up, ebits, mbits, 0);
        if (isnan(want) || isinf(want) || isnan(next) || isinf(next) || signbit(want) != signbit(next))
            continue;
        /* the midpoint is exact in f32 (one more mantissa bit), the hairs are the f32 neighbours; the
         * largest finite value has no midpoint to inf (test_overflow_and_nan) */
        float mid = (float)((want + next) / 2);
        float lo = nextafterf(mid, (float)want), hi = nextafterf(mid, (float)next);
        uint16_t even = (h & 1) ? (uint16_t)up : (uint16_t)h;
        uint16_t rm = narrow(mid), rl = narrow(lo), rh = narrow(hi);
        if (rm != even || rl != h || rh != up) {
            fprintf(stderr, "  %s between %04x and %04x: mid -> %04x (want %04x), below -> %04x, above -> %04x\n",
                    tk_dtype_name(dt), h, up, rm, even, rl, rh);
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_f16_all_patterns(void) { check_16(5, 10, tk__f16_to_f32, tk__f32_to_f16, F16); }
static void test_bf16_all_patterns(void) { check_16(8, 7, tk__bf16_to_f32, tk__f32_to_bf16, BF16); }

static void test_overflow_and_nan(void)
{
    CHECK_EQ_INT(tk__f32_to_f16(65504.0f), 0x7bff);
    CHECK_EQ_INT(tk__f32_to_f16(65519.99f), 0x7bff);
    CHECK_EQ_INT(tk__f32_to_f16(65520.0f), 0x7c00); /* the midpoint to 2^16 rounds to inf */
    CHECK_EQ_INT(tk__f32_to_f16(-1e10f), 0xfc00);
    CHECK_EQ_INT(tk__f32_to_f16(1e-8f), 0x0000);    /* under half the smallest subnormal */
    CHECK_EQ_INT(tk__f32_to_f16(-3e-8f), 0x8001);   /* over it */
    CHECK_EQ_INT(tk__f32_to_bf16(3.4e38f), 0x7f80); /* rounds past the largest bf16 to inf */
    CHECK((tk__f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (tk__f32_to_f16(NAN) & 0x3ff));
    CHECK((tk__f32_to_bf16(NAN) & 0x7f80) == 0x7f80 && (tk__f32_to_bf16(NAN) & 0x7f));
    /* a NaN keeps its payload's top bits on the way up (no double in between) */
    CHECK_EQ_INT(tk__f32_bits(tk__f16_to_f32(0x7c01)), 0x7f802000);
}

/* Every fp8 code decodes to its value; the value encodes back; past the largest finite value it
 * saturates; midpoints round to even. */
static void check_fp8(int ebits, int fn, float (*widen)(uint8_t), uint8_t (*narrow)(float), double maxv)
{
    int mbits = 7 - ebits, bad = 0;
    for (uint32_t c = 0; c < 256; c++) {
        double want = decode(c, ebits, mbits, fn);
        float got = widen((uint8_t)c);
        if (!same(got, want) || (!isnan(want) && !isinf(want) && narrow(got) != c)) {
            fprintf(stderr, "  fp8 e%dm%d %02x widens to %.9g (want %.9g), narrows to %02x\n", ebits, mbits, c, got,
                    want, narrow(got));
            bad++;
        }
        double next = decode(c + 1, ebits, mbits, fn);
        if ((c & 0x7f) == 0x7f || isnan(want) || isinf(want) || isnan(next) || isinf(next) || c == 0x7f)
            continue;
        uint8_t even = (c & 1) ? (uint8_t)(c + 1) : (uint8_t)c;
        if (narrow((float)((want + next) / 2)) != even) {
            fprintf(stderr, "  fp8 e%dm%d midpoint %02x..%02x -> %02x\n", ebits, mbits, c, c + 1,
                    narrow((float)((want + next) / 2)));
            bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(widen(narrow((float)(maxv * 4))) == (float)maxv);
    CHECK(widen(narrow(INFINITY)) == (float)maxv);
    CHECK(widen(narrow(-INFINITY)) == (float)-maxv);
    CHECK(isnan(widen(narrow(NAN))));
}

static void test_fp8_e4m3(void) { check_fp8(4, 1, tk__fp8_e4m3_to_f32, tk__f32_to_fp8_e4m3, 448.0); }
static void test_fp8_e5m2(void) { check_fp8(5, 0, tk__fp8_e5m2_to_f32, tk__f32_to_fp8_e5m2, 57344.0); }

/* The public call gives the same bits as the internal one, for every dtype pair. */
static void test_tk_convert(void)
{
    static uint16_t h[65536], back[65536];
    static float f[65536];
    static double d[65536];
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    const tk_dtype halves[2] = {F16, BF16};
    for (int k = 0; k < 2; k++) {
        CHECK_RC(tk_convert(f, F32, h, halves[k], 65536), TK_OK);
        CHECK_RC(tk_convert(d, F64, h, halves[k], 65536), TK_OK);
        int bad = 0;
        for (uint32_t i = 0; i < 65536; i++) {
            float want = k ? tk__bf16_to_f32(h[i]) : tk__f16_to_f32(h[i]);
            bad += tk__f32_bits(f[i]) != tk__f32_bits(want) || !same(d[i], want);
        }
        CHECK_EQ_INT(bad, 0);
        CHECK_RC(tk_convert(back, halves[k], f, F32, 65536), TK_OK);
        bad = 0;
        for (uint32_t i = 0; i < 65536; i++)
            bad += back[i] != (k ? tk__f32_to_bf16(f[i]) : tk__f32_to_f16(f[i]));
        CHECK_EQ_INT(bad, 0);
    }
    uint8_t c[4] = {0};
    float in[4] = {1.0f, -2.5f, 1000.0f, 0.0f}, out[4];
    CHECK_RC(tk_convert(c, E4M3, in, F32, 4), TK_OK);
    CHECK_RC(tk_convert(out, F32, c, E4M3, 4), TK_OK);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && out[2] == 448.0f && out[3] == 0.0f);
    CHECK_RC(tk_convert(c, E5M2, in, F32, 4), TK_OK);
    CHECK_RC(tk_convert(out, F32, c, E5M2, 4), TK_OK);
    CHECK(out[0] == 1.0f && out[1] == -2.5f && out[2] == 1024.0f && out[3] == 0.0f);
    const tk_dtype i32 = {TK_DL_INT, 32, 1};
    CHECK_RC(tk_convert(out, F32, c, i32, 4), TK_ERR_INVALID);
    CHECK(strstr(tk_last_error(), "cannot convert") != NULL);
    CHECK_RC(tk_convert(NULL, F32, c, E5M2, 4), TK_ERR_INVALID);
    CHECK_RC(tk_convert(NULL, F32, NULL, E5M2, 0), TK_OK);
}

int main(void)
{
    RUN(test_f16_all_patterns);
    RUN(test_bf16_all_patterns);
    RUN(test_overflow_and_nan);
    RUN(test_fp8_e4m3);
    RUN(test_fp8_e5m2);
    RUN(test_tk_convert);
    return th_done();
}
