/*
 * cpu_dispatch.c — which CPU implementation runs a host call: the CPU's features (cpuid and xgetbv,
 * read once), TK_CPU_IMPL, the table of fast implementations (the tables of ops/cpu_*.c, fastest
 * first) and the pick: the first entry for the op that the CPU can run and that fits the call, else
 * the op's reference.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

/* ---- features ----------------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
static uint64_t xgetbv0(void)
{
    uint32_t lo, hi;
    __asm__ __volatile__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static unsigned detect(void)
{
    unsigned a, b, c, d, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return 0;
    uint64_t xcr0 = xgetbv0();
    if ((xcr0 & 6) != 6) /* the OS saves XMM and YMM */
        return 0;
    unsigned maxleaf = __get_cpuid_max(0, NULL);
    unsigned b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (maxleaf >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        unsigned sub = a;
        if (sub >= 1) {
            __cpuid_count(7, 1, a71, b, c, d);
        }
    }
    if ((b7 >> 5) & 1)
        f |= TK_CPU_AVX2;
    if (fma)
        f |= TK_CPU_FMA;
    if (f16c)
        f |= TK_CPU_F16C;
    if ((a71 >> 4) & 1)
        f |= TK_CPU_AVXVNNI;
    /* AVX-512: F, DQ, BW and VL together, and the OS saves opmask and ZMM state */
    int zmm = (xcr0 & 0xe0) == 0xe0;
    unsigned need512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);
    if (zmm && (b7 & need512) == need512) {
        f |= TK_CPU_AVX512F;
        if ((c7 >> 11) & 1)
            f |= TK_CPU_AVX512VNNI;
        if ((a71 >> 5) & 1)
            f |= TK_CPU_AVX512BF16;
    }
    /* AMX: TILE (edx bit 24), BF16 (22), INT8 (25), and the OS manages the tile state (XCR0 bits 17,
     * 18). Linux still wants a process to ask before it touches the tiles (arch_prctl
     * ARCH_REQ_XCOMP_PERM): an AMX kernel asks on first use, detection does not. */
    unsigned amx = (1u << 22) | (1u << 24) | (1u << 25);
    if ((d7 & amx) == amx && (xcr0 & 0x60000) == 0x60000)
        f |= TK_CPU_AMX;
    return f;
}
#elif defined(__aarch64__)
static unsigned detect(void) { return TK_CPU_NEON; }
#else
static unsigned detect(void) { return 0; }
#endif

static unsigned features;
static int mode, act_quant;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void)
{
    features = detect();
    const char *off = getenv("TK_CPU_AVX512"); /* 0: as if the CPU had no AVX-512 (A/B runs, a suspect unit) */
    if (off && !strcmp(off, "0"))
        features &= ~(unsigned)(TK_CPU_AVX512F | TK_CPU_AVX512BF16 | TK_CPU_AVX512VNNI);
    const char *m = getenv("TK_CPU_IMPL");
    mode = !m                        ? TK_CPU_MODE_AUTO
           : !strcmp(m, "reference") ? TK_CPU_MODE_REFERENCE
           : !strcmp(m, "portable")  ? TK_CPU_MODE_PORTABLE
                                     : TK_CPU_MODE_AUTO;
    const char *q = getenv("TK_CPU_Q8");
    act_quant = q && !strcmp(q, "1");
}

int tk_ops__cpu_act_quant(void)
{
    pthread_once(&once, init);
    return act_quant;
}

void tk_ops__cpu_set_act_quant(int on)
{
    pthread_once(&once, init);
    act_quant = on != 0;
}

unsigned tk_ops__cpu_features(void)
{
    pthread_once(&once, init);
    return features;
}

int tk_ops__cpu_mode(void)
{
    pthread_once(&once, init);
    return mode;
}

const char *tk_ops__cpu_feature_str(unsigned bit)
{
    switch (bit) {
    case TK_CPU_AVX2: return "avx2";
    case TK_CPU_FMA: return "fma";
    case TK_CPU_F16C: return "f16c";
    case TK_CPU_AVX512F: return "avx512";
    case TK_CPU_AVX512BF16: return "avx512_bf16";
    case TK_CPU_AVX512VNNI: return "avx512_vnni";
    case TK_CPU_AVXVNNI: return "avx_vnni";
    case TK_CPU_AMX: return "amx";
    case TK_CPU_NEON: return "neon";
    default: return NULL;
    }
}

/* ---- the table ---------------------------------------------------------------------------------- */

static const struct {
    const tk_cpu_impl *impls;
    const size_t *count;
} tables[] = {
    {tk_ops__cpu_linear_impls, &tk_ops__cpu_linear_count},
    {tk_ops__cpu_attn_impls, &tk_ops__cpu_attn_count},
    {tk_ops__cpu_fused_impls, &tk_ops__cpu_fused_count},
};
#define NTABLES (sizeof tables / sizeof tables[0])

size_t tk_ops__cpu_impl_count(void)
{
    size_t n = 0;
    for (size_t i = 0; i < NTABLES; i++)
        n += *tables[i].count;
    return n;
}

const tk_cpu_impl *tk_ops__cpu_impl_at(size_t i)
{
    for (size_t k = 0; k < NTABLES; k++) {
        if (i < *tables[k].count)
            return &tables[k].impls[i];
        i -= *tables[k].count;
    }
    return NULL;
}

int tk_ops__cpu_impl_usable(const tk_cpu_impl *im)
{
    int m = tk_ops__cpu_mode();
    if (m == TK_CPU_MODE_REFERENCE || (m == TK_CPU_MODE_PORTABLE && im->needs))
        return 0;
    return (im->needs & tk_ops__cpu_features()) == im->needs;
}

/* Per op (by descriptor): the first usable entry's index, so a call scans only its own entries. The
 * standard ops are few and static; a declared op (no CPU reference) never gets here. */
#define MAX_OPS 256
static struct {
    const tk_op_desc *op;
    int first;  /* index of the op's first usable entry, -1: none */
} op_index[MAX_OPS];
static size_t n_index;
static pthread_once_t index_once = PTHREAD_ONCE_INIT;

static void build_index(void)
{
    for (size_t i = 0, n = tk_ops__count(); i < n && n_index < MAX_OPS; i++) {
        const tk_op_desc *op = tk_ops__at(i);
        int first = -1;
        for (size_t k = 0, nk = tk_ops__cpu_impl_count(); k < nk && first < 0; k++) {
            const tk_cpu_impl *im = tk_ops__cpu_impl_at(k);
            if (!strcmp(im->op, op->name) && tk_ops__cpu_impl_usable(im))
                first = (int)k;
        }
        op_index[n_index].op = op;
        op_index[n_index++].first = first;
    }
}

const tk_cpu_impl *tk_ops__cpu_pick(const tk_op_call *c)
{
    if (!c || !c->op || c->device_type != TK_DEV_CPU)
        return NULL;
    pthread_once(&index_once, build_index);
    int first = -1;
    for (size_t i = 0; i < n_index; i++)
        if (op_index[i].op == c->op) {
            first = op_index[i].first;
            break;
        }
    if (first < 0)
        return NULL;
    for (size_t k = (size_t)first, nk = tk_ops__cpu_impl_count(); k < nk; k++) {
        const tk_cpu_impl *im = tk_ops__cpu_impl_at(k);
        if (strcmp(im->op, c->op->name) != 0 || !tk_ops__cpu_impl_usable(im))
            continue;
        if (im->fits(c))
            return im;
    }
    return NULL;
}

int tk_ops__run_cpu_best(const tk_op_call *c, const char **impl)
{
    const tk_cpu_impl *im = tk_ops__cpu_pick(c);
    int rc = im ? im->run(c) : tk_ops__run_cpu(c);
    if (rc == TK_OK && impl)
        *impl = im ? im->impl : TK_CPU_IMPL_REFERENCE;
    return rc;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

int64_t tk_ops__cpu_nrows(const tk_tensor *t)
{
    int64_t n = 1;
    for (int32_t k = 0; k + 1 < t->ndim; k++)
        n *= t->shape[k];
    return n;
}

int tk_ops__cpu_rows(const tk_tensor *t, int64_t *row_stride)
{
    unsigned bit = tk_ops__dtype_bit(t->dtype);
    if (!(bit & TK_OPS_FLOATS) || t->ndim < 1)
        return 0;
    int64_t d = t->shape[t->ndim - 1];
    if (!t->strides) {
        *row_stride = d;
        return 1;
    }
    if (d > 1 && t->strides[t->ndim - 1] != 1)
        return 0;
    /* rows evenly spaced: every leading dim's stride is the next one's times its size (size-1 dims
     * are free) */
    int64_t rs = -1, want = -1;
    for (int32_t k = t->ndim - 2; k >= 0; k--) {
        if (t->shape[k] == 1)
            continue;
        if (rs < 0) {
            rs = t->strides[k];
            want = rs * t->shape[k];
        } else {
            if (t->strides[k] != want)
                return 0;
            want *= t->shape[k];
        }
    }
    if (rs < 0)
        rs = d;
    if (rs < d)
        return 0;
    *row_stride = rs;
    return 1;
}
