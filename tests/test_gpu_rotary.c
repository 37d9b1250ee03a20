/*
 * test_gpu_rotary.c — kernels-community/rotary on a GPU against the CPU references (ops/rotary.c,
 * themselves checked against float64 in test_ops_rotary.c): every op and dtype through tk_op_run on
 * CUDA tensors, so the dispatch, the JIT compile, the module load and the launch rules all run.
 * Shapes cover the vectorised paths (head_size and rot_dim/2 multiples of 8) and the scalar ones,
 * NeoX and GPT-J, partial rotary, GQA, one token, [B, S] positions, every cache scaling. Skips without
 * a CUDA device.
 *
 * Tolerances: rotary_embedding computes exactly the CPU's fp32 operations (no contraction), so every
 * dtype must match the reference to the last bit, but for nothing; the tables are double on both
 * sides, and CUDA's pow/sincos may differ from glibc's in the last double bit, which can move an f32
 * result by one ulp and an f16/bf16 one by one unit of the last place.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"

static gpu_ctx g;

/* The largest |got - ref| allowed: `ulps` units in the last place of the dtype at magnitude `mag`. */
static double tol_ulps(tk_dtype dt, double mag, double ulps)
{
    double eps = dt.bits == 32 ? 0x1p-23 : dt.code == TK_DL_BFLOAT ? 0x1p-7 : 0x1p-10;
    return ulps * eps * mag;
}

static int check_out(const char *what, const host_t *got, const host_t *ref, double worst_tol)
{
    cmp_t c = compare_tensors(&got->t, &ref->t);
    int ok = cmp_ok(&c, tol_rel(ref->t.dtype), worst_tol);
    if (!ok)
        cmp_print(what, &c);
    return ok;
}

/* ---- rotary_embedding ------------------------------------------------------------------------- */

static void rope_case(tk_dtype dt, tk_dtype cdt, int pn, const int64_t *ps, int64_t hq, int64_t hkv, int64_t d,
                      int64_t rot, int64_t max_pos, int neox, int bad_pos)
{
    int64_t qs[5], ks[5], cs[2] = {max_pos, rot}, ntok = 1, half = rot / 2;
    for (int i = 0; i < pn; i++) {
        qs[i] = ks[i] = ps[i];
        ntok *= ps[i];
    }
    qs[pn] = hq;
    ks[pn] = hkv;
    qs[pn + 1] = ks[pn + 1] = d;
    host_t pos, q, k, cache, gq, gk;
    host_new(&pos, I64, pn, ps, 0);
    host_new(&q, dt, pn + 2, qs, 0);
    host_new(&k, dt, pn + 2, ks, 0);
    host_new(&gq, dt, pn + 2, qs, 0);
    host_new(&gk, dt, pn + 2, ks, 0);
    host_new(&cache, cdt, 2, cs, 0);
    for (int64_t t = 0; t < ntok; t++)
        ((int64_t *)pos.buf)[t] = (int64_t)(next_u64() % (uint64_t)max_pos);
    for (int64_t p = 0; p < max_pos; p++)
        for (int64_t i = 0; i < half; i++) {
            double a = uniform(-3.14159, 3.14159);
            set(&cache.t, p * rot + i, cos(a));
            set(&cache.t, p * rot + half + i, sin(a));
        }
    fill_range(&q, -4, 4);
    fill_range(&k, -4, 4);

    dev_tensor dpos, dq, dk, dcache;
    CHECK_RC(dev_upload(&dq, &q.t), TK_OK);
    CHECK_RC(dev_upload(&dk, &k.t), TK_OK);
    CHECK_RC(dev_upload(&dcache, &cache.t), TK_OK);
    if (bad_pos) { /* the GPU leaves a token with an out-of-range position as it is */
        int64_t *pp = pos.buf;
        pp[ntok - 1] = max_pos;
        CHECK_RC(dev_upload(&dpos, &pos.t), TK_OK);
        pp[ntok - 1] = 0;
        memcpy(gq.buf, q.buf, (size_t)numel(&q.t) * (dt.bits / 8)); /* the reference for the last token */
        memcpy(gk.buf, k.buf, (size_t)numel(&k.t) * (dt.bits / 8));
    } else {
        CHECK_RC(dev_upload(&dpos, &pos.t), TK_OK);
    }

    tk_arg ca[5] = {{TK_ARG_TENSOR, "query", &q.t, 0, 0},
                    {TK_ARG_TENSOR, "key", &k.t, 0, 0},
                    {TK_ARG_TENSOR, "positions", &pos.t, 0, 0},
                    {TK_ARG_TENSOR, "cos_sin_cache", &cache.t, 0, 0},
                    {TK_ARG_I64, "is_neox", NULL, neox, 0}};
    CHECK_RC(gpu_op_run(g.ctx, "rotary_embedding", ca, 5, NULL, NULL), TK_OK);
    if (bad_pos) { /* the last token's rows of the reference: the input unchanged */
        size_t es = dt.bits / 8, qrow = (size_t)(hq * d), krow = (size_t)(hkv * d);
        memcpy((char *)q.buf + (size_t)(ntok - 1) * qrow * es, (char *)gq.buf + (size_t)(ntok - 1) * qrow * es,
               qrow * es);
        memcpy((char *)k.buf + (size_t)(ntok - 1) * krow * es, (char *)gk.buf + (size_t)(ntok - 1) * krow * es,
               krow * es);
    }
    tk_arg da[5] = {{TK_ARG_TENSOR, "query", &dq.t, 0, 0},
                    {TK_ARG_TENSOR, "key", &dk.t, 0, 0},
                    {TK_ARG_TENSOR, "positions", &dpos.t, 0, 0},
                    {TK_ARG_TENSOR, "cos_sin_cache", &dcache.t, 0, 0},
                    {TK_ARG_I64, "is_neox", NULL, neox, 0}};
    const char *impl = NULL;
    CHECK_RC(gpu_op_run(g.ctx, "rotary_embedding", da, 5, NULL, &impl), TK_OK);
    CHECK(impl && strcmp(impl, "cpu-reference") != 0);
    CHECK_RC(dev_download(&dq, &gq.t), TK_OK);
    CHECK_RC(dev_download(&dk, &gk.t), TK_OK);
    char what[192];
    snprintf(what, sizeof what, "rotary_embedding %s cache %s %s q %s k %s rot %lld%s (%s)", tk_dtype_name(dt),
             tk_dtype_name(cdt), neox ? "neox" : "gptj", tk_ops__shape_fmt(pn + 2, qs), tk_ops__shape_fmt(pn + 2, ks),
             (long long)rot, bad_pos ? " bad position" : "", impl ? impl : "?");
    /* the same fp32 operations in the same order: bit-exact */
    CHECK(check_out(what, &gq, &q, 0.0));
    CHECK(check_out(what, &gk, &k, 0.0));
    dev_free(&dpos);
    dev_free(&dq);
    dev_free(&dk);
    dev_free(&dcache);
    free(pos.buf);
    free(q.buf);
    free(k.buf);
    free(gq.buf);
    free(gk.buf);
    free(cache.buf);
}

static void test_rotary_embedding(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    /* {ntok or B, S (0: positions rank 1), Hq, Hkv, d, rot, max_pos} */
    static const int64_t cases[][7] = {
        {1, 0, 32, 8, 128, 128, 4096},  /* one token (decode), Llama GQA, vectorised */
        {300, 0, 32, 8, 128, 128, 4096}, /* prefill */
        {17, 0, 16, 16, 64, 64, 100},    /* MHA */
        {9, 0, 14, 2, 64, 16, 50},       /* partial rotary (rot/2 = 8: vectorised NeoX) */
        {5, 0, 8, 1, 80, 20, 64},        /* partial rotary, scalar NeoX, vectorised GPT-J for f32 */
        {7, 0, 3, 3, 10, 10, 9},         /* odd sizes: scalar */
        {6, 0, 5, 1, 7, 6, 11},          /* odd head_size */
        {2, 33, 8, 2, 256, 256, 128},    /* [B, S] positions, d 256 */
        {3, 0, 128, 128, 576, 64, 512},  /* many heads, MLA-like rope slice */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int64_t *c = cases[ci];
        int64_t ps[2] = {c[0], c[1]};
        int pn = c[1] ? 2 : 1;
        for (size_t di = 0; di < 3; di++) {
            tk_dtype dt = *all_dtypes[di];
            for (int neox = 0; neox < 2; neox++) {
                rope_case(dt, dt, pn, ps, c[2], c[3], c[4], c[5], c[6], neox, 0);
                if (dt.bits == 16)
                    rope_case(dt, F32, pn, ps, c[2], c[3], c[4], c[5], c[6], neox, 0);
            }
        }
    }
    int64_t ps = 4;
    rope_case(BF16, F32, 1, &ps, 8, 2, 64, 64, 32, 1, 1);
    rope_case(F32, F32, 1, &ps, 3, 1, 10, 6, 32, 0, 1);
}

/* ---- the tables ------------------------------------------------------------------------------- */

static void table_case(const char *op, tk_arg *args, size_t nargs, host_t *ref, double worst_tol, const char *what)
{
    host_t got;
    host_new(&got, ref->t.dtype, ref->t.ndim, ref->shape, 0);
    dev_tensor d;
    CHECK_RC(dev_upload(&d, &got.t), TK_OK);
    args[0].t = &ref->t;
    CHECK_RC(gpu_op_run(g.ctx, op, args, nargs, NULL, NULL), TK_OK);
    args[0].t = &d.t;
    const char *impl = NULL;
    CHECK_RC(gpu_op_run(g.ctx, op, args, nargs, NULL, &impl), TK_OK);
    CHECK(impl && strcmp(impl, "cpu-reference") != 0);
    CHECK_RC(dev_download(&d, &got.t), TK_OK);
    char w[256];
    snprintf(w, sizeof w, "%s %s %s (%s)", op, tk_dtype_name(ref->t.dtype), what, impl ? impl : "?");
    CHECK(check_out(w, &got, ref, worst_tol));
    dev_free(&d);
    free(got.buf);
}

static void test_rope_cos_sin_cache(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    /* {scaling, base, factor, original max, seq_len, beta_fast, beta_slow, truncate, attention_factor,
     *  low_freq_factor, high_freq_factor} */
    static const double cfgs[][11] = {
        {0, 10000, 1, 0, 0, 32, 1, 1, 0, 1, 4},       {1, 10000, 4, 0, 0, 32, 1, 1, 0, 1, 4},
        {2, 10000, 2, 2048, 4096, 32, 1, 1, 0, 1, 4}, {2, 1e6, 4, 4096, 0, 32, 1, 1, 0, 1, 4},
        {3, 10000, 4, 4096, 0, 32, 1, 1, 0, 1, 4},    {3, 10000, 40, 4096, 0, 32, 1, 0, 0.7, 1, 4},
        {4, 500000, 8, 8192, 0, 32, 1, 1, 0, 1, 4},   {4, 500000, 32, 8192, 0, 32, 1, 1, 0, 2, 8},
    };
    static const int64_t shapes[][2] = {{1, 2}, {9000, 128}, {33, 64}, {100, 6}, {3, 1030}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t di = 0; di < 3; di++) {
                const double *k = cfgs[c];
                if (k[0] == 2 && shapes[s][1] <= 2)
                    continue;
                host_t ref;
                host_new(&ref, *all_dtypes[di], 2, shapes[s], 0);
                tk_arg a[12] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},
                                {TK_ARG_F64, "base", NULL, 0, k[1]},
                                {TK_ARG_I64, "scaling", NULL, (int64_t)k[0], 0},
                                {TK_ARG_F64, "factor", NULL, 0, k[2]},
                                {TK_ARG_I64, "original_max_position_embeddings", NULL, (int64_t)k[3], 0},
                                {TK_ARG_I64, "seq_len", NULL, (int64_t)k[4], 0},
                                {TK_ARG_F64, "beta_fast", NULL, 0, k[5]},
                                {TK_ARG_F64, "beta_slow", NULL, 0, k[6]},
                                {TK_ARG_I64, "truncate", NULL, (int64_t)k[7], 0},
                                {TK_ARG_F64, "attention_factor", NULL, 0, k[8]},
                                {TK_ARG_F64, "low_freq_factor", NULL, 0, k[9]},
                                {TK_ARG_F64, "high_freq_factor", NULL, 0, k[10]}};
                char what[96];
                snprintf(what, sizeof what, "scaling %d [%lld, %lld]", (int)k[0], (long long)shapes[s][0],
                         (long long)shapes[s][1]);
                /* |values| <= the attention factor (<= 1.37 here): one unit in the last place */
                table_case("rope_cos_sin_cache", a, 12, &ref, tol_ulps(ref.t.dtype, 1.5, 1.01), what);
                free(ref.buf);
            }
}

/* LongRoPE (scaling 5): the factors come as a tensor, host for the CPU call and a device copy for the
 * GPU's; Phi-3.5's shape (96 rotary dims, 4096 original of 131072) and odd ones. */
static void test_rope_longrope(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    static const int64_t shapes[][2] = {{1, 2}, {5000, 96}, {33, 64}, {100, 6}, {3, 1030}};
    static const double cfgs[][4] = {
        {10000, 32, 4096, 0}, {250000, 1.5, 8192, 0}, {10000, 0.5, 2, 0}, {1e6, 8, 64, 1.3}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (size_t di = 0; di < 3; di++) {
                int64_t half = shapes[s][1] / 2;
                host_t ref, ext, got;
                host_new(&ref, *all_dtypes[di], 2, shapes[s], 0);
                host_new(&got, ref.t.dtype, 2, ref.shape, 0);
                host_new(&ext, F32, 1, &half, 0);
                for (int64_t i = 0; i < half; i++)
                    set(&ext.t, i, uniform(1.0, 40.0));
                dev_tensor d, dext;
                CHECK_RC(dev_upload(&d, &got.t), TK_OK);
                CHECK_RC(dev_upload(&dext, &ext.t), TK_OK);
                tk_arg a[13] = {{TK_ARG_TENSOR, "out", &ref.t, 0, 0},
                                {TK_ARG_F64, "base", NULL, 0, cfgs[c][0]},
                                {TK_ARG_I64, "scaling", NULL, 5, 0},
                                {TK_ARG_F64, "factor", NULL, 0, cfgs[c][1]},
                                {TK_ARG_I64, "original_max_position_embeddings", NULL, (int64_t)cfgs[c][2], 0},
                                {TK_ARG_I64, "seq_len", NULL, 0, 0},
                                {TK_ARG_F64, "beta_fast", NULL, 0, 32},
                                {TK_ARG_F64, "beta_slow", NULL, 0, 1},
                                {TK_ARG_I64, "truncate", NULL, 1, 0},
                                {TK_ARG_F64, "attention_factor", NULL, 0, cfgs[c][3]},
                                {TK_ARG_F64, "low_freq_factor", NULL, 0, 1},
                                {TK_ARG_F64, "high_freq_factor", NULL, 0, 4},
                                {TK_ARG_TENSOR, "ext_factors", &ext.t, 0, 0}};
                CHECK_RC(gpu_op_run(g.ctx, "rope_cos_sin_cache", a, 13, NULL, NULL), TK_OK);
                a[0].t = &d.t;
                a[12].t = &dext.t;
                const char *impl = NULL;
                CHECK_RC(gpu_op_run(g.ctx, "rope_cos_sin_cache", a, 13, NULL, &impl), TK_OK);
                CHECK(impl && strcmp(impl, "cpu-reference") != 0);
                CHECK_RC(dev_download(&d, &got.t), TK_OK);
                char w[128];
                snprintf(w, sizeof w, "rope_cos_sin_cache %s longrope [%lld, %lld] (%s)", tk_dtype_name(ref.t.dtype),
                         (long long)shapes[s][0], (long long)shapes[s][1], impl ? impl : "?");
                /* |values| <= the attention factor (<= 1.3 here): one unit in the last place */
                CHECK(check_out(w, &got, &ref, tol_ulps(ref.t.dtype, 1.5, 1.01)));
                dev_free(&d);
                dev_free(&dext);
                free(got.buf);
                free(ref.buf);
                free(ext.buf);
            }
}

static void test_alibi(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const int64_t heads[] = {1, 8, 12, 33, 64, 300};
    for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
        host_t ref;
        host_new(&ref, F32, 1, &heads[i], 0);
        tk_arg a[2] = {{TK_ARG_TENSOR, "out", NULL, 0, 0}, {TK_ARG_F64, "max_bias", NULL, 0, i == 5 ? 4.0 : 8.0}};
        char what[32];
        snprintf(what, sizeof what, "%lld heads", (long long)heads[i]);
        table_case("alibi_slopes", a, 2, &ref, tol_ulps(F32, 1, 1.01), what);
        free(ref.buf);
    }
    static const int64_t shapes[][3] = {{1, 1, 1}, {8, 1, 4096}, {12, 128, 128}, {3, 7, 13}, {16, 100, 256}, {2, 5, 3}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t di = 0; di < 3; di++) {
            host_t ref, sl;
            host_new(&ref, *all_dtypes[di], 3, shapes[s], 0);
            host_new(&sl, F32, 1, &shapes[s][0], 0);
            for (int64_t h = 0; h < shapes[s][0]; h++)
                set(&sl.t, h, uniform(0.001, 1));
            dev_tensor dsl;
            CHECK_RC(dev_upload(&dsl, &sl.t), TK_OK);
            /* the CPU call takes the host slopes, the GPU call the device copy */
            tk_arg a[2] = {{TK_ARG_TENSOR, "out", NULL, 0, 0}, {TK_ARG_TENSOR, "slopes", &sl.t, 0, 0}};
            host_t got;
            host_new(&got, ref.t.dtype, 3, ref.shape, 0);
            dev_tensor d;
            CHECK_RC(dev_upload(&d, &got.t), TK_OK);
            a[0].t = &ref.t;
            CHECK_RC(gpu_op_run(g.ctx, "alibi_bias", a, 2, NULL, NULL), TK_OK);
            a[0].t = &d.t;
            a[1].t = &dsl.t;
            const char *impl = NULL;
            CHECK_RC(gpu_op_run(g.ctx, "alibi_bias", a, 2, NULL, &impl), TK_OK);
            CHECK(impl && strcmp(impl, "cpu-reference") != 0);
            CHECK_RC(dev_download(&d, &got.t), TK_OK);
            char what[96];
            snprintf(what, sizeof what, "alibi_bias %s %s", tk_dtype_name(ref.t.dtype),
                     tk_ops__shape_fmt(3, ref.shape));
            CHECK(check_out(what, &got, &ref, 0.0)); /* the same fp32 product, the same rounding */
            dev_free(&d);
            dev_free(&dsl);
            free(got.buf);
            free(ref.buf);
            free(sl.buf);
        }
}

static void test_sinusoidal(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    static const int64_t shapes[][2] = {{1, 1}, {7, 5}, {2048, 512}, {100, 1031}, {4096, 768}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t di = 0; di < 3; di++) {
            host_t ref;
            host_new(&ref, *all_dtypes[di], 2, shapes[s], 0);
            tk_arg a[3] = {{TK_ARG_TENSOR, "out", NULL, 0, 0},
                           {TK_ARG_F64, "base", NULL, 0, 10000.0},
                           {TK_ARG_I64, "offset", NULL, s == 3 ? 5000 : 0, 0}};
            char what[64];
            snprintf(what, sizeof what, "%s", tk_ops__shape_fmt(2, shapes[s]));
            table_case("sinusoidal_position_encoding", a, 3, &ref, tol_ulps(ref.t.dtype, 1, 1.01), what);
            free(ref.buf);
        }
}

static void test_setup(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/rotary", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/rotary", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {
        "rotary_embedding", "rope_cos_sin_cache", "alibi_bias", "sinusoidal_position_encoding", "alibi_slopes", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_setup);
    RUN(test_rotary_embedding);
    RUN(test_rope_cos_sin_cache);
    RUN(test_rope_longrope);
    RUN(test_alibi);
    RUN(test_sinusoidal);
    if (g.ctx)
        gpu_ctx_free(&g);
    RUN(test_coverage);
    return th_done();
}
