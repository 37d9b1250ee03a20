/*
 * test_ops_moe.c — the moe op's CPU reference (ops/moe.c):
 *   - against transformers' own MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock and Qwen3MoeSparseMoeBlock
 *     (tests/moe_oracle.py) on random weights in f32 and bf16: the chosen experts exactly, the routing
 *     weights and the output; and on routers full of exact ties, where torch.topk's order decides;
 *   - against a float64 reference written here (token by token, not grouped) with every option:
 *     router_input, expert_scale, gelu_tanh / gelu, the shared expert with and without its gate;
 *   - the validation: shapes, top_k, activation, a shared expert half given.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "op_test.h"
#include "tensor_util.h"
#include "ops/ops.h"

static tk_arg T(const char *name, tk_tensor *t) { return (tk_arg){TK_ARG_TENSOR, name, t, 0, 0}; }
static tk_arg I(const char *name, int64_t v) { return (tk_arg){TK_ARG_I64, name, NULL, v, 0}; }

/* ---- against transformers ---------------------------------------------------------------------- */

typedef struct {
    char name[32];
    int64_t n;
    double *v;
} otensor;

static const otensor *ofind(const otensor *ts, int nt, const char *name)
{
    for (int i = 0; i < nt; i++)
        if (!strcmp(ts[i].name, name))
            return &ts[i];
    return NULL;
}

static void to_host(host_t *h, tk_dtype dt, int ndim, const int64_t *shape, const otensor *o)
{
    host_new(h, dt, ndim, shape, 0);
    CHECK(o && o->n == numel(&h->t));
    for (int64_t i = 0; o && i < o->n && i < numel(&h->t); i++)
        set(&h->t, i, o->v[i]);
}

/* One oracle case: run the op with the routing outputs and compare. 1 when it matches. */
static int oracle_case(const char *label, tk_dtype dt, int64_t Tn, int64_t H, int64_t E, int64_t K, int64_t Ii,
                       int64_t Is, int norm, int rnd, const otensor *ts, int nt)
{
    int64_t th[2] = {Tn, H}, eh[2] = {E, H}, egu[3] = {E, 2 * Ii, H}, edn[3] = {E, H, Ii}, tk2[2] = {Tn, K},
            sgu[2] = {2 * Is, H}, sdn[2] = {H, Is}, g1[2] = {1, H};
    host_t x, rw, gu, dn, sg, sd, sgt, out, ids, wts;
    to_host(&x, dt, 2, th, ofind(ts, nt, "input"));
    to_host(&rw, dt, 2, eh, ofind(ts, nt, "router_weight"));
    to_host(&gu, dt, 3, egu, ofind(ts, nt, "gate_up"));
    to_host(&dn, dt, 3, edn, ofind(ts, nt, "down"));
    host_new(&out, dt, 2, th, 0);
    host_new(&ids, I32, 2, tk2, 0);
    host_new(&wts, F32, 2, tk2, 0);
    tk_arg a[15] = {T("out", &out.t),          T("input", &x.t),        T("router_weight", &rw.t),
                    T("gate_up", &gu.t),       T("down", &dn.t),        I("top_k", K),
                    I("norm_topk_prob", norm), I("round_weights", rnd), T("topk_ids", &ids.t),
                    T("topk_weights", &wts.t)};
    size_t na = 10;
    if (Is) {
        to_host(&sg, dt, 2, sgu, ofind(ts, nt, "shared_gate_up"));
        to_host(&sd, dt, 2, sdn, ofind(ts, nt, "shared_down"));
        to_host(&sgt, dt, 2, g1, ofind(ts, nt, "shared_gate"));
        a[na++] = T("shared_gate_up", &sg.t);
        a[na++] = T("shared_down", &sd.t);
        a[na++] = T("shared_gate", &sgt.t);
    }
    int rc = op_run_cpu("moe", a, na);
    if (rc != TK_OK)
        fprintf(stderr, "  %s: %s\n", label, tk_last_error());
    int ok = rc == TK_OK;
    const otensor *ro = ofind(ts, nt, "out"), *ri = ofind(ts, nt, "ids"), *rwt = ofind(ts, nt, "weights");
    ok &= ro && ri && rwt && ro->n == Tn * H && ri->n == Tn * K && rwt->n == Tn * K;
    int64_t bad_ids = 0;
    for (int64_t i = 0; ok && i < Tn * K; i++)
        if (((int32_t *)ids.t.data)[i] != (int32_t)ri->v[i]) {
            if (!bad_ids++)
                fprintf(stderr, "  %s: token %lld slot %lld: expert %d, transformers chose %d\n", label,
                        (long long)(i / K), (long long)(i % K), ((int32_t *)ids.t.data)[i], (int)ri->v[i]);
        }
    ok &= bad_ids == 0;
    if (ok) {
        /* the logits' sums run in another order (OpenBLAS vs torch) and torch's exp is vectorised: a few
         * f32 steps of the logits, times the probability; bf16: a rounded weight may land one step off */
        op_cmp c = op_cmp_begin(0, 0, "moe %s topk_weights vs transformers", label);
        for (int64_t i = 0; i < Tn * K; i++)
            op_cmp_tol(&c, i, ((float *)wts.t.data)[i], rwt->v[i],
                       1e-5 * (1 + fabs(rwt->v[i])) + (dt.bits == 32 ? 0 : ldexp(1, -8) * fabs(rwt->v[i])));
        ok &= op_cmp_end(&c);
        /* f32: accumulation order only. bf16: transformers adds the experts' outputs in bf16 one after
         * another (index_add_), tk in f32 then rounds once: a few bf16 steps of the largest term. */
        double amax = 0;
        for (int64_t i = 0; i < Tn * H; i++)
            amax = fabs(ro->v[i]) > amax ? fabs(ro->v[i]) : amax;
        op_cmp c2 = op_cmp_begin(0, 0, "moe %s out vs transformers", label);
        c2.cols = H;
        for (int64_t i = 0; i < Tn * H; i++)
            op_cmp_tol(&c2, i, get(&out.t, i), ro->v[i],
                       dt.bits == 32 ? 1e-5 * (1 + fabs(ro->v[i])) : ldexp(1, -6) * (amax + fabs(ro->v[i])));
        ok &= op_cmp_end(&c2);
    }
    host_free(&x);
    host_free(&rw);
    host_free(&gu);
    host_free(&dn);
    host_free(&out);
    host_free(&ids);
    host_free(&wts);
    if (Is) {
        host_free(&sg);
        host_free(&sd);
        host_free(&sgt);
    }
    return ok;
}

static void test_vs_transformers(void)
{
    const char *venv = th_py_venv();
    char py[1024], cmd[2300];
    snprintf(py, sizeof py, "%s/bin/python", venv);
    snprintf(cmd, sizeof cmd,
             "'%s' -c 'import importlib.util as u, sys; sys.exit(u.find_spec(\"transformers\") is None)' 2>/dev/null",
             py);
    if (system(cmd) != 0) {
        if (getenv("CI") && *getenv("CI")) {
            fprintf(stderr, "  %s cannot import transformers (scripts/setup.sh --test installs it)\n", py);
            CHECK(0);
            return;
        }
        SKIP("no transformers venv; run scripts/setup.sh --test or set TK_PY_VENV");
    }
    snprintf(cmd, sizeof cmd, "'%s' tests/moe_oracle.py %llu 2>/dev/null", py, (unsigned long long)(seed % 1000003));
    FILE *f = popen(cmd, "r");
    CHECK(f != NULL);
    if (!f)
        return;
    size_t cap = 1 << 22;
    char *line = malloc(cap);
    otensor ts[16];
    int nt = 0, cases = 0, in_case = 0;
    char label[64] = "", dts[8] = "";
    long long Tn = 0, H = 0, E = 0, K = 0, Ii = 0, Is = 0;
    int norm = 0, rnd = 0;
    while (fgets(line, (int)cap, f)) {
        if (!strncmp(line, "case ", 5)) {
            CHECK(sscanf(line + 5, "%63s %7s %lld %lld %lld %lld %lld %lld %d %d", label, dts, &Tn, &H, &E, &K, &Ii,
                         &Is, &norm, &rnd) == 10);
            nt = 0;
            in_case = 1;
        } else if (!strncmp(line, "t ", 2) && in_case && nt < 16) {
            char *s = line + 2, *end;
            size_t n = strcspn(s, " ");
            snprintf(ts[nt].name, sizeof ts[nt].name, "%.*s", (int)n, s);
            ts[nt].n = strtoll(s + n, &end, 10);
            ts[nt].v = malloc(sizeof(double) * (size_t)(ts[nt].n > 0 ? ts[nt].n : 1));
            for (int64_t i = 0; i < ts[nt].n; i++)
                ts[nt].v[i] = strtod(end, &end);
            nt++;
        } else if (!strncmp(line, "end", 3) && in_case) {
            tk_dtype dt = strcmp(dts, "bf16") ? F32 : BF16;
            int ok = oracle_case(label, dt, Tn, H, E, K, Ii, Is, norm, rnd, ts, nt);
            if (!ok)
                fprintf(stderr, "  case %s differs from transformers\n", label);
            CHECK(ok);
            for (int i = 0; i < nt; i++)
                free(ts[i].v);
            nt = 0;
            in_case = 0;
            cases++;
        }
    }
    free(line);
    CHECK(pclose(f) == 0);
    CHECK_EQ_INT(cases, 12);
}

/* ---- against float64 ---------------------------------------------------------------------------- */

static double act64(int act, double x)
{
    if (act == 1)
        return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    if (act == 2)
        return 0.5 * x * (1 + erf(x / sqrt(2)));
    return x / (1 + exp(-x));
}

/* y [H] = down(act(gate x) * (up x)) in float64, gu [2I, H] at gu0, down [H, I] at dn0 (flat indices) */
static void mlp64(double *y, const tk_tensor *x, int64_t t, const tk_tensor *gu, int64_t gu0, const tk_tensor *dn,
                  int64_t dn0, int64_t H, int64_t Ii, int act)
{
    double *a = malloc(sizeof(double) * (size_t)Ii);
    for (int64_t i = 0; i < Ii; i++) {
        double g = 0, u = 0;
        for (int64_t h = 0; h < H; h++) {
            g += get(gu, gu0 + i * H + h) * get(x, t * H + h);
            u += get(gu, gu0 + (Ii + i) * H + h) * get(x, t * H + h);
        }
        a[i] = act64(act, g) * u;
    }
    for (int64_t h = 0; h < H; h++) {
        double s = 0;
        for (int64_t i = 0; i < Ii; i++)
            s += get(dn, dn0 + h * Ii + i) * a[i];
        y[h] = s;
    }
    free(a);
}

static void test_vs_f64(void)
{
    static const int64_t sz[][6] = {
        {1, 16, 4, 1, 8, 0}, {17, 40, 8, 2, 24, 12}, {6, 33, 5, 5, 7, 9}}; /* T H E K I Is */
    int ok = 1;
    for (size_t z = 0; z < 3; z++)
        for (int v = 0; v < 4; v++) {
            int64_t Tn = sz[z][0], H = sz[z][1], E = sz[z][2], K = sz[z][3], Ii = sz[z][4], Is = v >= 2 ? sz[z][5] : 0;
            int act = v % 3, norm = v != 1, gated = v == 2, use_rin = v == 1 || v == 3, use_scale = v == 1;
            int64_t th[2] = {Tn, H}, eh[2] = {E, H}, egu[3] = {E, 2 * Ii, H}, edn[3] = {E, H, Ii}, e1[1] = {E},
                    sgu[2] = {2 * (Is ? Is : 1), H}, sdn[2] = {H, Is ? Is : 1}, g1[2] = {1, H};
            host_t x, rin, rw, gu, dn, sc, sg, sd, sgt, out;
            host_new(&x, F32, 2, th, 0);
            host_new(&rin, F32, 2, th, 0);
            host_new(&rw, F32, 2, eh, 0);
            host_new(&gu, F32, 3, egu, 0);
            host_new(&dn, F32, 3, edn, 0);
            host_new(&sc, F32, 1, e1, 0);
            host_new(&sg, F32, 2, sgu, 0);
            host_new(&sd, F32, 2, sdn, 0);
            host_new(&sgt, F32, 2, g1, 0);
            host_new(&out, F32, 2, th, 0);
            fill(&x, 1);
            fill(&rin, 1);
            fill(&rw, 2);
            fill(&gu, 0.5);
            fill(&dn, 0.5);
            fill(&sg, 0.5);
            fill(&sd, 0.5);
            fill(&sgt, 1);
            for (int64_t e = 0; e < E; e++)
                set(&sc.t, e, uniform(0.5, 1.5));
            tk_arg a[16] = {T("out", &out.t), T("input", &x.t), T("router_weight", &rw.t), T("gate_up", &gu.t),
                            T("down", &dn.t), I("top_k", K),    I("norm_topk_prob", norm), I("activation", act)};
            size_t na = 8;
            if (use_rin)
                a[na++] = T("router_input", &rin.t);
            if (use_scale)
                a[na++] = T("expert_scale", &sc.t);
            if (Is) {
                a[na++] = T("shared_gate_up", &sg.t);
                a[na++] = T("shared_down", &sd.t);
                if (gated)
                    a[na++] = T("shared_gate", &sgt.t);
            }
            int rc = op_run_cpu("moe", a, na);
            if (rc != TK_OK)
                fprintf(stderr, "  %s\n", tk_last_error());
            ok &= rc == TK_OK;
            op_cmp c =
                op_cmp_begin(0, 0, "moe f32 T %lld H %lld E %lld K %lld I %lld Is %lld variant %d vs float64",
                             (long long)Tn, (long long)H, (long long)E, (long long)K, (long long)Ii, (long long)Is, v);
            c.cols = H;
            c.nan_fails = c.inf_fails = 1;
            double *p = malloc(sizeof(double) * (size_t)E), *y = malloc(sizeof(double) * (size_t)H),
                   *acc = malloc(sizeof(double) * (size_t)H);
            int *used = malloc(sizeof(int) * (size_t)E);
            const tk_tensor *r = use_rin ? &rin.t : &x.t;
            for (int64_t t = 0; rc == TK_OK && t < Tn; t++) {
                double mx = -INFINITY, sum = 0, ksum = 0;
                for (int64_t e = 0; e < E; e++) {
                    double l = 0;
                    for (int64_t h = 0; h < H; h++)
                        l += get(r, t * H + h) * get(&rw.t, e * H + h);
                    p[e] = l;
                    mx = l > mx ? l : mx;
                }
                for (int64_t e = 0; e < E; e++)
                    sum += p[e] = exp(p[e] - mx);
                for (int64_t e = 0; e < E; e++) {
                    p[e] /= sum;
                    used[e] = 0;
                }
                int64_t chosen[8];
                for (int64_t j = 0; j < K; j++) { /* random weights: no ties */
                    int64_t best = -1;
                    for (int64_t e = 0; e < E; e++)
                        if (!used[e] && (best < 0 || p[e] > p[best]))
                            best = e;
                    used[best] = 1;
                    chosen[j] = best;
                    ksum += p[best];
                }
                memset(acc, 0, sizeof(double) * (size_t)H);
                for (int64_t j = 0; j < K; j++) {
                    int64_t e = chosen[j];
                    double w = norm ? p[e] / ksum : p[e];
                    if (use_scale)
                        w *= get(&sc.t, e);
                    mlp64(y, &x.t, t, &gu.t, e * 2 * Ii * H, &dn.t, e * H * Ii, H, Ii, act);
                    for (int64_t h = 0; h < H; h++)
                        acc[h] += w * y[h];
                }
                if (Is) {
                    mlp64(y, &x.t, t, &sg.t, 0, &sd.t, 0, H, Is, act);
                    double g = 1;
                    if (gated) {
                        double s = 0;
                        for (int64_t h = 0; h < H; h++)
                            s += get(&sgt.t, h) * get(&x.t, t * H + h);
                        g = 1 / (1 + exp(-s));
                    }
                    for (int64_t h = 0; h < H; h++)
                        acc[h] += g * y[h];
                }
                for (int64_t h = 0; h < H; h++)
                    op_cmp_tol(&c, t * H + h, get(&out.t, t * H + h), acc[h], 2e-5 * (1 + fabs(acc[h])));
            }
            ok &= rc == TK_OK && op_cmp_end(&c);
            free(p);
            free(y);
            free(acc);
            free(used);
            host_t *hs[] = {&x, &rin, &rw, &gu, &dn, &sc, &sg, &sd, &sgt, &out};
            for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
                host_free(hs[i]);
        }
    CHECK(ok);
}

/* bf16 and f16 run too, and round where the unfused layers round (their outputs equal f32's within
 * the dtype's steps). */
static void test_half_dtypes(void)
{
    int64_t th[2] = {5, 24}, eh[2] = {4, 24}, egu[3] = {4, 16, 24}, edn[3] = {4, 24, 8};
    const tk_dtype *dts[2] = {&BF16, &F16};
    for (int d = 0; d < 2; d++) {
        host_t x[2], rw[2], gu[2], dn[2], out[2];
        for (int k = 0; k < 2; k++) {
            tk_dtype dt = k ? *dts[d] : F32;
            host_new(&x[k], dt, 2, th, 0);
            host_new(&rw[k], dt, 2, eh, 0);
            host_new(&gu[k], dt, 3, egu, 0);
            host_new(&dn[k], dt, 3, edn, 0);
            host_new(&out[k], dt, 2, th, 0);
        }
        fill(&x[1], 1);
        fill(&rw[1], 3);
        fill(&gu[1], 0.5);
        fill(&dn[1], 0.5);
        for (int64_t i = 0; i < 5 * 24; i++)
            set(&x[0].t, i, get(&x[1].t, i));
        for (int64_t i = 0; i < 4 * 24; i++)
            set(&rw[0].t, i, get(&rw[1].t, i));
        for (int64_t i = 0; i < 4 * 16 * 24; i++)
            set(&gu[0].t, i, get(&gu[1].t, i));
        for (int64_t i = 0; i < 4 * 24 * 8; i++)
            set(&dn[0].t, i, get(&dn[1].t, i));
        for (int k = 0; k < 2; k++) {
            tk_arg a[] = {T("out", &out[k].t),    T("input", &x[k].t), T("router_weight", &rw[k].t),
                          T("gate_up", &gu[k].t), T("down", &dn[k].t), I("top_k", 2)};
            CHECK_RC(op_run_cpu("moe", a, 6), TK_OK);
        }
        op_cmp c = op_cmp_begin(0, 0, "moe %s vs f32 on the same values", tk_ops__dtype_str(*dts[d]));
        double step = dts[d]->code == TK_DL_BFLOAT ? ldexp(1, -8) : ldexp(1, -11);
        for (int64_t i = 0; i < 5 * 24; i++) {
            double r = get(&out[0].t, i);
            op_cmp_tol(&c, i, get(&out[1].t, i), r, 16 * step * (1 + fabs(r)));
        }
        CHECK(op_cmp_end(&c));
        for (int k = 0; k < 2; k++) {
            host_free(&x[k]);
            host_free(&rw[k]);
            host_free(&gu[k]);
            host_free(&dn[k]);
            host_free(&out[k]);
        }
    }
}

static void test_validation(void)
{
    int64_t th[2] = {3, 8}, eh[2] = {4, 8}, egu[3] = {4, 6, 8}, edn[3] = {4, 8, 3}, edn2[3] = {4, 8, 4},
            egu_odd[3] = {4, 5, 8}, sgu[2] = {4, 8}, tk3[2] = {3, 3};
    host_t x, rw, gu, dn, dn2, gu_odd, sg, out, ids;
    host_new(&x, F32, 2, th, 0);
    host_new(&rw, F32, 2, eh, 0);
    host_new(&gu, F32, 3, egu, 0);
    host_new(&dn, F32, 3, edn, 0);
    host_new(&dn2, F32, 3, edn2, 0);
    host_new(&gu_odd, F32, 3, egu_odd, 0);
    host_new(&sg, F32, 2, sgu, 0);
    host_new(&out, F32, 2, th, 0);
    host_new(&ids, I32, 2, tk3, 0);
    tk_arg base[] = {T("out", &out.t),    T("input", &x.t), T("router_weight", &rw.t),
                     T("gate_up", &gu.t), T("down", &dn.t), I("top_k", 2)};
    CHECK_RC(op_run_cpu("moe", base, 6), TK_OK);
    base[5] = I("top_k", 5);
    CHECK_RC(op_run_cpu("moe", base, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "moe: 'top_k' is 5, want 1 to 4 (the number of experts)");
    base[5] = I("top_k", 0);
    CHECK_RC(op_run_cpu("moe", base, 6), TK_ERR_INVALID);
    base[5] = I("top_k", 2);
    base[4] = T("down", &dn2.t);
    CHECK_RC(op_run_cpu("moe", base, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "moe: 'down' has shape [4, 8, 4], want [4, 8, 3]");
    base[4] = T("down", &dn.t);
    base[3] = T("gate_up", &gu_odd.t);
    CHECK_RC(op_run_cpu("moe", base, 6), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "an even middle dimension");
    base[3] = T("gate_up", &gu.t);
    tk_arg act[] = {T("out", &out.t), T("input", &x.t), T("router_weight", &rw.t), T("gate_up", &gu.t),
                    T("down", &dn.t), I("top_k", 2),    I("activation", 3)};
    CHECK_RC(op_run_cpu("moe", act, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'activation' is 3");
    tk_arg half[] = {T("out", &out.t), T("input", &x.t), T("router_weight", &rw.t), T("gate_up", &gu.t),
                     T("down", &dn.t), I("top_k", 2),    T("shared_gate_up", &sg.t)};
    CHECK_RC(op_run_cpu("moe", half, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'shared_gate_up' given without 'shared_down'");
    tk_arg badids[] = {T("out", &out.t), T("input", &x.t), T("router_weight", &rw.t), T("gate_up", &gu.t),
                       T("down", &dn.t), I("top_k", 2),    T("topk_ids", &ids.t)};
    CHECK_RC(op_run_cpu("moe", badids, 7), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "'topk_ids' has shape [3, 3], want [3, 2]");
    host_t *hs[] = {&x, &rw, &gu, &dn, &dn2, &gu_odd, &sg, &out, &ids};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++)
        host_free(hs[i]);
}

int main(void)
{
    op_test_seed();
    RUN(test_validation);
    RUN(test_vs_f64);
    RUN(test_half_dtypes);
    RUN(test_vs_transformers);
    return th_done();
}
