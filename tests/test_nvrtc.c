/*
 * test_nvrtc.c — real NVRTC compiles (no GPU needed): a template name expression and an extern "C"
 * kernel with an in-memory header, for sm_80, sm_90 and sm_90a; compile errors that name file:line;
 * refused options; parallel compiles. Then, only when a GPU is present, load and launch the result
 * (SKIP otherwise). The whole file SKIPs when NVRTC is not installed.
 */
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#include "jit/jit.h"

static const char hdr[] = "#pragma once\n"
                          "#define TK_SCALE 3\n"
                          "namespace tkt { template <typename T> __device__ T twice(T x) { return x + x; } }\n";

static const char src[] = "// kern.cu: test kernels\n"
                          "#include <cuda_fp16.h>\n"
                          "#include \"inc/helpers.cuh\"\n"
                          "namespace tkt {\n"
                          "template <typename T, int N>\n"
                          "__global__ void scale(T *out, const T *in, long long n) {\n"
                          "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                          "    if (i < n) out[i] = twice(in[i]) * (T)(N * TK_SCALE);\n"
                          "}\n"
                          "}\n"
                          "extern \"C\" __global__ void plain(float *out, long long n) {\n"
                          "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
                          "    if (i < n) out[i] = (float)i + __half2float(__float2half(0.5f));\n"
                          "}\n";

static const char *names[] = {"tkt::scale<float, 2>", "tkt::scale<__half, 1>", "plain"};
static const char *opts[] = {"-std=c++17", "-use_fast_math"};
static tk_jit_file hdrs[] = {{"inc/helpers.cuh", hdr, sizeof hdr - 1}};

static void unit(tk_jit_unit *u, int cc, int arch_specific)
{
    memset(u, 0, sizeof *u);
    u->src_path = "kern.cu";
    u->src = src;
    u->src_len = sizeof src - 1;
    u->headers = hdrs;
    u->nheaders = 1;
    u->names = names;
    u->nnames = 3;
    u->options = opts;
    u->noptions = 2;
    u->cc = cc;
    u->arch_specific = arch_specific;
}

static int have_nvrtc(void) { return tk_jit__nvrtc_load() == TK_OK; }

static void compile_for(int cc, int arch_specific, const char *target)
{
    tk_jit_unit u;
    tk_jit_binary *b = NULL;
    char want[64];
    unit(&u, cc, arch_specific);
    CHECK_RC(tk_jit__compile(&b, &u), TK_OK);
    if (!b)
        return;
    CHECK(b->cubin && b->cubin_len > 16 &&
          memcmp(b->cubin,
                 "\x7f"
                 "ELF",
                 4) == 0);
    CHECK(b->ptx != NULL);
    snprintf(want, sizeof want, ".target %s", target);
    CHECK_CONTAINS(b->ptx, want);
    CHECK_EQ_INT(b->nlowered, 3);
    if (b->nlowered == 3) {
        CHECK(strncmp(b->lowered[0], "_ZN3tkt5scaleIfLi2EEEvPT_PKS1_x", 31) == 0);
        CHECK_CONTAINS(b->lowered[1], "scaleI6__half");
        CHECK_STR(b->lowered[2], "plain");
        CHECK_CONTAINS(b->ptx, b->lowered[0]);
    }
    tk_jit__binary_free(b);
}

/* tk_jit__ptx_params: the parameter list of an entry as NVRTC's PTX declares it (count and bytes),
 * what tk compares with the manifest before it launches (a short list crashed the host in cuLaunchKernel). */
static void test_ptx_params(void)
{
    static const char psrc[] = "struct three { int a[3]; };\n"
                               "template <typename T>\n"
                               "__global__ void k(T *out, int n, double d, three s, long long m, float f, short h) {\n"
                               "    if (n) out[0] = (T)(d + s.a[2] + m + f + h);\n"
                               "}\n"
                               "extern \"C\" __global__ void none() {}\n";
    static const char *pnames[] = {"k<float>", "none"};
    tk_jit_unit u;
    tk_jit_binary *b = NULL;
    size_t sz[16], n = 99;
    if (!have_nvrtc())
        SKIP("no NVRTC");
    memset(&u, 0, sizeof u);
    u.src_path = "p.cu";
    u.src = psrc;
    u.src_len = sizeof psrc - 1;
    u.names = pnames;
    u.nnames = 2;
    u.cc = 90;
    CHECK_RC(tk_jit__compile(&b, &u), TK_OK);
    if (!b)
        return;
    CHECK(b->ptx != NULL);
    CHECK_RC(tk_jit__ptx_params(b->ptx, b->lowered[0], sz, 16, &n), TK_OK);
    CHECK_EQ_INT(n, 7);
    const size_t want[7] = {8, 4, 8, 12, 8, 4, 2};
    for (size_t i = 0; i < 7 && n == 7; i++)
        CHECK_EQ_INT(sz[i], want[i]);
    CHECK_RC(tk_jit__ptx_params(b->ptx, "none", sz, 16, &n), TK_OK);
    CHECK_EQ_INT(n, 0);
    /* only the first `cap` sizes are written; the count is the whole list */
    CHECK_RC(tk_jit__ptx_params(b->ptx, b->lowered[0], sz, 2, &n), TK_OK);
    CHECK_EQ_INT(n, 7);
    /* a prefix of a name is not the entry */
    CHECK_RC(tk_jit__ptx_params(b->ptx, "non", sz, 16, &n), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_jit__ptx_params(b->ptx, "absent", sz, 16, &n), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_jit__ptx_params(".visible .entry bad(\n .param .u64 x,\n", "bad", sz, 16, &n), TK_ERR_INVALID);
    CHECK_RC(tk_jit__ptx_params(".visible .entry bad(\n .reg .u64 x\n)", "bad", sz, 16, &n), TK_ERR_INVALID);
    tk_jit__binary_free(b);
}

static void test_version(void)
{
    int major = 0, minor = -1;
    const char *path = NULL;
    int archs[64];
    size_t n = 0;
    if (!have_nvrtc())
        SKIP(tk_last_error());
    CHECK_RC(tk_jit__nvrtc_version(&major, &minor, &path), TK_OK);
    CHECK(major >= 12);
    CHECK(path && strstr(path, "nvrtc"));
    CHECK_RC(tk_jit__nvrtc_archs(archs, 64, &n), TK_OK);
    CHECK(n > 0);
    printf("# NVRTC %d.%d at %s, include %s, archs sm_%d..sm_%d\n", major, minor, path,
           tk_jit__cuda_include_dir() ? tk_jit__cuda_include_dir() : "(none)", n ? archs[0] : 0, n ? archs[n - 1] : 0);
}

static void test_sm80(void)
{
    if (!have_nvrtc())
        SKIP("no NVRTC");
    compile_for(80, 0, "sm_80");
}

static void test_sm90(void)
{
    if (!have_nvrtc())
        SKIP("no NVRTC");
    compile_for(90, 0, "sm_90");
}

static void test_sm90a(void)
{
    if (!have_nvrtc())
        SKIP("no NVRTC");
    compile_for(90, 1, "sm_90a");
}

/* <tk/device.cuh> is in every compile without a file on disk: a kernel that uses each helper
 * compiles for sm_80 and sm_90, and a package header of the same name is refused. */
static const char tk_src[] =
    "#include <tk/device.cuh>\n"
    "#if TK_DEVICE_TOOLKIT_VERSION != 1\n#error wrong toolkit\n#endif\n"
    "template <typename T>\n"
    "__global__ void every(T *out, const T *in, float *f, tk_u64 *u, unsigned char *q, tk_i64 n) {\n"
    "    tk::map(out, in, n, [](float x) { return 2.0f * x; });\n"
    "    float r[2] = {tk::to_f32(in[0]), 1.0f};\n"
    "    tk::block_sum(r);\n"
    "    f[0] = tk::block_sum(r[0]) + tk::block_max(r[1]) + tk::warp_sum(r[0]) + tk::warp_max(r[1]);\n"
    "    f[1] = (float)tk::block_sum((double)r[0]);\n"
    "    u[0] = tk::block_sum(u[1]) + tk::block_max(u[2]) + tk::philox_u64(u[3], 1, 2);\n"
    "    uint4 p = tk::philox4x32_10(make_uint4(1, 2, 3, 4), make_uint2(5, 6));\n"
    "    q[0] = tk::f32_to_fp8_e4m3(f[2]); q[1] = tk::f32_to_fp8_e5m2(f[2]); q[2] = tk::f32_to_i8(f[2]);\n"
    "    f[3] = tk::fp8_e4m3_to_f32(q[3]) + tk::fp8_e5m2_to_f32(q[4]) + tk::i8_to_f32(q[5]);\n"
    "    float2 two = tk::unpack2<__nv_bfloat16>(tk::pack2<__nv_bfloat16>(f[4], f[5]));\n"
    "    float2 h2 = tk::unpack2<__half>(tk::pack2<__half>(f[4], f[5]));\n"
    "    f[6] = two.x + h2.y + (float)p.x + (float)tk::cdiv(n, 7) + (tk::aligned(in, 8) ? 1.0f : 0.0f);\n"
    "    for (tk_i64 i = tk::grid_index(); i < n; i += tk::grid_stride()) out[i] = tk::from_f32<T>(f[7]);\n"
    "}\n"
    "template __global__ void every<float>(float *, const float *, float *, tk_u64 *, unsigned char *, tk_i64);\n";

static void test_device_toolkit(void)
{
    static const char *tk_names[] = {"every<float>", "every<__half>", "every<__nv_bfloat16>"};
    static const char *tk_opts[] = {"-std=c++17"};
    static const int ccs[] = {80, 90};
    tk_jit_unit u;
    tk_jit_binary *b = NULL;
    if (!have_nvrtc())
        SKIP("no NVRTC");
    for (size_t i = 0; i < 2; i++) {
        memset(&u, 0, sizeof u);
        u.src_path = "every.cu";
        u.src = tk_src;
        u.src_len = sizeof tk_src - 1;
        u.names = tk_names;
        u.nnames = 3;
        u.options = tk_opts;
        u.noptions = 1;
        u.cc = ccs[i];
        CHECK_RC(tk_jit__compile(&b, &u), TK_OK);
        CHECK(b && b->cubin && b->nlowered == 3);
        tk_jit__binary_free(b);
        b = NULL;
    }
    /* a package file named tk/device.cuh would hide the toolkit */
    tk_jit_file shadow[] = {{"tk/device.cuh", hdr, sizeof hdr - 1}};
    u.headers = shadow;
    u.nheaders = 1;
    CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_MANIFEST);
    CHECK(b == NULL);
    CHECK_CONTAINS(tk_last_error(), "would hide tk's device toolkit");
    CHECK_CONTAINS(tk_last_error(), "HINT:");
}

/* TK_NVRTC_LINEINFO=1: -lineinfo (line tables in the PTX, .loc) and a cache key of its own. */
static void test_lineinfo(void)
{
    if (!have_nvrtc())
        SKIP("no NVRTC");
    tk_jit_unit u;
    tk_jit_binary *plain = NULL, *lined = NULL;
    char k1[TK_SHA256_HEX], k2[TK_SHA256_HEX];
    unit(&u, 90, 0);
    unsetenv("TK_NVRTC_LINEINFO");
    CHECK_RC(tk_jit__key(k1, &u, "13.0"), TK_OK);
    CHECK_RC(tk_jit__compile(&plain, &u), TK_OK);
    setenv("TK_NVRTC_LINEINFO", "1", 1);
    CHECK_RC(tk_jit__key(k2, &u, "13.0"), TK_OK);
    CHECK_RC(tk_jit__compile(&lined, &u), TK_OK);
    unsetenv("TK_NVRTC_LINEINFO");
    CHECK(strcmp(k1, k2) != 0);
    CHECK(plain && plain->ptx && !strstr(plain->ptx, ".loc"));
    CHECK(lined && lined->ptx && strstr(lined->ptx, ".loc"));
    tk_jit__binary_free(plain);
    tk_jit__binary_free(lined);
}

static void test_ptx_only(void)
{
    tk_jit_unit u;
    tk_jit_binary *b = NULL;
    if (!have_nvrtc())
        SKIP("no NVRTC");
    unit(&u, 80, 0);
    u.ptx_only = 1;
    CHECK_RC(tk_jit__compile(&b, &u), TK_OK);
    if (b) {
        CHECK(b->cubin == NULL);
        CHECK_CONTAINS(b->ptx, ".target sm_80");
        CHECK_EQ_INT(b->nlowered, 3);
    }
    tk_jit__binary_free(b);
}

static void test_compile_error(void)
{
    tk_jit_unit u;
    tk_jit_binary *b = (tk_jit_binary *)1;
    static const char bad[] = "// line 1\n__global__ void k(float *o) {\n    o[0] = undefined_thing;\n}\n";
    if (!have_nvrtc())
        SKIP("no NVRTC");
    unit(&u, 80, 0);
    u.src_path = "ops/bad.cu";
    u.src = bad;
    u.src_len = sizeof bad - 1;
    u.nnames = 0;
    CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_COMPILE);
    CHECK(b == NULL);
    CHECK_CONTAINS(tk_last_error(), "ops/bad.cu(3): error");
    CHECK_CONTAINS(tk_last_error(), "undefined_thing");
    CHECK_CONTAINS(tk_last_error(), "sm_80");

    /* an error inside an in-memory header names the header */
    {
        static const char badh[] = "#pragma once\nint x = ;\n";
        tk_jit_file h[] = {{"inc/helpers.cuh", badh, sizeof badh - 1}};
        unit(&u, 80, 0);
        u.headers = h;
        CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_COMPILE);
        CHECK_CONTAINS(tk_last_error(), "inc/helpers.cuh(2)");
    }
    /* a name expression that names nothing */
    {
        const char *nm[] = {"tkt::nothing<int>"};
        unit(&u, 80, 0);
        u.names = nm;
        u.nnames = 1;
        CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_COMPILE);
        CHECK_CONTAINS(tk_last_error(), "nothing");
    }
    /* a refused option never reaches NVRTC */
    {
        const char *o[] = {"--time=/tmp/tk-should-not-exist"};
        unit(&u, 80, 0);
        u.options = o;
        u.noptions = 1;
        CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_MANIFEST);
        CHECK(!tk__path_exists("/tmp/tk-should-not-exist"));
    }
    /* an arch NVRTC does not know */
    unit(&u, 12, 0);
    CHECK_RC(tk_jit__compile(&b, &u), TK_ERR_UNSUPPORTED);
    CHECK_CONTAINS(tk_last_error(), "sm_12");
}

static void test_parallel(void)
{
    tk_jit_unit us[4];
    tk_jit_binary *outs[4];
    int st[4];
    char *msg[4];
    static const char bad[] = "__global__ void k() { nope; }\n";
    if (!have_nvrtc())
        SKIP("no NVRTC");
    unit(&us[0], 80, 0);
    unit(&us[1], 90, 0);
    unit(&us[2], 90, 1);
    unit(&us[3], 86, 0);
    CHECK_RC(tk_jit__compile_many(outs, st, msg, us, 4, 0), TK_OK);
    for (int i = 0; i < 4; i++) {
        CHECK_RC(st[i], TK_OK);
        CHECK(outs[i] && outs[i]->cubin_len > 0);
        tk_jit__binary_free(outs[i]);
        free(msg[i]);
    }
    /* one failure: the others still compile, the error is the failing unit's */
    us[1].src = bad;
    us[1].src_len = sizeof bad - 1;
    us[1].src_path = "bad1.cu";
    us[1].nnames = 0;
    CHECK_RC(tk_jit__compile_many(outs, st, msg, us, 4, 2), TK_ERR_COMPILE);
    CHECK_CONTAINS(tk_last_error(), "bad1.cu(1)");
    CHECK_RC(st[0], TK_OK);
    CHECK_RC(st[1], TK_ERR_COMPILE);
    CHECK(msg[1] && strstr(msg[1], "bad1.cu"));
    for (int i = 0; i < 4; i++) {
        tk_jit__binary_free(outs[i]);
        free(msg[i]);
    }
    CHECK(tk_jit__default_jobs() >= 1);
}

/* Device detection in a child, with the toolkit's stub libcuda in place of a driver. */
static void test_stub_driver(void)
{
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    pid_t pid;
    int st = 0;
    if (!tk__path_exists(stub))
        SKIP("no stub libcuda");
    pid = fork();
    if (pid == 0) {
        int n = -1, rc;
        setenv("TK_LIBCUDA", stub, 1);
        rc = tk_jit__device_count(&n);
        if (rc != TK_ERR_NO_DEVICE || !strstr(tk_last_error(), "HINT") || n != 0) {
            fprintf(stderr, "stub: rc %d n %d: %s\n", rc, n, tk_last_error());
            _exit(1);
        }
        setenv("TK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        _exit(0);
    }
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    /* and no driver at all */
    pid = fork();
    if (pid == 0) {
        int n = -1;
        tk_device_info info;
        setenv("TK_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
        if (tk_jit__device_count(&n) != TK_ERR_NO_DEVICE || !strstr(tk_last_error(), "no CUDA driver") ||
            !strstr(tk_last_error(), "HINT"))
            _exit(1);
        if (tk_jit__device_info(&info, 0) != TK_ERR_NO_DEVICE)
            _exit(2);
        _exit(0);
    }
    waitpid(pid, &st, 0);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- GPU: load and launch ---------------------------------------------------------------------- */

typedef int (*cu_fn)();

static void test_gpu_launch(void)
{
    int n = 0;
    tk_device_info info;
    tk_jit_unit u;
    tk_jit_binary *b = NULL;
    tk_jit_module *m = NULL;
    void *fscale = NULL, *fplain = NULL, *h;
    int stale = -1;
    uint64_t din = 0, dout = 0;
    float host[1000], res[1000];
    long long cnt = 1000;
    void *ctx = NULL;
    cu_fn memalloc, memfree, htod, dtoh, sync, retain, setcur;

    if (tk_jit__device_count(&n) != TK_OK || n == 0)
        SKIP("no CUDA device");
    if (!have_nvrtc())
        SKIP("no NVRTC");
    CHECK_RC(tk_jit__device_info(&info, 0), TK_OK);
    unit(&u, info.cc_major * 10 + info.cc_minor, 0);
    CHECK_RC(tk_jit__compile(&b, &u), TK_OK);
    if (!b)
        return;
    CHECK_RC(tk_jit__module_load(&m, 0, b->cubin, &stale), TK_OK);
    CHECK_EQ_INT(stale, 0);
    if (!m)
        goto done;
    CHECK_RC(tk_jit__module_function(&fscale, m, b->lowered[0]), TK_OK);
    CHECK_RC(tk_jit__module_function(&fplain, m, b->lowered[2]), TK_OK);
    CHECK_RC(tk_jit__module_function(&fplain, m, "no_such_kernel"), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_jit__module_function(&fplain, m, b->lowered[2]), TK_OK);

    /* a garbage image is "stale": the caller recompiles */
    {
        tk_jit_module *m2 = NULL;
        static const char junk[64] = "\x7f"
                                     "ELF garbage";
        CHECK_RC(tk_jit__module_load(&m2, 0, junk, &stale), TK_ERR_LAUNCH);
        CHECK_EQ_INT(stale, 1);
    }

    h = dlopen("libcuda.so.1", RTLD_NOW);
    memalloc = (cu_fn)dlsym(h, "cuMemAlloc_v2");
    memfree = (cu_fn)dlsym(h, "cuMemFree_v2");
    htod = (cu_fn)dlsym(h, "cuMemcpyHtoD_v2");
    dtoh = (cu_fn)dlsym(h, "cuMemcpyDtoH_v2");
    sync = (cu_fn)dlsym(h, "cuCtxSynchronize");
    retain = (cu_fn)dlsym(h, "cuDevicePrimaryCtxRetain");
    setcur = (cu_fn)dlsym(h, "cuCtxSetCurrent");
    CHECK(retain(&ctx, 0) == 0 && setcur(ctx) == 0);
    CHECK(memalloc(&din, sizeof host) == 0 && memalloc(&dout, sizeof host) == 0);
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i * 0.25f;
    CHECK(htod(din, host, sizeof host) == 0);
    {
        unsigned grid[3] = {4, 1, 1}, block[3] = {256, 1, 1};
        void *args[] = {&dout, &din, &cnt};
        CHECK_RC(tk_jit__launch(m, fscale, grid, block, 0, NULL, args, 0, NULL), TK_OK);
        CHECK(sync() == 0);
        CHECK(dtoh(res, dout, sizeof res) == 0);
        for (int i = 0; i < 1000; i++)
            if (res[i] != host[i] * 2 * 2 * 3) {
                CHECK_EQ_INT((long long)(res[i] * 100), (long long)(host[i] * 1200));
                break;
            }
        void *pargs[] = {&dout, &cnt};
        CHECK_RC(tk_jit__launch(m, fplain, grid, block, 0, NULL, pargs, 0, NULL), TK_OK);
        CHECK(sync() == 0);
        CHECK(dtoh(res, dout, sizeof res) == 0);
        CHECK(res[999] == 999.5f);
    }
    memfree(din);
    memfree(dout);
    /* PTX loads too (the driver JITs it) */
    {
        tk_jit_module *m3 = NULL;
        CHECK_RC(tk_jit__module_load(&m3, 0, b->ptx, &stale), TK_OK);
        tk_jit__module_release(m3);
    }
    tk_jit__module_retain(m);
    tk_jit__module_release(m);
done:
    tk_jit__module_release(m);
    tk_jit__binary_free(b);
}

int main(void)
{
    RUN(test_version);
    RUN(test_sm80);
    RUN(test_sm90);
    RUN(test_sm90a);
    RUN(test_ptx_params);
    RUN(test_device_toolkit);
    RUN(test_ptx_only);
    RUN(test_lineinfo);
    RUN(test_compile_error);
    RUN(test_parallel);
    RUN(test_stub_driver);
    RUN(test_gpu_launch);
    return th_done();
}
