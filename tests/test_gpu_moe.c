/*
 * test_gpu_moe.c — kernels-community/moe against tk's CPU reference of the moe op (ops/moe.c), which
 * test_ops_moe checks against transformers: the same random inputs on both sides, in f32, f16 and
 * bf16, over Mixtral's routing (renormalised), Qwen2-MoE's (rounded weights, the gated shared expert,
 * a tile boundary: 37 tokens), DiffusionGemma's (router_input, expert_scale, gelu_tanh), and a router
 * full of exact ties (the chosen experts must be the same ones). The chosen experts (topk_ids) must
 * equal the reference's exactly; the output is compared with a tolerance of a few steps of the dtype.
 * Skips without a device (TK_TEST_GPU=1 makes that a failure).
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

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }

enum { H_X, H_RIN, H_RW, H_GU, H_DN, H_SC, H_SGU, H_SDN, H_SG, H_OUT, H_IDS, H_WTS, H_N };
static const char *const names[H_N] = {"input",       "router_input", "router_weight",  "gate_up",
                                       "down",        "expert_scale", "shared_gate_up", "shared_down",
                                       "shared_gate", "out",          "topk_ids",       "topk_weights"};

/* variant 0 Mixtral, 1 Qwen2-MoE with the shared expert, 2 DiffusionGemma's options, 3 ties */
static int moe_case(tk_dtype dt, int v, int64_t Tn, int64_t H, int64_t E, int64_t K, int64_t Ii)
{
    int64_t Is = v == 1 ? Ii + 8 : 0;
    int64_t sh[H_N][3] = {{Tn, H},          {Tn, H}, {E, H},  {E, 2 * Ii, H}, {E, H, Ii}, {E}, {2 * (Is ? Is : 1), H},
                          {H, Is ? Is : 1}, {1, H},  {Tn, H}, {Tn, K},        {Tn, K}};
    static const int nd[H_N] = {2, 2, 2, 3, 3, 1, 2, 2, 2, 2, 2, 2};
    int use[H_N] = {1, v == 2, 1, 1, 1, v == 2, v == 1, v == 1, v == 1, 1, 1, 1};
    host_t h[H_N], got[3];
    dev_tensor d[H_N];
    memset(d, 0, sizeof d);
    for (int i = 0; i < H_N; i++) {
        tk_dtype t = i == H_IDS ? I32 : i == H_WTS ? F32 : dt;
        host_new(&h[i], t, nd[i], sh[i], 0);
    }
    for (int k = 0; k < 3; k++)
        host_new(&got[k], k == 0 ? dt : k == 1 ? I32 : F32, 2, sh[H_OUT + k], 0);
    fill(&h[H_X], 1);
    fill(&h[H_RIN], 1);
    fill(&h[H_RW], 2);
    fill(&h[H_GU], 0.5);
    fill(&h[H_DN], 0.5);
    fill(&h[H_SGU], 0.5);
    fill(&h[H_SDN], 0.5);
    fill(&h[H_SG], 1);
    for (int64_t e = 0; e < E; e++)
        set(&h[H_SC].t, e, uniform(0.5, 1.5));
    if (v == 3) /* a few exact levels: many equal logits */
        for (int64_t i = 0; i < Tn * H; i++)
            set(&h[H_X].t, i, (double)(next_u64() % 2));
    if (v == 3)
        for (int64_t i = 0; i < E * H; i++)
            set(&h[H_RW].t, i, 0.25 * (double)(next_u64() % 3));
    tk_arg ca[20], ga[20];
    size_t n = 0;
    int ok = 1;
    for (int i = 0; i < H_N; i++) {
        if (!use[i])
            continue;
        ok &= dev_upload(&d[i], &h[i].t) == TK_OK;
        ca[n] = T(names[i], &h[i].t);
        ga[n++] = T(names[i], &d[i].t);
    }
    tk_arg sc[4] = {I("top_k", K), I("norm_topk_prob", v != 1), I("round_weights", v == 1),
                    I("activation", v == 2 ? 1 : 0)};
    for (int i = 0; i < 4; i++) {
        ca[n] = sc[i];
        ga[n++] = sc[i];
    }
    CHECK_RC(gpu_op_run(g.ctx, "moe", ca, n, NULL, NULL), TK_OK);
    const char *impl = NULL;
    ok &= ok && gpu_op_run(g.ctx, "moe", ga, n, NULL, &impl) == TK_OK;
    ok &= impl && strstr(impl, "kernels-community/moe:moe_") == impl;
    for (int k = 0; ok && k < 3; k++)
        ok &= dev_download(&d[H_OUT + k], &got[k].t) == TK_OK;
    int64_t bad = 0;
    for (int64_t i = 0; ok && i < Tn * K; i++)
        bad += ((int32_t *)got[1].t.data)[i] != ((int32_t *)h[H_IDS].t.data)[i];
    if (bad)
        fprintf(stderr, "  moe %s variant %d: %lld routing choices differ from the CPU reference\n", tk_dtype_name(dt),
                v, (long long)bad);
    ok &= bad == 0;
    double step = dt.bits == 32 ? ldexp(1, -20) : dt.code == TK_DL_BFLOAT ? ldexp(1, -7) : ldexp(1, -10);
    op_cmp c =
        op_cmp_begin(0, 0, "moe %s variant %d T %lld H %lld E %lld K %lld I %lld, cuda against cpu", tk_dtype_name(dt),
                     v, (long long)Tn, (long long)H, (long long)E, (long long)K, (long long)Ii);
    c.cols = H;
    c.nan_fails = c.inf_fails = 1;
    /* f32: the output's own rounding is negligible against that of the two dot products (lengths H and
     * I, summed in another order on the GPU), which grows like their square root: on the H200, T 23 H 96
     * I 40 differed by 8.5e-6 at |r| 0.31 (rel 2.7e-5), above 4 steps, while a wrong expert or weight
     * is off by O(|r|). 16-bit outputs: the output's rounding dominates. */
    double depth = dt.bits == 32 ? sqrt((double)(H + Ii)) : 1.0;
    for (int64_t i = 0; ok && i < Tn * H; i++) {
        double r = get(&h[H_OUT].t, i);
        op_cmp_tol(&c, i, get(&got[0].t, i), r, 4 * step * depth * (1 + fabs(r)));
    }
    op_cmp c2 = op_cmp_begin(0, 0, "moe %s variant %d topk_weights", tk_dtype_name(dt), v);
    for (int64_t i = 0; ok && i < Tn * K; i++) {
        double r = ((float *)h[H_WTS].t.data)[i];
        op_cmp_tol(&c2, i, ((float *)got[2].t.data)[i], r, 1e-6 * (1 + fabs(r)));
    }
    ok = ok && op_cmp_end(&c) && op_cmp_end(&c2);
    for (int i = 0; i < H_N; i++) {
        if (use[i])
            dev_free(&d[i]);
        host_free(&h[i]);
    }
    for (int k = 0; k < 3; k++)
        host_free(&got[k]);
    return ok;
}

static void test_moe(void)
{
    if (!gpu_device())
        SKIP("no CUDA device");
    const char *pkgs[] = {"kernels-community/moe", NULL};
    CHECK_RC(gpu_ctx_new(&g, pkgs), TK_OK);
    const tk_dtype dts[] = {F32, F16, BF16};
    int ok = 1;
    for (size_t k = 0; k < 3; k++) {
        ok &= moe_case(dts[k], 0, 1, 64, 8, 2, 48);
        ok &= moe_case(dts[k], 0, 23, 96, 8, 2, 40);
        ok &= moe_case(dts[k], 1, 37, 64, 60, 4, 24);
        ok &= moe_case(dts[k], 2, 17, 48, 16, 3, 32);
        ok &= moe_case(dts[k], 3, 20, 16, 128, 8, 8);
    }
    CHECK(ok);
    gpu_ctx_free(&g);
}

static void test_coverage(void)
{
    const char *pkgs[] = {"kernels-community/moe", NULL};
    gpu_coverage_check(pkgs);
}

int main(int argc, char **argv)
{
    static const char *const ops[] = {"moe", NULL};
    gpu_main(argc, argv, ops);
    op_test_seed();
    RUN(test_moe);
    RUN(test_coverage);
    return th_done();
}
