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

static const char *USAGE = "tk doctor [--json]";

static const char *HELP =
    "NAME\n"
    "    tk doctor - check what this machine has for running kernels, and how to fix the rest\n"
    "\n"
    "SYNOPSIS\n"
    "    tk doctor [--json]\n"
    "\n"
    "DESCRIPTION\n"
    "    Reports the CUDA driver and each GPU (name, compute capability, SMs, memory), the NVRTC\n"
    "    library tk compiles with (version and path), the compiled-binary cache (path, entries,\n"
    "    size, cap), the state directory and the registries in lookup order (what each serves, and\n"
    "    whether config.json or TK_ENDPOINT sets it), and on each GPU every installed package's\n"
    "    self-tests: passed, failed or never tested ('tk selftest'). For anything missing it says\n"
    "    what that costs and how to fix it. Without a GPU tk still installs, verifies and builds\n"
    "    packages ahead of time ('tk build --arch sm_90') and runs ops on the CPU reference.\n"
    "\n"
    "EXIT STATUS\n"
    "    0 everything needed to run kernels is present; 7 the GPU, driver or NVRTC is missing.\n";

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
        printf("selftest: on %s (cuda:%lld, driver %s):\n", json_string_value(json_object_get(json_object_get(g, "device"), "name")),
               (long long)json_integer_value(json_object_get(json_object_get(g, "device"), "ordinal")),
               json_string_value(json_object_get(json_object_get(g, "device"), "driver")));
        if (!json_array_size(json_object_get(g, "packages")))
            printf("          no package installed\n");
        json_array_foreach(json_object_get(g, "packages"), j, p) {
            long long f = json_integer_value(json_object_get(p, "failed")), n = json_integer_value(json_object_get(p, "never_tested"));
            printf("          %-34s %s\n", json_string_value(json_object_get(p, "package")),
                   f ? "FAILED" : n ? "never tested" : "passed");
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
            json_array_foreach(pats, j, p) if (o < sizeof serves)
                o += (size_t)snprintf(serves + o, sizeof serves - o, "%s%s", j ? ", " : "", json_string_value(p));
        }
        printf("%-10s%s  (%s%s; %s)\n", i == 0 ? "registry:" : "",
               json_string_value(json_object_get(r, "url")), n > 1 ? "" : "", serves,
               !strcmp(src, "TK_ENDPOINT") ? "TK_ENDPOINT overrides config.json"
               : !strcmp(src, "config") ? "config.json" : "the build's default");
    }
    if (offline)
        printf("          (offline: no registry is used)\n");
}

int tk_cmd_doctor(tk_cli *cli, int argc, char **argv)
{
    int ndev = 0, devrc, nvmaj = 0, nvmin = 0, ok = 1;
    char nvpath[1024] = "", deverr[1024] = "";
    json_t *out = json_object(), *gpus = json_array();

    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--json")) {
            cli->json = 1;
        } else {
            return tk_cli_usage(USAGE, "unexpected '%s'", argv[i]);
        }
    }

    json_object_set_new(out, "tk_version", json_string(tk_version_string()));
    /* GPUs and the driver */
    devrc = tk_device_count(&ndev);
    if (devrc != TK_OK)
        snprintf(deverr, sizeof deverr, "%s", tk_last_error());
    for (int d = 0; devrc == TK_OK && d < ndev; d++) {
        tk_device_info info;
        if (tk_device_info_get(&info, d) != TK_OK)
            continue;
        char arch[16];
        snprintf(arch, sizeof arch, "sm_%d%d", info.cc_major, info.cc_minor);
        json_array_append_new(gpus, json_pack("{s:i, s:s, s:s, s:i, s:I, s:i}", "ordinal", d, "name",
                                              info.name, "arch", arch, "sm_count", info.sm_count,
                                              "total_mem", (json_int_t)info.total_mem, "driver_version",
                                              info.driver_version));
    }
    json_object_set_new(out, "gpus", gpus);
    if (devrc != TK_OK) { /* "message\nHINT: hint": the hint in a field of its own, as in error objects */
        const char *h = strstr(deverr, "\nHINT: ");
        json_object_set_new(out, "driver_error", h ? json_stringn(deverr, (size_t)(h - deverr)) : json_string(deverr));
        json_object_set_new(out, "driver_hint", h ? json_string(h + 7) : json_null());
    }
    /* NVRTC */
    if (find_nvrtc(&nvmaj, &nvmin, nvpath, sizeof nvpath) == 0) {
        char v[32];
        snprintf(v, sizeof v, "%d.%d", nvmaj, nvmin);
        json_object_set_new(out, "nvrtc", json_pack("{s:s, s:s}", "version", v, "path", nvpath));
    } else {
        json_object_set_new(out, "nvrtc", json_null());
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
    ok = devrc == TK_OK && ndev > 0 && nvpath[0];

    if (cli->json) {
        char *s = json_dumps(out, JSON_INDENT(2));
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(out);
        return ok ? TK_EXIT_OK : TK_EXIT_DEVICE;
    }
    printf("tk %s\n\n", tk_version_string());
    print_gpus(gpus, devrc, ndev, deverr);
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
    printf("\n%s\n", ok ? "ok: this machine can compile and run kernels"
                        : devrc != TK_OK || ndev == 0
                            ? "no GPU: packages install and build ahead of time ('tk build ORG/NAME --arch sm_90'); "
                              "ops run on the CPU reference"
                            : "no NVRTC: only kernels already in the cache can load");
    json_decref(out);
    return ok ? TK_EXIT_OK : TK_EXIT_DEVICE;
}
