/*
 * cublaslt.c — cuBLASLt through dlopen: the GPU implementation of the `linear` op (see cublaslt.h).
 *
 * The types, constants and entry points are declared here with the values of CUDA 13's cublasLt.h,
 * cublas_api.h and library_types.h, so nothing includes a CUDA header. The library is loaded once
 * per process; one cublasLtHandle_t per device is created on first use under that device's primary
 * context and kept for the life of the process (like the retained primary contexts of mem.c).
 * cuBLASLt handles are thread-safe and carry no stream, so threads and streams share them.
 *
 * Row-major to column-major: y[m, n] row-major is D = y^T, column-major [n, m] with ld n. D = op(A) B
 * with A = w (transposed: [n, k] row-major is column-major [k, n], so op(A) = A^T; [k, n] row-major is
 * column-major [n, k], op(A) = A) and B = x^T (x [m, k] row-major is column-major [k, m], ld k). The
 * bias is a vector over D's rows, i.e. over n: CUBLASLT_EPILOGUE_BIAS.
 *
 * Each call creates its (host-only) descriptors, takes an algorithm from a small per-device cache
 * keyed by the problem (or asks cublasLtMatmulAlgoGetHeuristic once and caches the answer), and
 * allocates the workspace that algorithm needs on the call's stream (cuMemAllocAsync, freed on the
 * stream after the product), so concurrent calls on other streams never share scratch. The
 * heuristic is told the operands' real alignment, so sliced tensors get algorithms that can read them.
 *
 * Split-K: for a short grid the heuristic likes algorithms that split k and add the parts afterwards.
 * By default cuBLASLt may add them in the OUTPUT's type (CUBLASLT_REDUCTION_SCHEME_INPLACE in the
 * output buffer, or _OUTPUT_TYPE in the workspace): with a bf16 or f16 y every part is rounded to 16
 * bits before the sum, which breaks the one-rounding contract of cublaslt.h (tk's first GPU run: bf16
 * [64, 77] x [96, 77] off by up to 2^-8 where the fp32 sum was 0.0017). So a 16-bit y allows only
 * CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE (fp32 parts, reduced in fp32) or no split at all, through the
 * preference's reduction-scheme mask, and the chosen algorithm's scheme is checked again (when the
 * library can report it) before it is used or cached. An f32 y loses nothing in either scheme.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jit/cublaslt.h"
#include "jit/cuda_api.h"
#include "jit/jit.h"

/* ---- the slice of the cuBLASLt API tk uses ------------------------------------------------------ */

typedef int cublasStatus_t;
typedef struct cublasLtContext *cublasLtHandle_t;
typedef struct cublasLtMatmulDescOpaque *cublasLtMatmulDesc_t;
typedef struct cublasLtMatrixLayoutOpaque *cublasLtMatrixLayout_t;
typedef struct cublasLtMatmulPreferenceOpaque *cublasLtMatmulPreference_t;
typedef struct {
    uint64_t data[8];
} cublasLtMatmulAlgo_t;
typedef struct {
    cublasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    cublasStatus_t state;
    float wavesCount;
    int reserved[4];
} cublasLtMatmulHeuristicResult_t;

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK = 3,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES = 6,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES = 7,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES = 8,
    CUBLASLT_REDUCTION_SCHEME_NONE = 0,
    CUBLASLT_REDUCTION_SCHEME_INPLACE = 1,
    CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE = 2,
    CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE = 4,
    CUBLASLT_ALGO_CONFIG_ID = 0,
    CUBLASLT_ALGO_CONFIG_TILE_ID = 1,
    CUBLASLT_ALGO_CONFIG_SPLITK_NUM = 2,
    CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME = 3,
};

typedef struct {
    cublasStatus_t (*Create)(cublasLtHandle_t *);
    size_t (*GetVersion)(void);
    const char *(*GetStatusName)(cublasStatus_t);
    const char *(*GetStatusString)(cublasStatus_t);
    cublasStatus_t (*MatmulDescCreate)(cublasLtMatmulDesc_t *, int, int);
    cublasStatus_t (*MatmulDescDestroy)(cublasLtMatmulDesc_t);
    cublasStatus_t (*MatmulDescSetAttribute)(cublasLtMatmulDesc_t, int, const void *, size_t);
    cublasStatus_t (*MatrixLayoutCreate)(cublasLtMatrixLayout_t *, int, uint64_t, uint64_t, int64_t);
    cublasStatus_t (*MatrixLayoutDestroy)(cublasLtMatrixLayout_t);
    cublasStatus_t (*MatmulPreferenceCreate)(cublasLtMatmulPreference_t *);
    cublasStatus_t (*MatmulPreferenceDestroy)(cublasLtMatmulPreference_t);
    cublasStatus_t (*MatmulPreferenceSetAttribute)(cublasLtMatmulPreference_t, int, const void *, size_t);
    cublasStatus_t (*MatmulAlgoGetHeuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                             cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                             cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t *, int *);
    cublasStatus_t (*Matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *, cublasLtMatrixLayout_t,
                             const void *, cublasLtMatrixLayout_t, const void *, const void *, cublasLtMatrixLayout_t,
                             void *, cublasLtMatrixLayout_t, const cublasLtMatmulAlgo_t *, void *, size_t, CUstream);
    /* optional (checked when present): the chosen algorithm's reduction scheme; an unsplit copy of a
     * split algorithm (a 16-bit y with a bias, see splitk_of) */
    cublasStatus_t (*MatmulAlgoConfigGetAttribute)(const cublasLtMatmulAlgo_t *, int, void *, size_t, size_t *);
    cublasStatus_t (*MatmulAlgoConfigSetAttribute)(cublasLtMatmulAlgo_t *, int, const void *, size_t);
    cublasStatus_t (*MatmulAlgoCheck)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                      cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                      const cublasLtMatmulAlgo_t *, cublasLtMatmulHeuristicResult_t *);
} lt_api;

/* ---- loading ------------------------------------------------------------------------------------ */

#define MAX_DEVICES 64
#define MAX_WORKSPACE ((uint64_t)32 << 20) /* what NVIDIA recommends for Hopper; enough for Ampere */
#define ALGO_CACHE 64                      /* problems remembered per device */

static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static lt_api lt;
static int lt_status = TK_ERR_INTERNAL;
static char lt_err[1024], lt_path[512];

static void lt_init_once(void)
{
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    const char *homes[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    const char *env = getenv("TK_CUBLASLT");
    char cands[24][512], tried[700] = "";
    size_t nc = 0, tl = 0;
    void *h = NULL;

    if (env && *env)
        snprintf(cands[nc++], sizeof cands[0], "%s", env);
    for (size_t i = 0; i < 3; i++)
        snprintf(cands[nc++], sizeof cands[0], "%s", names[i]);
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; homes[d] && *homes[d] && i < 3 && nc + 2 <= 24; i++) {
            snprintf(cands[nc++], sizeof cands[0], "%.400s/lib64/%s", homes[d], names[i]);
            snprintf(cands[nc++], sizeof cands[0], "%.400s/lib/%s", homes[d], names[i]);
        }
    for (size_t i = 0; i < nc && !h; i++) {
        h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        if (h)
            snprintf(lt_path, sizeof lt_path, "%s", cands[i]);
        else if (tl < sizeof tried - 1)
            tl += (size_t)snprintf(tried + tl, sizeof tried - tl, "%s%s", tl ? ", " : "", cands[i]);
        if (tl >= sizeof tried)
            tl = sizeof tried - 1;
    }
    if (!h) {
        snprintf(lt_err, sizeof lt_err,
                 "cuBLASLt could not be loaded (tried %s)\nHINT: install the CUDA toolkit's cuBLAS (apt install "
                 "libcublas-13-0, or pip install nvidia-cublas), or set TK_CUBLASLT=/path/to/libcublasLt.so",
                 tried);
        lt_status = TK_ERR_UNSUPPORTED;
        return;
    }
    const char *missing = NULL;
#define LT_SYM(field, name)                                                                                            \
    do {                                                                                                               \
        *(void **)&lt.field = dlsym(h, name);                                                                          \
        if (!lt.field && !missing)                                                                                     \
            missing = name;                                                                                            \
    } while (0)
    LT_SYM(Create, "cublasLtCreate");
    LT_SYM(GetVersion, "cublasLtGetVersion");
    LT_SYM(GetStatusName, "cublasLtGetStatusName");
    LT_SYM(GetStatusString, "cublasLtGetStatusString");
    LT_SYM(MatmulDescCreate, "cublasLtMatmulDescCreate");
    LT_SYM(MatmulDescDestroy, "cublasLtMatmulDescDestroy");
    LT_SYM(MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
    LT_SYM(MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
    LT_SYM(MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
    LT_SYM(MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
    LT_SYM(MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
    LT_SYM(MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
    LT_SYM(MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
    LT_SYM(Matmul, "cublasLtMatmul");
#undef LT_SYM
    *(void **)&lt.MatmulAlgoConfigGetAttribute = dlsym(h, "cublasLtMatmulAlgoConfigGetAttribute");
    *(void **)&lt.MatmulAlgoConfigSetAttribute = dlsym(h, "cublasLtMatmulAlgoConfigSetAttribute");
    *(void **)&lt.MatmulAlgoCheck = dlsym(h, "cublasLtMatmulAlgoCheck");
    if (missing) {
        snprintf(lt_err, sizeof lt_err, "%s has no symbol %s (a cuBLASLt older than CUDA 11?)", lt_path, missing);
        lt_status = TK_ERR_UNSUPPORTED;
        dlclose(h);
        return;
    }
    lt_status = TK_OK;
}

int tk_jit__blaslt_load(void)
{
    pthread_once(&lt_once, lt_init_once);
    return lt_status == TK_OK ? TK_OK : tk__err(lt_status, "%s", lt_err);
}

int tk_jit__blaslt_version(size_t *version, const char **path)
{
    int rc = tk_jit__blaslt_load();
    if (rc != TK_OK)
        return rc;
    if (version)
        *version = lt.GetVersion();
    if (path)
        *path = lt_path;
    return TK_OK;
}

static int lt_fail(cublasStatus_t st, const char *what, int device)
{
    const char *name = lt.GetStatusName ? lt.GetStatusName(st) : NULL;
    const char *text = lt.GetStatusString ? lt.GetStatusString(st) : NULL;
    return tk__err(TK_ERR_LAUNCH, "%s on device %d: %s (%d): %s", what, device, name ? name : "cuBLAS status", st,
                   text ? text : "");
}

/* ---- per-device handles and chosen algorithms --------------------------------------------------- */

typedef struct {
    int dtype, w_kn, bias, tf32, x_km, accumulate, y_f32;
    int64_t m, n, k;
    uint32_t align[4];
} problem;

typedef struct {
    problem p;
    cublasLtMatmulAlgo_t algo;
    size_t ws;
    int used;
} algo_entry;

static pthread_mutex_t dev_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    cublasLtHandle_t h;
    algo_entry algos[ALGO_CACHE];
    unsigned next;
} devs[MAX_DEVICES];

/* The handle of a device; the device's primary context must be current. */
static int handle_for(cublasLtHandle_t *out, int device)
{
    int rc = TK_OK;
    pthread_mutex_lock(&dev_mu);
    if (!devs[device].h) {
        cublasStatus_t st = lt.Create(&devs[device].h);
        if (st != CUBLAS_STATUS_SUCCESS) {
            devs[device].h = NULL;
            rc = lt_fail(st, "cublasLtCreate", device);
        }
    }
    *out = devs[device].h;
    pthread_mutex_unlock(&dev_mu);
    return rc;
}

static int algo_get(int device, const problem *p, cublasLtMatmulAlgo_t *algo, size_t *ws)
{
    int found = 0;
    pthread_mutex_lock(&dev_mu);
    for (size_t i = 0; i < ALGO_CACHE && !found; i++) {
        algo_entry *e = &devs[device].algos[i];
        if (e->used && memcmp(&e->p, p, sizeof *p) == 0) {
            *algo = e->algo;
            *ws = e->ws;
            found = 1;
        }
    }
    pthread_mutex_unlock(&dev_mu);
    return found;
}

static void algo_put(int device, const problem *p, const cublasLtMatmulAlgo_t *algo, size_t ws)
{
    pthread_mutex_lock(&dev_mu);
    algo_entry *e = &devs[device].algos[devs[device].next++ % ALGO_CACHE];
    e->p = *p;
    e->algo = *algo;
    e->ws = ws;
    e->used = 1;
    pthread_mutex_unlock(&dev_mu);
}

/* The largest power of two (at most 256) that divides the address: what the heuristic may assume. */
static uint32_t alignment(const void *ptr)
{
    uintptr_t a = (uintptr_t)ptr;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

/* ---- the product -------------------------------------------------------------------------------- */

/* k == 0: y = bias broadcast over the rows, or 0. Stream-ordered copies. */
static int gemm_k0(const tk_jit_gemm *g, size_t esz)
{
    const tk_cu_api *cu = tk_jit__cu();
    CUresult r = CUDA_SUCCESS;
    size_t row = (size_t)g->n * esz;
    if (!g->bias)
        r = cu->cuMemsetD8Async((CUdeviceptr)(uintptr_t)g->y, 0, row * (size_t)g->m, (CUstream)g->stream);
    for (int64_t i = 0; g->bias && r == CUDA_SUCCESS && i < g->m; i++)
        r = cu->cuMemcpyDtoDAsync((CUdeviceptr)(uintptr_t)g->y + (CUdeviceptr)(row * (size_t)i),
                                  (CUdeviceptr)(uintptr_t)g->bias, row, (CUstream)g->stream);
    if (r != CUDA_SUCCESS) {
        char eb[256];
        return tk__err(TK_ERR_LAUNCH, "linear with K = 0 on device %d: %s", g->device,
                       tk_jit__cu_errstr(r, eb, sizeof eb));
    }
    return TK_OK;
}

/* Returns lt_fail(...) from the calling step when a cuBLASLt call fails (g names the device). */
#define LT(call, name)                                                                                                 \
    do {                                                                                                               \
        cublasStatus_t st_ = (call);                                                                                   \
        if (st_ != CUBLAS_STATUS_SUCCESS)                                                                              \
            return lt_fail(st_, name, g->device);                                                                      \
    } while (0)

/* The key of a product in the algorithm cache: everything the heuristic's choice depends on. */
static void problem_of(problem *p, const tk_jit_gemm *g, int compute)
{
    memset(p, 0, sizeof *p);
    p->dtype = g->dtype;
    p->w_kn = g->w_kn;
    p->bias = g->bias != NULL;
    p->tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    p->x_km = g->x_km || g->x_ones;
    p->accumulate = g->accumulate;
    p->y_f32 = g->y_f32;
    p->m = g->m;
    p->n = g->n;
    p->k = g->k;
    p->align[0] = alignment(g->w);
    p->align[1] = alignment(g->x);
    p->align[2] = p->align[3] = alignment(g->y);
}

/* The operation and the three matrix layouts of one product; NULL members are not created yet. */
typedef struct {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
} descs;

static void descs_free(descs *d)
{
    if (d->la)
        lt.MatrixLayoutDestroy(d->la);
    if (d->lb)
        lt.MatrixLayoutDestroy(d->lb);
    if (d->ld)
        lt.MatrixLayoutDestroy(d->ld);
    if (d->op)
        lt.MatmulDescDestroy(d->op);
}

/* y^T = op(w) x^T in cuBLASLt's column-major view: A = w as stored, B = x^T, D = y^T, with the bias
 * epilogue when there is a bias. */
static int descs_make(descs *d, const tk_jit_gemm *g, int type, int compute)
{
    int xkm = g->x_km || g->x_ones, ytype = g->y_f32 ? CUDA_R_32F : type;
    int32_t ta = g->w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = xkm ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    LT(lt.MatmulDescCreate(&d->op, compute, CUDA_R_32F), "cublasLtMatmulDescCreate");
    LT(lt.MatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "cublasLtMatmulDescSetAttribute");
    LT(lt.MatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "cublasLtMatmulDescSetAttribute");
    LT(lt.MatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
       "cublasLtMatmulDescSetAttribute");
    if (g->bias)
        LT(lt.MatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias),
           "cublasLtMatmulDescSetAttribute");
    if (g->w_kn)
        LT(lt.MatrixLayoutCreate(&d->la, type, (uint64_t)g->n, (uint64_t)g->k, g->n), "cublasLtMatrixLayoutCreate");
    else
        LT(lt.MatrixLayoutCreate(&d->la, type, (uint64_t)g->k, (uint64_t)g->n, g->k), "cublasLtMatrixLayoutCreate");
    /* x [m, k] row-major is column-major [k, m]; x stored [k, m] is column-major [m, k], transposed */
    if (xkm)
        LT(lt.MatrixLayoutCreate(&d->lb, type, (uint64_t)g->m, (uint64_t)g->k, g->m), "cublasLtMatrixLayoutCreate");
    else
        LT(lt.MatrixLayoutCreate(&d->lb, type, (uint64_t)g->k, (uint64_t)g->m, g->k), "cublasLtMatrixLayoutCreate");
    LT(lt.MatrixLayoutCreate(&d->ld, ytype, (uint64_t)g->n, (uint64_t)g->m, g->n), "cublasLtMatrixLayoutCreate");
    return TK_OK;
}

/* One 32-bit attribute of an algorithm's configuration, or dflt when the library cannot say. */
/* tk_jit_blaslt_dtype -> cudaDataType */
static const int cuda_type[] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};

static uint32_t algo_cfg(const cublasLtMatmulAlgo_t *algo, int attr, uint32_t dflt)
{
    uint32_t v = dflt;
    size_t written = 0;
    if (!lt.MatmulAlgoConfigGetAttribute ||
        lt.MatmulAlgoConfigGetAttribute(algo, attr, &v, sizeof v, &written) != CUBLAS_STATUS_SUCCESS)
        return dflt;
    return v;
}

/* Whether an algorithm's split-K reduction keeps fp32 parts: always for an f32 y; for a 16-bit y only
 * no split or CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE (see the top of the file). An algorithm whose
 * scheme cannot be read passes: the preference's mask already filtered it. */
static int reduction_ok(const cublasLtMatmulAlgo_t *algo, int y16)
{
    uint32_t scheme = y16 ? algo_cfg(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, CUBLASLT_REDUCTION_SCHEME_NONE)
                          : CUBLASLT_REDUCTION_SCHEME_NONE;
    return scheme == CUBLASLT_REDUCTION_SCHEME_NONE || scheme == CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
}

/* Whether an algorithm splits k (1 when the library cannot say). A 16-bit y with a bias prefers an
 * unsplit algorithm: on the H200 (tk's second GPU run) bf16 + bias with split-K parts reduced in fp32
 * still came out rounded to bf16 before the bias was added (got 0 where y + bias was -0.0013, at every
 * shape where the heuristic split k), while the same products without a bias, and f16's unsplit
 * algorithm with one, were right. */
static int splitk_of(const cublasLtMatmulAlgo_t *algo)
{
    return (int)algo_cfg(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, 1);
}

/* A copy of a split algorithm made to run unsplit (split-K 1, no reduction), if the library accepts it
 * for the problem: the H100 run (tk's third) showed bf16 + bias at [64, 77] x [96, 77] offered only
 * split algorithms, and every one of them rounded before the bias. 1 with *out and *wsz set, else 0. */
static int unsplit_of(cublasLtMatmulAlgo_t *out, size_t *wsz, const cublasLtMatmulAlgo_t *algo, cublasLtHandle_t h,
                      const descs *d)
{
    uint32_t one = 1, none = CUBLASLT_REDUCTION_SCHEME_NONE;
    cublasLtMatmulHeuristicResult_t r;
    if (!lt.MatmulAlgoConfigSetAttribute || !lt.MatmulAlgoCheck)
        return 0;
    *out = *algo;
    memset(&r, 0, sizeof r);
    if (lt.MatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one, sizeof one) !=
            CUBLAS_STATUS_SUCCESS ||
        lt.MatmulAlgoConfigSetAttribute(out, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof none) !=
            CUBLAS_STATUS_SUCCESS ||
        lt.MatmulAlgoCheck(h, d->op, d->la, d->lb, d->ld, d->ld, out, &r) != CUBLAS_STATUS_SUCCESS ||
        r.state != CUBLAS_STATUS_SUCCESS || r.workspaceSize > MAX_WORKSPACE)
        return 0;
    *wsz = r.workspaceSize;
    return 1;
}

#define HEUR_RESULTS 32 /* algorithms asked for: the first whose reduction keeps fp32 parts is used */

/* Asks the heuristic for the best algorithm under MAX_WORKSPACE and the operands' alignments whose
 * split-K reduction (if any) adds fp32 parts when y is 16-bit. TK_ERR_UNSUPPORTED naming the product
 * when there is none. */
static int algo_ask(cublasLtMatmulAlgo_t *algo, size_t *wsz, cublasLtMatmulPreference_t *pref, cublasLtHandle_t h,
                    const descs *d, const problem *p, const tk_jit_gemm *g)
{
    static const int align_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    uint64_t maxws = MAX_WORKSPACE;
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE; /* and no split, which no mask excludes */
    int y16 = !g->y_f32 && g->dtype != TK_JIT_BLASLT_F32, nres = 0, pick = -1, rejected = 0;
    cublasLtMatmulHeuristicResult_t res[HEUR_RESULTS];
    memset(res, 0, sizeof res);
    LT(lt.MatmulPreferenceCreate(pref), "cublasLtMatmulPreferenceCreate");
    LT(lt.MatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &maxws, sizeof maxws),
       "cublasLtMatmulPreferenceSetAttribute");
    if (y16)
        LT(lt.MatmulPreferenceSetAttribute(*pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof schemes),
           "cublasLtMatmulPreferenceSetAttribute");
    for (int i = 0; i < 4; i++)
        LT(lt.MatmulPreferenceSetAttribute(*pref, align_attr[i], &p->align[i], sizeof p->align[i]),
           "cublasLtMatmulPreferenceSetAttribute");
    cublasStatus_t st =
        lt.MatmulAlgoGetHeuristic(h, d->op, d->la, d->lb, d->ld, d->ld, *pref, HEUR_RESULTS, res, &nres);
    /* pass 0 (a 16-bit y with a bias): an unsplit algorithm; pass 1: any whose reduction keeps fp32 */
    for (int pass = y16 && g->bias ? 0 : 1; pass < 2 && pick < 0; pass++)
        for (int i = 0; st == CUBLAS_STATUS_SUCCESS && i < nres && i < HEUR_RESULTS && pick < 0; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS)
                continue;
            if (reduction_ok(&res[i].algo, y16) && (pass == 1 || splitk_of(&res[i].algo) <= 1))
                pick = i;
            else if (pass == 1)
                rejected++;
        }
    /* a 16-bit y with a bias and only split algorithms offered: the first that runs unsplit */
    for (int i = 0; y16 && g->bias && pick >= 0 && splitk_of(&res[pick].algo) > 1 && i < nres && i < HEUR_RESULTS;
         i++) {
        cublasLtMatmulAlgo_t un;
        size_t unws = 0;
        if (res[i].state == CUBLAS_STATUS_SUCCESS && unsplit_of(&un, &unws, &res[i].algo, h, d)) {
            *algo = un;
            *wsz = unws;
            return TK_OK;
        }
    }
    if (pick < 0) {
        const char *name = lt.GetStatusName(st != CUBLAS_STATUS_SUCCESS ? st : nres > 0 ? res[0].state : st);
        return tk__err(TK_ERR_UNSUPPORTED,
                       "cuBLASLt has no algorithm for %s [%lld, %lld] x %s [%lld, %lld]%s on device %d (%s; "
                       "alignments w %u, x %u, y %u bytes)",
                       g->dtype == TK_JIT_BLASLT_F32   ? "f32"
                       : g->dtype == TK_JIT_BLASLT_F16 ? "f16"
                                                       : "bf16",
                       (long long)g->m, (long long)g->k, g->w_kn ? "weight^T" : "weight", (long long)g->n,
                       (long long)g->k, g->bias ? " + bias" : "", g->device,
                       rejected                                  ? "every one it offered adds split-K parts in 16 bits"
                       : nres < 1 && st == CUBLAS_STATUS_SUCCESS ? "no result"
                       : name                                    ? name
                                                                 : "?",
                       p->align[0], p->align[1], p->align[2]);
    }
    *algo = res[pick].algo;
    *wsz = res[pick].workspaceSize;
    return TK_OK;
}

/* The algorithm for p: from the device's cache, else from the heuristic (then cached). */
static int algo_for(cublasLtMatmulAlgo_t *algo, size_t *wsz, cublasLtHandle_t h, const descs *d, const problem *p,
                    const tk_jit_gemm *g)
{
    cublasLtMatmulPreference_t pref = NULL;
    int rc = TK_OK;
    if (algo_get(g->device, p, algo, wsz))
        return TK_OK;
    if ((rc = algo_ask(algo, wsz, &pref, h, d, p, g)) == TK_OK)
        algo_put(g->device, p, algo, *wsz);
    if (pref)
        lt.MatmulPreferenceDestroy(pref);
    return rc;
}

/* wsz bytes of workspace on the stream (cuMemAllocAsync: the pool makes it cheap); *ws = 0 for none. */
static int workspace_alloc(CUdeviceptr *ws, size_t wsz, const tk_jit_gemm *g)
{
    *ws = 0;
    if (!wsz)
        return TK_OK;
    CUresult r = tk_jit__cu()->cuMemAllocAsync(ws, wsz, (CUstream)g->stream);
    if (r != CUDA_SUCCESS) {
        char eb[256];
        *ws = 0;
        return tk__err(r == CUDA_ERROR_OUT_OF_MEMORY ? TK_ERR_NOMEM : TK_ERR_LAUNCH,
                       "cuBLASLt workspace of %zu bytes on device %d: %s", wsz, g->device,
                       tk_jit__cu_errstr(r, eb, sizeof eb));
    }
    return TK_OK;
}

static int matmul(cublasLtHandle_t h, const descs *d, const cublasLtMatmulAlgo_t *algo, CUdeviceptr ws, size_t wsz,
                  const tk_jit_gemm *g, const void *x)
{
    float alpha = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
    LT(lt.Matmul(h, d->op, &alpha, g->w, d->la, x ? x : g->x, d->lb, &beta, g->y, d->ld, g->y, d->ld, algo,
                 (void *)(uintptr_t)ws, wsz, (CUstream)g->stream),
       "cublasLtMatmul");
    return TK_OK;
}
#undef LT

static int compute_of(const tk_jit_gemm *g)
{
    return g->dtype == TK_JIT_BLASLT_F32 && g->allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

int tk_jit__blaslt_gemm(const tk_jit_gemm *g)
{
    static const size_t esize[] = {4, 2, 2};
    if (!g || g->dtype < 0 || g->dtype > TK_JIT_BLASLT_BF16 || g->m < 0 || g->n < 0 || g->k < 0)
        return tk__err(TK_ERR_INVALID, "cuBLASLt product: bad arguments");
    if (g->device < 0 || g->device >= MAX_DEVICES)
        return tk__err(TK_ERR_INVALID, "cuBLASLt product: device %d out of range", g->device);
    if (g->m == 0 || g->n == 0)
        return TK_OK;
    int rc = tk_jit__blaslt_load();
    if (rc != TK_OK)
        return rc;
    if ((rc = tk_jit__ctx_push(g->device)) != TK_OK)
        return rc;
    if (g->k == 0) {
        rc = g->accumulate ? TK_OK : gemm_k0(g, g->y_f32 ? 4 : esize[g->dtype]);
        tk_jit__ctx_pop();
        return rc;
    }
    if (g->x_ones && g->m != 1) {
        tk_jit__ctx_pop();
        return tk__err(TK_ERR_INVALID, "cuBLASLt product: a row of ones needs m = 1, got %lld", (long long)g->m);
    }

    int compute = compute_of(g);
    cublasLtHandle_t h = NULL;
    descs d = {0};
    problem p;
    cublasLtMatmulAlgo_t algo;
    size_t wsz = 0;
    CUdeviceptr ws = 0;
    problem_of(&p, g, compute);
    CUdeviceptr ones = 0;
    if (g->x_ones) { /* k ones in the operands' dtype: 1.0f is 0x3f800000, f16 0x3c00, bf16 0x3f80 */
        rc = workspace_alloc(&ones, (size_t)g->k * esize[g->dtype], g);
        CUresult r = CUDA_SUCCESS;
        if (rc == TK_OK)
            r = g->dtype == TK_JIT_BLASLT_F32
                    ? tk_jit__cu()->cuMemsetD32Async(ones, 0x3f800000u, (size_t)g->k, (CUstream)g->stream)
                    : tk_jit__cu()->cuMemsetD16Async(ones, g->dtype == TK_JIT_BLASLT_F16 ? 0x3c00 : 0x3f80,
                                                     (size_t)g->k, (CUstream)g->stream);
        if (rc == TK_OK && r != CUDA_SUCCESS) {
            char eb[256];
            rc = tk__err(TK_ERR_LAUNCH, "cuBLASLt product: filling ones on device %d: %s", g->device,
                         tk_jit__cu_errstr(r, eb, sizeof eb));
        }
    }
    if (rc == TK_OK && (rc = handle_for(&h, g->device)) == TK_OK &&
        (rc = descs_make(&d, g, cuda_type[g->dtype], compute)) == TK_OK &&
        (rc = algo_for(&algo, &wsz, h, &d, &p, g)) == TK_OK && (rc = workspace_alloc(&ws, wsz, g)) == TK_OK)
        rc = matmul(h, &d, &algo, ws, wsz, g, ones ? (const void *)(uintptr_t)ones : NULL);
    if (ws)
        tk_jit__cu()->cuMemFreeAsync(ws, (CUstream)g->stream);
    if (ones)
        tk_jit__cu()->cuMemFreeAsync(ones, (CUstream)g->stream);
    descs_free(&d);
    tk_jit__ctx_pop();
    return rc;
}

int tk_jit__blaslt_algo_info(const tk_jit_gemm *g, tk_jit_blaslt_algo *info)
{
    static const int attr[4] = {CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME};
    if (!g || !info || g->dtype < 0 || g->dtype > TK_JIT_BLASLT_BF16 || g->device < 0 || g->device >= MAX_DEVICES)
        return tk__err(TK_ERR_INVALID, "cuBLASLt algorithm: bad arguments");
    if (g->m <= 0 || g->n <= 0 || g->k <= 0)
        return tk__err(TK_ERR_INVALID, "cuBLASLt algorithm: [%lld, %lld] x [%lld] is no product", (long long)g->m,
                       (long long)g->k, (long long)g->n);
    memset(info, 0, sizeof *info);
    int rc = tk_jit__blaslt_load();
    if (rc != TK_OK)
        return rc;
    if (!lt.MatmulAlgoConfigGetAttribute)
        return tk__err(TK_ERR_UNSUPPORTED, "%s has no cublasLtMatmulAlgoConfigGetAttribute", lt_path);
    if ((rc = tk_jit__ctx_push(g->device)) != TK_OK)
        return rc;
    int compute = compute_of(g);
    cublasLtHandle_t h = NULL;
    descs d = {0};
    problem p;
    cublasLtMatmulAlgo_t algo;
    size_t wsz = 0;
    problem_of(&p, g, compute);
    if ((rc = handle_for(&h, g->device)) == TK_OK && (rc = descs_make(&d, g, cuda_type[g->dtype], compute)) == TK_OK &&
        (rc = algo_for(&algo, &wsz, h, &d, &p, g)) == TK_OK) {
        int *out[4] = {&info->algo_id, &info->tile_id, &info->splitk, &info->reduction};
        info->workspace = wsz;
        for (int i = 0; i < 4 && rc == TK_OK; i++) {
            uint32_t v = 0; /* int32_t or uint32_t per attribute: 4 bytes either way */
            size_t written = 0;
            cublasStatus_t st = lt.MatmulAlgoConfigGetAttribute(&algo, attr[i], &v, sizeof v, &written);
            if (st != CUBLAS_STATUS_SUCCESS)
                rc = lt_fail(st, "cublasLtMatmulAlgoConfigGetAttribute", g->device);
            *out[i] = (int)v;
        }
    }
    descs_free(&d);
    tk_jit__ctx_pop();
    return rc;
}
