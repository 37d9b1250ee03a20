/*
 * cmd_doctor.c — tk doctor: what this machine has for tk (GPUs, driver, NVRTC, cache, registry) and
 * how to fix what is missing.
 *
 * tk.h has no NVRTC query, so the NVRTC line looks the library up here the way libtk does (TK_NVRTC,
 * libnvrtc.so.13/.12, CUDA_HOME) and asks it for its version.
 */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <jansson.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *USAGE = "tk doctor [--json] [--require-gpu]";

static const char *HELP =
    "NAME\n"
    "    tk doctor - check what this machine has for running kernels, and how to fix the rest\n"
    "\n"
    "SYNOPSIS\n"
    "    tk doctor [--json] [--require-gpu]\n"
    "\n"
    "DESCRIPTION\n"
    "    Reports the CUDA driver and each GPU (name, compute capability, SMs, memory), the NVRTC\n"
    "    library tk compiles with (version and path), the compiled-binary cache (path, entries,\n"
    "    size, cap), the state directory and the registries in lookup order (what each serves, and\n"
    "    whether config.json or TK_ENDPOINT sets it), and on each GPU every installed package's\n"
    "    self-tests: passed, failed or never tested ('tk selftest'). For anything missing it says\n"
    "    what that costs and how to fix it. Without a GPU tk still installs, verifies and builds\n"
    "    packages ahead of time ('tk build --arch sm_90') and runs ops on the CPU reference.\n"
    "    Keys of config.json that tk does not know (a misspelt \"endpont\") are listed with their\n"
    "    line and the setting they are closest to.\n"
    "\n"
    "    It also reports the communication backends for running on several processes or GPUs\n"
    "    (docs/parallel.md): whether this tk was built with MPI and which library, and the NCCL\n"
    "    library it would load. Started by an MPI launcher (mpirun -np N tk doctor), the ranks join\n"
    "    one communicator and rank 0 alone prints the report, with a line a rank: its host, process\n"
    "    id, visible GPUs and the GPU NCCL would give it. A rank that does not join within\n"
    "    TK_COMM_TIMEOUT seconds (default 300) makes the others fail instead of waiting forever.\n"
    "\n"
    "OPTIONS\n"
    "    --require-gpu  exit 7 when there is no usable GPU (for scripts that need one)\n"
    "    --json         the report as one JSON object (docs/json.md)\n"
    "\n"
    "EXIT STATUS\n"
    "    0 tk works here: NVRTC is present, and either a GPU is too or the only finding is that\n"
    "    there is none (ops run on the CPU reference); 7 NVRTC is missing, or with --require-gpu\n"
    "    the GPU or driver is; 1 config.json has keys tk does not know.\n";

typedef int (*nvrtc_version_fn)(int *, int *);

static int find_nvrtc(int *major, int *minor, char *path, size_t n)
{
    const char *cands[8];
    char a[1024], b[1024];
    size_t nc = 0;
    const char *env = getenv("TK_NVRTC"), *home = getenv("CUDA_HOME");
    if (env && *env)
        cands[nc++] = env;
    cands[nc++] = "libnvrtc.so.13";
    cands[nc++] = "libnvrtc.so.12";
    cands[nc++] = "libnvrtc.so";
    if (home && *home) {
        snprintf(a, sizeof a, "%s/lib64/libnvrtc.so", home);
        cands[nc++] = a;
    }
    snprintf(b, sizeof b, "/usr/local/cuda/lib64/libnvrtc.so");
    cands[nc++] = b;
    for (size_t i = 0; i < nc; i++) {
        void *h = dlopen(cands[i], RTLD_NOW | RTLD_LOCAL);
        nvrtc_version_fn fn;
        Dl_info info;
        if (!h)
            continue;
        *(void **)&fn = dlsym(h, "nvrtcVersion");
        if (fn && fn(major, minor) == 0) {
            if (dladdr(*(void **)&fn, &info) && info.dli_fname)
                snprintf(path, n, "%s", info.dli_fname);
            else
                snprintf(path, n, "%s", cands[i]);
            return 0;
        }
    }
    return -1;
}

/* The GPU lines of the report: each GPU, or why there is none. */
static void print_gpus(json_t *gpus, int devrc, int ndev, const char *deverr)
{
    size_t i;
    json_t *g;
    if (devrc != TK_OK) {
        printf("GPU:      none — %s\n", deverr);
        return;
    }
    if (ndev == 0) {
        printf("GPU:      none — the CUDA driver loaded but reports no device\n"
               "          HINT: check 'nvidia-smi' and CUDA_VISIBLE_DEVICES\n");
        return;
    }
    json_array_foreach(gpus, i, g) {
        printf("GPU %lld:    %s (%s, %lld SMs, %.1f GiB), driver %lld.%lld\n",
               (long long)json_integer_value(json_object_get(g, "ordinal")),
               json_string_value(json_object_get(g, "name")), json_string_value(json_object_get(g, "arch")),
               (long long)json_integer_value(json_object_get(g, "sm_count")),
               (double)json_integer_value(json_object_get(g, "total_mem")) / (1024.0 * 1024 * 1024),
               (long long)json_integer_value(json_object_get(g, "driver_version")) / 1000,
               (long long)json_integer_value(json_object_get(g, "driver_version")) % 1000 / 10);
    }
}

/* The state, config, registries and cache of the context, into out. */
static void ctx_info(json_t *out, tk_ctx *ctx)
{
    char *js = NULL;
    json_object_set_new(out, "home", json_string(tk_ctx_home(ctx)));
    json_object_set_new(out, "cache_dir", json_string(tk_ctx_cache_dir(ctx)));
    char cfg[4096];
    snprintf(cfg, sizeof cfg, "%s/config.json", tk_ctx_config_dir(ctx));
    json_object_set_new(out, "config_file", json_string(cfg));
    json_object_set_new(out, "config_exists", json_boolean(access(cfg, F_OK) == 0));
    json_object_set_new(out, "endpoint", json_string(tk_ctx_endpoint(ctx)));
    if (tk_ctx_registries_json(&js, ctx) == TK_OK) {
        json_object_set_new(out, "registries", json_loads(js, 0, NULL));
        tk_free(js);
        js = NULL;
    }
    json_object_set_new(out, "offline", json_boolean(tk_ctx_offline(ctx)));
    if (tk_cache_stats_json(&js, ctx) == TK_OK) {
        json_object_set_new(out, "cache", json_loads(js, 0, NULL));
        tk_free(js);
    } else {
        json_object_set_new(out, "cache_error", json_string(tk_last_error()));
    }
}

/* The installed packages' self-tests on each GPU (docs/selftest.md), into out["selftest"]:
 * {"gpus": [tk_selftest_results_json of each], "records": N recorded for any GPU}. */
static void selftest_info(json_t *out, tk_ctx *ctx, int ndev)
{
    json_t *st = json_object(), *gpus = json_array();
    char *js = NULL;
    for (int d = 0; d < ndev; d++) {
        if (tk_selftest_results_json(&js, ctx, NULL, d) == TK_OK)
            json_array_append_new(gpus, json_loads(js, 0, NULL));
        tk_free(js);
        js = NULL;
    }
    json_object_set_new(st, "gpus", gpus);
    if (tk_selftest_records_json(&js, ctx, NULL) == TK_OK) {
        json_t *r = json_loads(js, 0, NULL);
        json_object_set_new(st, "records", json_integer((json_int_t)json_array_size(r)));
        json_decref(r);
    }
    tk_free(js);
    json_object_set_new(out, "selftest", st);
}

/* "self-tests:" lines: per GPU, each installed package's passed / failed / never tested. */
static void print_selftests(const json_t *st)
{
    size_t i, j;
    json_t *g, *p;
    json_t *gpus = json_object_get(st, "gpus");
    if (!json_array_size(gpus)) {
        printf("selftest: needs a GPU (%lld result%s recorded for other GPUs; 'tk selftest --records')\n",
               (long long)json_integer_value(json_object_get(st, "records")),
               json_integer_value(json_object_get(st, "records")) == 1 ? "" : "s");
        return;
    }
    json_array_foreach(gpus, i, g) {
        long long never = 0, failed = 0;
        printf("selftest: on %s (cuda:%lld, driver %s):\n",
               json_string_value(json_object_get(json_object_get(g, "device"), "name")),
               (long long)json_integer_value(json_object_get(json_object_get(g, "device"), "ordinal")),
               json_string_value(json_object_get(json_object_get(g, "device"), "driver")));
        if (!json_array_size(json_object_get(g, "packages")))
            printf("          no package installed\n");
        json_array_foreach(json_object_get(g, "packages"), j, p) {
            long long f = json_integer_value(json_object_get(p, "failed")),
                      n = json_integer_value(json_object_get(p, "never_tested"));
            printf("          %-34s %s\n", json_string_value(json_object_get(p, "package")),
                   f   ? "FAILED"
                   : n ? "never tested"
                       : "passed");
            printf("            %lld passed, %lld failed, %lld untested, %lld never tested\n",
                   (long long)json_integer_value(json_object_get(p, "passed")), f,
                   (long long)json_integer_value(json_object_get(p, "untested")), n);
            never += n;
            failed += f;
        }
        if (failed)
            printf("          HINT: tk_op_run avoids the failed kernels; 'tk selftest --results' names them\n");
        if (never)
            printf("          HINT: 'tk selftest' proves the kernels never tested on this GPU (about 1 s a package)\n");
    }
}

/* "registry: URL", or one line a registry in lookup order with what it serves and where it is set. */
static void print_registries(const json_t *regs, int offline)
{
    size_t i, n = json_array_size(regs);
    json_t *r;
    json_array_foreach(regs, i, r) {
        const char *src = json_string_value(json_object_get(r, "source"));
        json_t *pats = json_object_get(r, "packages");
        char serves[512] = "any package";
        if (json_array_size(pats)) {
            size_t j, o = 0;
            json_t *p;
            o += (size_t)snprintf(serves, sizeof serves, "only ");
            json_array_foreach(pats, j, p)
                if (o < sizeof serves)
                    o += (size_t)snprintf(serves + o, sizeof serves - o, "%s%s", j ? ", " : "", json_string_value(p));
        }
        printf("%-10s%s  (%s%s; %s)\n", i == 0 ? "registry:" : "", json_string_value(json_object_get(r, "url")),
               n > 1 ? "" : "", serves,
               !strcmp(src, "TK_ENDPOINT") ? "TK_ENDPOINT overrides config.json"
               : !strcmp(src, "config")    ? "config.json"
                                           : "the build's default");
    }
    if (offline)
        printf("          (offline: no registry is used)\n");
}

/* One rank's facts, gathered to every rank as bytes (tk_comm_all_gather). */
typedef struct {
    char host[64];
    int32_t pid, ngpus, device; /* device: the GPU NCCL would give it (local rank % GPUs), -1 none */
    char gpu[128];
} rank_rec;

/* The communication backends into out["parallel"]; under an MPI launcher also every rank's record
 * (out["parallel"]["ranks"]). *quiet is set on ranks other than 0, which print nothing. Returns 0, or
 * an exit code after printing the communicator's error. */
static int parallel_info(tk_cli *cli, json_t *out, int ndev, int *quiet)
{
    char *js = NULL;
    json_t *par, *mpi;
    tk_comm *c = NULL;
    rank_rec me, *all = NULL;
    int rc, code = 0;
    *quiet = 0;
    if (tk_comm_backends_json(&js) != TK_OK)
        return 0;
    par = json_loads(js, 0, NULL);
    tk_free(js);
    if (!par)
        return 0;
    json_object_set_new(out, "parallel", par);
    mpi = json_object_get(par, "mpi");
    if (json_is_null(json_object_get(mpi, "launcher")))
        return 0;
    /* under a launcher: join, and gather every rank's record */
    if ((rc = tk_comm_new(&c, NULL)) != TK_OK) {
        json_object_set_new(par, "comm_error", json_string(tk_last_error()));
        return tk_cli_fail(cli, rc, "joining the other ranks");
    }
    memset(&me, 0, sizeof me);
    snprintf(me.host, sizeof me.host, "%s", tk_comm_host(c, tk_comm_rank(c)));
    me.pid = (int32_t)getpid();
    me.ngpus = ndev;
    me.device = ndev > 0 ? tk_comm_local_rank(c) % ndev : -1;
    if (me.device >= 0) {
        tk_device_info info;
        if (tk_device_info_get(&info, me.device) == TK_OK)
            snprintf(me.gpu, sizeof me.gpu, "%s", info.name);
    }
    all = calloc((size_t)tk_comm_size(c), sizeof *all);
    int64_t s1[1] = {sizeof me}, sn[1] = {(int64_t)sizeof me * tk_comm_size(c)};
    tk_tensor tin = {&me, {TK_DEV_CPU, 0}, 1, {TK_DL_UINT, 8, 1}, s1, NULL, 0};
    tk_tensor tout = {all, {TK_DEV_CPU, 0}, 1, {TK_DL_UINT, 8, 1}, sn, NULL, 0};
    if (!all || (rc = tk_comm_all_gather(c, &tout, &tin, NULL)) != TK_OK) {
        code = tk_cli_fail(cli, all ? rc : TK_ERR_NOMEM, "gathering the ranks' devices");
        tk_comm_abort(c, code);
        goto done;
    }
    json_object_set_new(par, "backend", json_string(tk_comm_backend(c)));
    json_object_set_new(par, "world_size", json_integer(tk_comm_size(c)));
    json_t *ranks = json_array();
    for (int r = 0; r < tk_comm_size(c); r++) {
        all[r].host[sizeof all[r].host - 1] = all[r].gpu[sizeof all[r].gpu - 1] = '\0';
        json_array_append_new(ranks, json_pack("{s:i, s:s, s:i, s:i, s:o, s:o}", "rank", r, "host", all[r].host, "pid",
                                               (int)all[r].pid, "gpus", (int)all[r].ngpus, "device",
                                               all[r].device >= 0 ? json_integer(all[r].device) : json_null(), "gpu",
                                               all[r].gpu[0] ? json_string(all[r].gpu) : json_null()));
    }
    json_object_set_new(par, "ranks", ranks);
    *quiet = tk_comm_rank(c) != 0;
done:
    free(all);
    tk_comm_free(c);
    return code;
}

/* The MPI, NCCL and rank lines of the report. */
static void print_parallel(const json_t *par)
{
    const json_t *mpi = json_object_get(par, "mpi"), *nccl = json_object_get(par, "nccl"), *ranks, *r;
    const char *launcher = json_string_value(json_object_get(mpi, "launcher"));
    size_t i;
    if (!par)
        return;
    if (json_is_true(json_object_get(mpi, "built")))
        printf("MPI:      %s\n", json_string_value(json_object_get(mpi, "library")));
    else
        printf("MPI:      not in this build — one process only on CPUs\n"
               "          HINT: apt install libopenmpi-dev openmpi-bin (scripts/setup.sh), then rebuild tk\n");
    if (json_is_true(json_object_get(nccl, "found")))
        printf("NCCL:     %s at %s\n", json_string_value(json_object_get(nccl, "version")),
               json_string_value(json_object_get(nccl, "path")));
    else
        printf("NCCL:     not found — GPUs cannot work together (one GPU a process still works)\n"
               "          HINT: install NCCL (libnccl2, or pip install nvidia-nccl-cu12) or set TK_NCCL\n");
    if (!launcher) {
        if (json_is_true(json_object_get(mpi, "built")))
            printf("ranks:    1 (not started by mpirun; 'mpirun -np N tk doctor' checks N ranks)\n");
        return;
    }
    ranks = json_object_get(par, "ranks");
    printf("ranks:    %lld, started by %s, backend %s\n", (long long)json_array_size(ranks), launcher,
           json_string_value(json_object_get(par, "backend")));
    json_array_foreach(ranks, i, r) {
        const json_t *dev = json_object_get(r, "device");
        printf("  rank %lld: %s pid %lld, %lld GPU%s", (long long)json_integer_value(json_object_get(r, "rank")),
               json_string_value(json_object_get(r, "host")), (long long)json_integer_value(json_object_get(r, "pid")),
               (long long)json_integer_value(json_object_get(r, "gpus")),
               json_integer_value(json_object_get(r, "gpus")) == 1 ? "" : "s");
        if (json_is_integer(dev))
            printf(", NCCL would use cuda:%lld (%s)", (long long)json_integer_value(dev),
                   json_string_value(json_object_get(r, "gpu")) ? json_string_value(json_object_get(r, "gpu")) : "?");
        printf("\n");
    }
}

/* The unknown keys of config.json, each "file:line:col: unknown key "k"" and its hint. */
static void print_config_warnings(const json_t *w)
{
    size_t i;
    json_t *x;
    json_array_foreach(w, i, x) {
        printf("          %s:%lld:%lld: unknown key \"%s\" (ignored); %s\n",
               json_string_value(json_object_get(x, "file")), (long long)json_integer_value(json_object_get(x, "line")),
               (long long)json_integer_value(json_object_get(x, "column")),
               json_string_value(json_object_get(x, "key")), json_string_value(json_object_get(x, "hint")));
    }
}

/* The GPUs and the driver into out: "gpus", and "driver_error" / "driver_hint" when the driver failed
 * (its message in deverr). The driver's status. */
static int gpu_info(json_t *out, int *ndev, char *deverr, size_t cap)
{
    json_t *gpus = json_array();
    int devrc = tk_device_count(ndev);
    if (devrc != TK_OK)
        snprintf(deverr, cap, "%s", tk_last_error());
    for (int d = 0; devrc == TK_OK && d < *ndev; d++) {
        tk_device_info info;
        if (tk_device_info_get(&info, d) != TK_OK)
            continue;
        char arch[16];
        snprintf(arch, sizeof arch, "sm_%d%d", info.cc_major, info.cc_minor);
        json_array_append_new(gpus, json_pack("{s:i, s:s, s:s, s:i, s:I, s:i}", "ordinal", d, "name", info.name, "arch",
                                              arch, "sm_count", info.sm_count, "total_mem", (json_int_t)info.total_mem,
                                              "driver_version", info.driver_version));
    }
    json_object_set_new(out, "gpus", gpus);
    if (devrc != TK_OK) { /* "message\nHINT: hint": the hint in a field of its own, as in error objects */
        const char *h = strstr(deverr, "\nHINT: ");
        json_object_set_new(out, "driver_error", h ? json_stringn(deverr, (size_t)(h - deverr)) : json_string(deverr));
        json_object_set_new(out, "driver_hint", h ? json_string(h + 7) : json_null());
    }
    return devrc;
}

/* NVRTC into out ("nvrtc": version and path, or null); nvpath empty when it was not found. */
static void nvrtc_info(json_t *out, int *nvmaj, int *nvmin, char *nvpath, size_t cap)
{
    if (find_nvrtc(nvmaj, nvmin, nvpath, cap) == 0) {
        char v[32];
        snprintf(v, sizeof v, "%d.%d", *nvmaj, *nvmin);
        json_object_set_new(out, "nvrtc", json_pack("{s:s, s:s}", "version", v, "path", nvpath));
    } else {
        json_object_set_new(out, "nvrtc", json_null());
    }
}

/* The text report of out (what --json prints as it is). */
static void print_report(json_t *out, tk_ctx *ctx, int devrc, int ndev, const char *deverr, const char *nvpath,
                         int nvmaj, int nvmin, int ok)
{
    json_t *cwarn = json_object_get(out, "config_warnings");
    printf("tk %s (build %s)\n\n", tk_version_string(), tk_build_id());
    print_gpus(json_object_get(out, "gpus"), devrc, ndev, deverr);
    if (nvpath[0])
        printf("NVRTC:    %d.%d at %s\n", nvmaj, nvmin, nvpath);
    else
        printf("NVRTC:    not found — tk cannot compile kernels (cached binaries still load)\n"
               "          HINT: install the CUDA toolkit's NVRTC (apt install cuda-nvrtc-13-0, or pip install\n"
               "          nvidia-cuda-nvrtc) or point TK_NVRTC at libnvrtc.so\n");
    if (ctx) {
        json_t *c = json_object_get(out, "cache");
        printf("home:     %s\n", tk_ctx_home(ctx));
        printf("config:   %s%s\n", json_string_value(json_object_get(out, "config_file")),
               json_is_true(json_object_get(out, "config_exists")) ? "" : " (none: the defaults)");
        print_config_warnings(cwarn);
        if (c)
            printf("cache:    %s: %lld entries, %.1f MiB of %.1f MiB\n", json_string_value(json_object_get(c, "path")),
                   (long long)json_integer_value(json_object_get(c, "entries")),
                   (double)json_integer_value(json_object_get(c, "bytes")) / (1024.0 * 1024),
                   (double)json_integer_value(json_object_get(c, "max_bytes")) / (1024.0 * 1024));
        else
            printf("cache:    unusable — %s\n", json_string_value(json_object_get(out, "cache_error")));
        print_registries(json_object_get(out, "registries"), tk_ctx_offline(ctx));
        print_selftests(json_object_get(out, "selftest"));
    }
    print_parallel(json_object_get(out, "parallel"));
    printf("\n%s\n", ok ? "ok: this machine can compile and run kernels"
                     : devrc != TK_OK || ndev == 0
                         ? "no GPU: packages install and build ahead of time ('tk build ORG/NAME --arch sm_90'); "
                           "ops run on the CPU reference"
                         : "no NVRTC: only kernels already in the cache can load");
    if (json_array_size(cwarn))
        printf("config.json has %zu key%s tk does not know (listed above)\n", json_array_size(cwarn),
               json_array_size(cwarn) == 1 ? "" : "s");
}

int tk_cmd_doctor(tk_cli *cli, int argc, char **argv)
{
    int ndev = 0, devrc, nvmaj = 0, nvmin = 0, ok = 1, require_gpu = 0;
    char nvpath[1024] = "", deverr[1024] = "";

    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            cli->json = 1;
        } else if (!strcmp(argv[i], "--require-gpu")) {
            require_gpu = 1;
        } else {
            return argv[i][0] == '-' ? tk_cli_unknown_option(USAGE, argv[i])
                                     : tk_cli_usage(USAGE, "unexpected '%s'", argv[i]);
        }
    }

    json_t *out = json_object();
    json_object_set_new(out, "tk_version", json_string(tk_version_string()));
    json_object_set_new(out, "tk_build", json_string(tk_build_id()));
    devrc = gpu_info(out, &ndev, deverr, sizeof deverr);
    nvrtc_info(out, &nvmaj, &nvmin, nvpath, sizeof nvpath);
    /* MPI, NCCL, and the ranks under an MPI launcher (only rank 0 prints) */
    int pquiet = 0, pcode = parallel_info(cli, out, devrc == TK_OK ? ndev : 0, &pquiet);
    if (pcode) {
        json_decref(out);
        return pcode;
    }
    /* state, cache, registry */
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx && cli->json) { /* the error object is out: no second object after it */
        json_decref(out);
        return cli->ctx_exit ? cli->ctx_exit : TK_EXIT_FAIL;
    }
    if (ctx) {
        ctx_info(out, ctx);
        selftest_info(out, ctx, devrc == TK_OK ? ndev : 0);
    }
    char *cw = NULL;
    json_t *cwarn = ctx && tk_ctx_config_warnings_json(&cw, ctx) == TK_OK ? json_loads(cw, 0, NULL) : NULL;
    tk_free(cw);
    json_object_set_new(out, "config_warnings", cwarn ? cwarn : json_array());
    cwarn = json_object_get(out, "config_warnings");
    int gpu = devrc == TK_OK && ndev > 0;
    ok = gpu && nvpath[0];
    /* no GPU alone is not a failure: tk installs, builds and runs ops on the CPU reference */
    int code = !nvpath[0] || (require_gpu && !gpu) ? TK_EXIT_DEVICE
               : json_array_size(cwarn)            ? TK_EXIT_FAIL
                                                   : TK_EXIT_OK;

    if (pquiet) {
        json_decref(out);
        return code;
    }
    if (cli->json) {
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s ? s : "{}");
        free(s);
    } else {
        print_report(out, ctx, devrc, ndev, deverr, nvpath, nvmaj, nvmin, ok);
    }
    json_decref(out);
    return code;
}
