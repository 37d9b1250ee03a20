// sim.cc — runs the source of kernels-src/flash-attn/decode_simple.cu on the host (common.cuh here is
// the shim) and compares every case with tk's CPU reference of attention_decode (tk_op_run on host
// tensors): f32/f16/bf16 queries, same-dtype, f16/bf16-under-f32, i8 and fp8 caches, odd head dims up
// to 512, Sq 1/4/16, GQA/MQA, window, softcap, ALiBi, scale, a sequence of 0 keys. Tolerances are those
// of tests/test_gpu_attention.c. Exit 1 on any failure. Build and run with run.sh (several minutes: a
// thread per simulated CUDA thread).
#include "common.cuh"
#include "decode_simple.cu"
#include <thread>
#include <vector>
#include <random>
#include <cstdio>
#include <cstdlib>
#include <string>
extern "C" {
#include "tk.h"
}
thread_local dim3s threadIdx, blockIdx;
dim3s gridDim, blockDim;
std::barrier<> *g_block_bar;
std::barrier<> *g_warp_bar[32];
uint64_t g_shfl[32][32];

static std::mt19937_64 rng(12345);
static double uni(double a, double b) { return a + (b - a) * (double)(rng() >> 11) / 9007199254740992.0; }

struct Args {
    void *out; const void *q, *kc, *vc; const int *bt, *sl; float *lse; const float *ks, *vs, *al;
    float scale; i64 wl; float softcap; int Sq, Hq, Hkv, bs, mb, D, B;
};

template <typename T, typename C> static void launch(const Args &a)
{
    gridDim = {(unsigned)(a.Hq * a.Sq), (unsigned)a.B, 1};
    blockDim = {128, 1, 1};
    for (unsigned by = 0; by < gridDim.y; by++)
        for (unsigned bx = 0; bx < gridDim.x; bx++) {
            std::barrier<> bb(128);
            for (int w = 0; w < 4; w++) g_warp_bar[w] = new std::barrier<>(32);
            g_block_bar = &bb;
            std::vector<std::thread> th;
            for (unsigned t = 0; t < 128; t++)
                th.emplace_back([&, t] {
                    threadIdx = {t, 0, 0};
                    blockIdx = {bx, by, 0};
                    tk_fa::decode_simple<T, C, 512>((T *)a.out, (const T *)a.q, (const C *)a.kc, (const C *)a.vc, a.bt, a.sl,
                                                    a.lse, a.ks, a.vs, a.al, a.scale, a.wl, a.softcap, a.Sq, a.Hq, a.Hkv,
                                                    a.bs, a.mb, a.D);
                });
            for (auto &x : th) x.join();
            for (int w = 0; w < 4; w++) delete g_warp_bar[w];
        }
}

static tk_dtype DT(const char *n) { tk_dtype d; tk_dtype_parse(&d, n); return d; }
static int failures, cases, max_cases = 1 << 30;

static void run_case(const char *qn, const char *cn, int D, int Sq, int bs, int Hq, int Hkv, std::vector<int> lens,
                     bool alibi, i64 wl, float softcap, float scale, tk_ctx *ctx)
{
    if (cases >= max_cases)
        return;
    tk_dtype qd = DT(qn), cd = DT(cn);
    int B = (int)lens.size(), quant = cd.bits == 8;
    int mb = 1, used = 0;
    for (int L : lens) { int nb = (L + bs - 1) / bs; used += nb; mb = std::max(mb, nb + 1); }
    int nblocks = used + 2;
    std::vector<int> perm(nblocks);
    for (int i = 0; i < nblocks; i++) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> bt(B * mb, 0), sl(lens);
    int next = 0;
    for (int s = 0; s < B; s++)
        for (int b = 0; b < mb; b++) bt[s * mb + b] = b * bs < lens[s] ? perm[next++] : 0;
    size_t ce = (size_t)nblocks * bs * Hkv * D, qe = (size_t)B * Sq * Hq * D;
    std::vector<float> kf(ce, NAN), vf(ce, NAN), qf(qe);
    std::vector<unsigned char> kraw(ce * 4), vraw(ce * 4);
    std::vector<unsigned char> k8(ce, 0x7f), v8(ce, 0x7f);
    for (int s = 0; s < B; s++)
        for (int j = 0; j < lens[s]; j++) {
            size_t slot = (size_t)bt[s * mb + j / bs] * bs + j % bs;
            for (size_t e = slot * Hkv * D; e < (slot + 1) * Hkv * D; e++) {
                kf[e] = (float)uni(-2, 2); vf[e] = (float)uni(-2, 2);
                if (cd.code == TK_DL_INT) { k8[e] = (unsigned char)(signed char)((int)(rng() % 255) - 127); v8[e] = (unsigned char)(signed char)((int)(rng() % 255) - 127); }
                else { k8[e] = (unsigned char)((rng() % 72) | (rng() & 1 ? 0x80 : 0)); v8[e] = (unsigned char)((rng() % 72) | (rng() & 1 ? 0x80 : 0)); }
            }
        }
    for (auto &x : qf) x = (float)uni(-1.5, 1.5);
    std::vector<unsigned char> qraw(qe * 4), oraw(qe * 4, 0), oref(qe * 4, 0);
    tk_convert(qraw.data(), qd, qf.data(), DT("f32"), qe);
    if (!quant) { tk_convert(kraw.data(), cd, kf.data(), DT("f32"), ce); tk_convert(vraw.data(), cd, vf.data(), DT("f32"), ce); }
    else { memcpy(kraw.data(), k8.data(), ce); memcpy(vraw.data(), v8.data(), ce); }
    std::vector<float> ks(Hkv), vs(Hkv), al(Hq), lse((size_t)B * Hq * Sq, 7.0f), lref((size_t)B * Hq * Sq, 7.0f);
    for (auto &x : ks) x = (float)(cd.code == TK_DL_INT ? uni(0.01, 0.02) : uni(0.25, 0.5));
    for (auto &x : vs) x = (float)(cd.code == TK_DL_INT ? uni(0.01, 0.02) : uni(0.25, 0.5));
    for (auto &x : al) x = (float)uni(0.02, 0.3);

    // reference
    int64_t sq_[4] = {B, Sq, Hq, D}, sc_[4] = {nblocks, bs, Hkv, D}, sbt[2] = {B, mb}, ssl[1] = {B}, slse[3] = {B, Hq, Sq},
            sks[1] = {Hkv}, sal[1] = {Hq};
    auto T = [](void *d, tk_dtype dt, int nd, int64_t *sh) { tk_tensor t; memset(&t, 0, sizeof t); t.data = d; t.device.device_type = TK_DEV_CPU; t.ndim = nd; t.dtype = dt; t.shape = sh; return t; };
    tk_tensor to = T(oref.data(), qd, 4, sq_), tq = T(qraw.data(), qd, 4, sq_), tk_ = T(kraw.data(), cd, 4, sc_), tv = T(vraw.data(), cd, 4, sc_),
              tbt = T(bt.data(), DT("i32"), 2, sbt), tsl = T(sl.data(), DT("i32"), 1, ssl), tl = T(lref.data(), DT("f32"), 3, slse),
              tks = T(ks.data(), DT("f32"), 1, sks), tvs = T(vs.data(), DT("f32"), 1, sks), tal = T(al.data(), DT("f32"), 1, sal);
    std::vector<tk_arg> args = {{TK_ARG_TENSOR, "out", &to, 0, 0}, {TK_ARG_TENSOR, "q", &tq, 0, 0}, {TK_ARG_TENSOR, "k_cache", &tk_, 0, 0},
                                {TK_ARG_TENSOR, "v_cache", &tv, 0, 0}, {TK_ARG_TENSOR, "block_table", &tbt, 0, 0},
                                {TK_ARG_TENSOR, "seq_lens", &tsl, 0, 0}, {TK_ARG_TENSOR, "lse", &tl, 0, 0},
                                {TK_ARG_I64, "window_left", NULL, wl, 0}, {TK_ARG_F64, "softcap", NULL, 0, softcap},
                                {TK_ARG_F64, "scale", NULL, 0, scale}};
    if (quant) { args.push_back({TK_ARG_TENSOR, "k_scale", &tks, 0, 0}); args.push_back({TK_ARG_TENSOR, "v_scale", &tvs, 0, 0}); }
    if (alibi) args.push_back({TK_ARG_TENSOR, "alibi_slopes", &tal, 0, 0});
    if (tk_op_run(ctx, "attention_decode", args.data(), args.size(), NULL, NULL) != TK_OK) {
        printf("reference failed: %s\n", tk_last_error()); failures++; return;
    }
    Args a = {oraw.data(), qraw.data(), kraw.data(), vraw.data(), bt.data(), sl.data(), lse.data(), quant ? ks.data() : nullptr,
              quant ? vs.data() : nullptr, alibi ? al.data() : nullptr, scale, wl, softcap, Sq, Hq, Hkv, bs, mb, D, B};
    std::string q(qn), c(cn);
    if (q == "f32" && c == "f32") launch<float, float>(a);
    else if (q == "f16" && c == "f16") launch<__half, __half>(a);
    else if (q == "bf16" && c == "bf16") launch<__nv_bfloat16, __nv_bfloat16>(a);
    else if (q == "f32" && c == "f16") launch<float, __half>(a);
    else if (q == "f32" && c == "bf16") launch<float, __nv_bfloat16>(a);
    else if (q == "f32" && c == "i8") launch<float, signed char>(a);
    else if (q == "f16" && c == "i8") launch<__half, signed char>(a);
    else if (q == "bf16" && c == "i8") launch<__nv_bfloat16, signed char>(a);
    else if (q == "f32" && c == "fp8_e4m3") launch<float, tk_fa::e4m3>(a);
    else if (q == "f16" && c == "fp8_e4m3") launch<__half, tk_fa::e4m3>(a);
    else if (q == "bf16" && c == "fp8_e4m3") launch<__nv_bfloat16, tk_fa::e4m3>(a);
    else { printf("no variant\n"); failures++; return; }
    std::vector<float> got(qe), ref(qe);
    tk_convert(got.data(), DT("f32"), oraw.data(), qd, qe);
    tk_convert(ref.data(), DT("f32"), oref.data(), qd, qe);
    double num = 0, den = 0, worst = 0, big = 1e-30; int bad = 0;
    for (size_t i = 0; i < qe; i++) {
        if (std::isnan(got[i]) != std::isnan(ref[i])) bad++;
        if (std::isnan(ref[i])) continue;
        num += (got[i] - ref[i]) * (double)(got[i] - ref[i]); den += (double)ref[i] * ref[i];
        worst = std::max(worst, (double)fabsf(got[i] - ref[i])); big = std::max(big, (double)fabsf(ref[i]));
    }
    double lw = 0; int lbad = 0, ninf = 0;
    for (size_t i = 0; i < lse.size(); i++) {
        if (std::isinf(lref[i])) { ninf++; if (!(std::isinf(lse[i]) && lse[i] < 0)) lbad++; continue; }
        if (std::isnan(lse[i]) || std::isnan(lref[i])) { lbad++; continue; }
        lw = std::max(lw, (double)fabsf(lse[i] - lref[i]) / std::max(1.0, (double)fabsf(lref[i])));
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    double tolw = q == "f32" ? 1e-4 : q == "f16" ? 0.01 : 0.05, tolr = q == "f32" ? 1e-5 : q == "f16" ? 2e-3 : 1e-2;
    bool ok = !bad && !lbad && rel <= tolr && worst <= tolw * big && lw <= 1e-5;
    cases++;
    if (!ok) failures++;
    printf("%s q %s cache %s D %d Sq %d bs %d Hq %d Hkv %d lens %zu alibi %d wl %lld softcap %g scale %g: rel %.2e worst %.2e lse %.2e (%d -inf rows) nan-mismatch %d/%d\n",
           ok ? "ok  " : "FAIL", qn, cn, D, Sq, bs, Hq, Hkv, lens.size(), alibi, (long long)wl, softcap, scale, rel, worst / big, lw, ninf, bad, lbad);
}

int main(int argc, char **argv)
{
    if (argc > 1)
        max_cases = atoi(argv[1]); // run only the first N cases

    tk_ctx *ctx;
    if (tk_ctx_new(&ctx, NULL) != TK_OK) { printf("ctx: %s\n", tk_last_error()); return 1; }
    std::vector<int> L1 = {0, 5, 300, 33}, L2 = {37, 1, 700, 16};
    const char *qs[3] = {"f32", "f16", "bf16"};
    int dims[6] = {16, 40, 80, 96, 128, 512};
    int n = 0;
    for (int t = 0; t < 3; t++)
        for (int di = 0; di < 6; di++, n++) {
            int hq = (int[]){8, 4, 6}[n % 3], hkv = (int[]){2, 4, 1}[n % 3];
            run_case(qs[t], qs[t], dims[di], (int[]){1, 4, 16}[n % 3], n % 2 ? 8 : 32, hq, hkv, n % 2 ? L1 : L2, n % 3 == 1,
                     n % 4 == 2 ? (n % 7 == 2 ? 0 : 50) : -1, n % 4 == 3 ? 20.0f : 0.0f, n % 5 == 4 ? 0.3f : 0.0f, ctx);
        }
    const char *fc[4] = {"f16", "bf16", "i8", "fp8_e4m3"};
    for (int c = 0; c < 4; c++) {
        run_case("f32", fc[c], 40, 1, 16, 8, 2, L1, true, -1, 0, 0, ctx);
        run_case("f32", fc[c], 128, 4, 16, 8, 2, L1, false, 20, 20, 0, ctx);
    }
    for (int t = 1; t < 3; t++) {
        run_case(qs[t], "i8", 80, 4, 16, 4, 1, L1, false, -1, 20, 0, ctx);
        run_case(qs[t], "fp8_e4m3", 96, 1, 8, 4, 2, L1, true, 7, 0, 0, ctx);
        run_case(qs[t], "fp8_e4m3", 64, 4, 16, 8, 2, L2, false, 100, 0, 0, ctx);
    }
    printf("%d cases, %d failed\n", cases, failures);
    tk_ctx_free(ctx);
    return failures != 0;
}
