/*
 * cmd_init.c — tk init NAME: a working package skeleton (one kernel, its manifest, a README with a
 * test shape) that passes `tk publish --check` as written, for an author to start from.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"

static const char *USAGE = "tk init [ORG/]NAME [--dir DIR] [--force]";

static const char *HELP =
    "NAME\n"
    "    tk init - write a new kernel package skeleton\n"
    "\n"
    "SYNOPSIS\n"
    "    tk init [ORG/]NAME [--dir DIR] [--force]\n"
    "\n"
    "DESCRIPTION\n"
    "    Writes a directory (DIR, default ./NAME) holding a working package: kernel.json\n"
    "    declaring one kernel, NAME_f32 (an element-wise scale, out = x * alpha, with f32\n"
    "    tensors, an f32 scalar given by the caller and an i64 derived from the shape), its\n"
    "    source NAME.cu, and a README.md saying how to check, run and publish it. It passes\n"
    "    'tk publish DIR --check' as written; edit it from there (docs/authoring.md).\n"
    "    ORG defaults to 'my-org'. The version starts at 1.0.0 (tk versions start at major 1).\n"
    "\n"
    "OPTIONS\n"
    "    --dir DIR   where to write (default: ./NAME); it must not exist or be empty\n"
    "    --force     write into a directory that is not empty (files tk init writes are replaced)\n"
    "\n"
    "EXIT STATUS\n"
    "    0 written; 2 usage or a bad name; 6 the directory exists and is not empty, or a write failed.\n"
    "\n"
    "EXAMPLES\n"
    "    tk init my-org/scale && tk check ./scale\n";

/* The names a package is written with. */
typedef struct {
    const char *dir;
    char org[64], pkg[64];
    char ident[64];   /* the C identifier of the kernel: the package name with '-' as '_' */
    char shown[4096]; /* how the README and the hint name the directory: a path tk reads as a directory */
} init_names;

static int write_file(tk_cli *cli, const char *dir, const char *name, const char *text)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "cannot write %s: %s", path, strerror(errno));
    int bad = fputs(text, f) < 0;
    bad |= fclose(f) != 0;
    if (bad)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "cannot write %s: %s", path, strerror(errno));
    return 0;
}

static int ident_ok(const char *s)
{
    if (!*s || strlen(s) > 40 || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z')))
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_' ||
              *s == '-'))
            return 0;
    return 1;
}

#define GO (-1) /* a step's "go on": anything else is the command's exit code */

/* parse options: [ORG/]NAME, --dir, --force. */
static int init_parse(const char **name, const char **dir, int *force, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (tk_cli_is_help(argv[i])) {
            fputs(HELP, stdout);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--dir")) {
            if (++i >= argc)
                return tk_cli_usage(USAGE, "--dir needs a directory");
            *dir = argv[i];
        } else if (!strcmp(argv[i], "--force")) {
            *force = 1;
        } else if (argv[i][0] == '-') {
            return tk_cli_unknown_option(USAGE, argv[i]);
        } else if (!*name) {
            *name = argv[i];
        } else {
            return tk_cli_usage(USAGE, "one package at a time");
        }
    }
    if (!*name)
        return tk_cli_usage(USAGE, "which name? e.g. tk init my-org/scale");
    return GO;
}

/* resolve and validate the names: ORG (default my-org), NAME, the kernel's identifier, the directory. */
static int init_resolve(init_names *n, const char *name, const char *dir)
{
    const char *slash = strchr(name, '/');
    snprintf(n->org, sizeof n->org, "my-org");
    if (slash) {
        if ((size_t)(slash - name) >= sizeof n->org || !ident_ok(slash + 1))
            return tk_cli_usage(USAGE, "'%s' is not ORG/NAME (NAME: a letter, then letters, digits, '_' or '-')", name);
        snprintf(n->org, sizeof n->org, "%.*s", (int)(slash - name), name);
        snprintf(n->pkg, sizeof n->pkg, "%s", slash + 1);
    } else {
        if (!ident_ok(name))
            return tk_cli_usage(USAGE, "'%s' is not a package name (a letter, then letters, digits, '_' or '-')", name);
        snprintf(n->pkg, sizeof n->pkg, "%s", name);
    }
    if (!ident_ok(n->org) && !strchr(n->org, '.'))
        return tk_cli_usage(USAGE, "'%s' is not an org name", n->org);
    snprintf(n->ident, sizeof n->ident, "%s", n->pkg);
    for (char *p = n->ident; *p; p++)
        if (*p == '-')
            *p = '_';
    n->dir = dir ? dir : n->pkg;
    snprintf(n->shown, sizeof n->shown, "%s%s",
             n->dir[0] == '/' || !strncmp(n->dir, "./", 2) || !strncmp(n->dir, "../", 3) ? "" : "./", n->dir);
    return GO;
}

/* validate the directory: created, or existing without a kernel.json (unless --force). */
static int init_prepare_dir(tk_cli *cli, const char *dir, int force)
{
    char probe[4096];
    struct stat st;
    if (mkdir(dir, 0755) == 0)
        return GO;
    if (errno != EEXIST)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "cannot create %s: %s", dir, strerror(errno));
    snprintf(probe, sizeof probe, "%s/kernel.json", dir);
    if (!force && stat(probe, &st) == 0)
        return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO,
                             "%s already holds a kernel.json\nHINT: pick another --dir, or --force to replace it", dir);
    return GO;
}

static void emit_manifest(FILE *f, const init_names *n)
{
    fprintf(f,
            "{\n"
            "  \"name\": \"%s/%s\",\n"
            "  \"version\": \"1.0.0\",\n"
            "  \"license\": \"Apache-2.0\",\n"
            "  \"description\": \"%s: out = x * alpha, element-wise (a tk init skeleton)\",\n"
            "  \"compile\": {\"options\": [\"-std=c++17\"]},\n"
            "  \"kernels\": [\n"
            "    {\n"
            "      \"name\": \"%s_f32\",\n"
            "      \"op\": \"%s\",\n"
            "      \"source\": \"%s.cu\",\n"
            "      \"symbol\": \"tk_%s<float>\",\n"
            "      \"params\": [\n"
            "        {\"name\": \"out\", \"type\": \"tensor\", \"dtype\": \"f32\"},\n"
            "        {\"name\": \"x\", \"type\": \"tensor\", \"dtype\": \"f32\"},\n"
            "        {\"name\": \"alpha\", \"type\": \"f32\"},\n"
            "        {\"name\": \"n\", \"type\": \"i64\", \"value\": \"numel(out)\"}\n"
            "      ],\n"
            "      \"launch\": {\"grid\": [\"cdiv(numel(out), 256)\"], \"block\": [\"256\"], \"smem\": \"0\"},\n"
            "      \"constraints\": {\"dtypes\": [\"f32\"], \"min_cc\": 70, \"max\": {\"cdiv(numel(out), 256)\": "
            "2147483647}},\n"
            "      \"priority\": 0\n"
            "    }\n"
            "  ]\n"
            "}\n",
            n->org, n->pkg, n->pkg, n->ident, n->ident, n->pkg, n->ident);
}

static void emit_source(FILE *f, const init_names *n)
{
    fprintf(f,
            "// %s.cu - out = x * alpha, element-wise.\n"
            "//\n"
            "// Variants: tk_%s<float> (kernel.json: %s_f32). Launch: one thread per element, 256 a\n"
            "// block, grid cdiv(n, 256). Numerics: one multiply in the tensor's type.\n"
            "// A kernel receives raw pointers (a tensor param is a T *), an i64 param as long long, an\n"
            "// f32 as float; headers: the package's own files and cuda_fp16.h / cuda_bf16.h.\n"
            "\n"
            "template <typename T>\n"
            "__global__ void tk_%s(T *__restrict__ out,      // (n) f32\n"
            "                    const T *__restrict__ x,  // (n) f32\n"
            "                    float alpha, long long n)\n"
            "{\n"
            "    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n"
            "    if (i < n)\n"
            "        out[i] = (T)((float)x[i] * alpha);\n"
            "}\n",
            n->pkg, n->ident, n->ident, n->ident);
}

static void emit_readme(FILE *f, const init_names *n)
{
    fprintf(f,
            "# %s/%s\n"
            "\n"
            "out = x * alpha, element-wise. Made by `tk init`; see docs/authoring.md in tk.\n"
            "\n"
            "## Check, run, publish\n"
            "\n"
            "```sh\n"
            "tk check %s    # manifest and an NVRTC compile, sm_80 and sm_90\n"
            "tk build %s --arch sm_90    # compile into the cache, no GPU needed\n"
            "tk run %s %s_f32 --shape 4096 --shape 4096 --arg alpha=2   # on a GPU\n"
            "tk keygen ~/.config/tk/publisher.pem\n"
            "tk publish %s --to /srv/registry --key ~/.config/tk/publisher.pem\n"
            "```\n"
            "\n"
            "## Test shape\n"
            "\n"
            "`out` and `x`: any shape with the same number of elements, e.g. 4096 or 8x1024.\n",
            n->org, n->pkg, n->shown, n->shown, n->shown, n->ident, n->shown);
}

/* One file of the skeleton, written by emit into memory, then to DIR/NAME. */
static int write_emitted(tk_cli *cli, const init_names *n, const char *name, void (*emit)(FILE *, const init_names *))
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, TK_EXIT_FAIL, "out of memory");
    emit(f, n);
    fclose(f);
    int bad = write_file(cli, n->dir, name, text);
    free(text);
    return bad ? bad : GO;
}

/* report: what was written, and what to do next. */
static void init_report(const tk_cli *cli, const init_names *n, const char *cuname)
{
    if (cli->json) {
        char full[160];
        snprintf(full, sizeof full, "%s/%s", n->org, n->pkg);
        printf("{\"dir\": ");
        tk_cli_json_str(stdout, n->dir);
        printf(", \"name\": ");
        tk_cli_json_str(stdout, full);
        printf(", \"kernel\": \"%s_f32\"}\n", n->ident);
    } else if (!cli->quiet) {
        printf("wrote %s/: kernel.json, %s, README.md (package %s/%s, kernel %s_f32)\nnext: tk check %s\n", n->dir,
               cuname, n->org, n->pkg, n->ident, n->shown);
    }
}

int tk_cmd_init(tk_cli *cli, int argc, char **argv)
{
    const char *name = NULL, *dir = NULL;
    int force = 0, ec;
    init_names n;
    char cuname[80];
    memset(&n, 0, sizeof n);
    if ((ec = init_parse(&name, &dir, &force, argc, argv)) != GO || (ec = init_resolve(&n, name, dir)) != GO ||
        (ec = init_prepare_dir(cli, n.dir, force)) != GO)
        return ec;
    snprintf(cuname, sizeof cuname, "%s.cu", n.pkg);
    if ((ec = write_emitted(cli, &n, "kernel.json", emit_manifest)) != GO ||
        (ec = write_emitted(cli, &n, cuname, emit_source)) != GO ||
        (ec = write_emitted(cli, &n, "README.md", emit_readme)) != GO)
        return ec;
    init_report(cli, &n, cuname);
    return TK_EXIT_OK;
}
