/*
 * convert.h — the one set of float conversions tk has: IEEE half, bfloat16 and OCP fp8 (e4m3fn,
 * e5m2) to and from fp32. The CPU references (ops/dtype.c), the checkpoint loader
 * (models/safetensors.c) and the public tk_convert (common/convert.c, which `tk run-op` uses) all
 * call these, so a value reads and writes the same bits wherever it passes.
 *
 * The conversions work on the bits (no compiler _Float16 or hardware F16C needed) and round to
 * nearest even, as __float2half_rn and __float2bfloat16_rn do on the GPU, so a CPU reference and a
 * kernel that compute the same fp32 value store the same bits. Widening is exact; a NaN keeps its
 * payload's top bits (narrowing forces it quiet). The half and bfloat16 ones are inline: the CPU
 * references call them once per element.
 */
#ifndef TK_COMMON_CONVERT_H
#define TK_COMMON_CONVERT_H

#include <stdint.h>
#include <string.h>

static inline uint32_t tk__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float tk__bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float tk__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0) {
        if (man == 0)
            return tk__bits_f32(sign);
        /* subnormal: man * 2^-24; normalise so the leading one lands on bit 10 */
        int e = -1;
        do {
            e++;
            man <<= 1;
        } while (!(man & 0x400u));
        return tk__bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13));
    }
    if (exp == 31)
        return tk__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, or NaN with its payload */
    return tk__bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static inline uint16_t tk__f32_to_f16(float f)
{
    uint32_t x = tk__f32_bits(f);
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

static inline float tk__bf16_to_f32(uint16_t h) { return tk__bits_f32((uint32_t)h << 16); }

static inline uint16_t tk__f32_to_bf16(float f)
{
    uint32_t x = tk__f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);          /* round to nearest even; overflow carries to inf */
    return (uint16_t)(x >> 16);
}

/* OCP fp8 <-> fp32: e4m3fn (max 448, no inf, S.1111.111 is NaN) and e5m2 (max 57344, IEEE-like).
 * Narrowing rounds to nearest even, saturating to the largest finite value (as
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN stays NaN. */
float tk__fp8_e4m3_to_f32(uint8_t c);
uint8_t tk__f32_to_fp8_e4m3(float f);
float tk__fp8_e5m2_to_f32(uint8_t c);
uint8_t tk__f32_to_fp8_e5m2(float f);

#endif
