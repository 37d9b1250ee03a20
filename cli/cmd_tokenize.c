/*
 * cmd_tokenize.c — tk tokenize / tk detokenize: a model directory's tokenizer.json on the command
 * line, through tk_tokenizer_*. The ids print comma-separated, so one command's output is the
 * other's input.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const char *const TOK_USAGE = "tk tokenize [--json] [--no-special] [--tokens] DIR TEXT";
static const char *const DETOK_USAGE = "tk detokenize [--json] [--skip-special] DIR ID,ID,...";

/* Reports a failed call. Malformed files and input are exit 1, not 2: 2 is for the command line. */
static int fail(tk_cli *cli, int rc)
{
    const char *msg = tk_last_error();
    return tk_cli_errorf(cli, rc, rc == TK_ERR_INVALID ? TK_EXIT_FAIL : 0, "%s", msg && *msg ? msg : tk_status_str(rc));
}

/* TEXT "-" reads standard input (all of it). */
static char *read_stdin(size_t *n)
{
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    while (b) {
        size_t k = fread(b + len, 1, cap - len, stdin);
        len += k;
        if (len < cap) {
            if (ferror(stdin)) {
                free(b);
                return NULL;
            }
            break;
        }
        char *nb = realloc(b, cap *= 2);
        if (!nb)
            free(b);
        b = nb;
    }
    *n = len;
    return b;
}

int tk_cmd_tokenize(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL, *text = NULL;
    int special = 1, tokens = 0, opts = 1;
    for (int i = 1; i < argc; i++) {
        if (opts && !strcmp(argv[i], "--")) {
            opts = 0;
        } else if (!opts) {
            if (!dir)
                dir = argv[i];
            else if (!text)
                text = argv[i];
            else
                return tk_cli_usage(TOK_USAGE, "one TEXT argument (quote it, or give '-' for stdin)");
        } else if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n"
                   "\n"
                   "Encodes TEXT with the tokenizer of a Hugging Face model directory (DIR/tokenizer.json,\n"
                   "or DIR may name the file) and prints the token ids, comma-separated, ready for\n"
                   "'tk detokenize'. The ids are those of the Hugging Face tokenizers library:\n"
                   "normalizer, pre-tokenizer, BPE/WordPiece model and post-processor as the file says.\n"
                   "TEXT '-' reads standard input. Truncation and padding settings are ignored.\n"
                   "\n"
                   "options:\n"
                   "  --no-special  no special tokens from the post-processor (BERT's [CLS]/[SEP],\n"
                   "                Llama's <s>): encode(add_special_tokens=False)\n"
                   "  --tokens      one line per token: id, a tab, the token's text\n"
                   "  --json        {\"ids\": [...], \"tokens\": [...]} on stdout\n"
                   "  --            ends the options: for a TEXT that starts with '-'\n"
                   "\n"
                   "examples:\n"
                   "  tk tokenize ./all-MiniLM-L6-v2 'Hello, world!'      101,7592,1010,2088,999,102\n"
                   "  tk detokenize ./all-MiniLM-L6-v2 $(tk tokenize ./all-MiniLM-L6-v2 hi)\n"
                   "\n"
                   "exit status: 0 ok, 1 a malformed tokenizer.json, or a text that is not UTF-8;\n"
                   "2 usage; 3 no tokenizer.json there; 8 a tokenizer.json tk does not implement.\n",
                   TOK_USAGE);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--no-special")) {
            special = 0;
        } else if (!strcmp(argv[i], "--tokens")) {
            tokens = 1;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            return tk_cli_usage(TOK_USAGE, "unknown option '%s'", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else if (!text) {
            text = argv[i];
        } else {
            return tk_cli_usage(TOK_USAGE, "one TEXT argument (quote it, or give '-' for stdin)");
        }
    }
    if (!dir || !text)
        return tk_cli_usage(TOK_USAGE, "a model directory and a text, e.g. tk tokenize ./gpt2 'Hello'");
    tk_tokenizer *tok = NULL;
    int rc = tk_tokenizer_load(&tok, dir);
    if (rc != TK_OK)
        return fail(cli, rc);
    char *in = NULL;
    size_t len = strlen(text);
    if (!strcmp(text, "-")) {
        if (!(in = read_stdin(&len))) {
            tk_tokenizer_free(tok);
            return tk_cli_errorf(cli, TK_ERR_IO, TK_EXIT_IO, "cannot read standard input: %s", strerror(errno));
        }
        text = in;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    rc = tk_tokenizer_encode(&ids, &n, tok, text, len, special);
    free(in);
    if (rc != TK_OK) {
        tk_tokenizer_free(tok);
        return fail(cli, rc);
    }
    if (cli->json) {
        printf("{\"ids\": [");
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", (int)ids[i]);
        printf("], \"tokens\": [");
        for (size_t i = 0; i < n; i++) {
            const char *t = tk_tokenizer_token(tok, ids[i]);
            printf("%s", i ? ", " : "");
            tk_cli_json_str(stdout, t ? t : "");
        }
        printf("]}\n");
    } else if (tokens) {
        for (size_t i = 0; i < n; i++) {
            const char *t = tk_tokenizer_token(tok, ids[i]);
            printf("%d\t%s\n", (int)ids[i], t ? t : "");
        }
    } else {
        for (size_t i = 0; i < n; i++)
            printf("%s%d", i ? "," : "", (int)ids[i]);
        printf("\n");
    }
    tk_free(ids);
    tk_tokenizer_free(tok);
    return TK_EXIT_OK;
}

/* "1,2, 3" or "1 2 3" (as one argument or several) → ids. On a bad id (not out of memory) *bad_arg
 * is the argument holding it and *bad points at it. */
static int parse_ids(int32_t **out, size_t *n, char **args, int nargs, const char **bad_arg, const char **bad)
{
    size_t cap = 64;
    int32_t *v = malloc(cap * sizeof *v);
    *n = 0;
    if (!v)
        return -1;
    for (int a = 0; a < nargs; a++) {
        const char *p = args[a];
        while (*p) {
            while (*p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '[' || *p == ']')
                p++;
            if (!*p)
                break;
            char *end;
            errno = 0;
            long x = strtol(p, &end, 10);
            if (end == p || errno || x < INT32_MIN || x > INT32_MAX ||
                (*end && *end != ',' && *end != ' ' && *end != '\t' && *end != '\n' && *end != ']')) {
                *bad_arg = args[a];
                *bad = p;
                free(v);
                return -1;
            }
            if (*n == cap) {
                int32_t *nv = realloc(v, (cap *= 2) * sizeof *v);
                if (!nv) {
                    free(v);
                    return -1;
                }
                v = nv;
            }
            v[(*n)++] = (int32_t)x;
            p = end;
        }
    }
    *out = v;
    return 0;
}

int tk_cmd_detokenize(tk_cli *cli, int argc, char **argv)
{
    const char *dir = NULL;
    int skip = 0;
    char **idargs = calloc((size_t)argc + 1, sizeof *idargs);
    int nid = 0, opts = 1;
    if (!idargs)
        return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory");
    for (int i = 1; i < argc; i++) {
        if (opts && !strcmp(argv[i], "--")) {
            opts = 0;
        } else if (!opts) {
            if (!dir)
                dir = argv[i];
            else
                idargs[nid++] = argv[i];
        } else if (tk_cli_is_help(argv[i])) {
            printf("usage: %s\n"
                   "\n"
                   "Decodes token ids with the tokenizer of a Hugging Face model directory\n"
                   "(DIR/tokenizer.json, or DIR may name the file) and prints the text, as the tokenizers\n"
                   "library's decode() does (its decoder: byte-level, metaspace, WordPiece, byte\n"
                   "fallback, ...). The ids are comma- or space-separated, in one or more arguments.\n"
                   "\n"
                   "options:\n"
                   "  --skip-special  leave out special tokens: decode(skip_special_tokens=True)\n"
                   "  --json          {\"text\": \"...\"} on stdout\n"
                   "  --              ends the options (negative ids are read as ids anyway)\n"
                   "\n"
                   "example:\n"
                   "  tk detokenize ./all-MiniLM-L6-v2 101,7592,1010,2088,999,102   [CLS] hello, world! [SEP]\n"
                   "\n"
                   "exit status: 0 ok, 1 an id outside the vocabulary or a malformed tokenizer.json;\n"
                   "2 usage; 3 no tokenizer.json there; 8 a tokenizer.json tk does not implement.\n",
                   DETOK_USAGE);
            free(idargs);
            return TK_EXIT_OK;
        } else if (!strcmp(argv[i], "--skip-special")) {
            skip = 1;
        } else if (argv[i][0] == '-' && !(argv[i][1] >= '0' && argv[i][1] <= '9')) {
            free(idargs);
            return tk_cli_usage(DETOK_USAGE, "unknown option '%s'", argv[i]);
        } else if (!dir) {
            dir = argv[i];
        } else {
            idargs[nid++] = argv[i];
        }
    }
    if (!dir || nid == 0) {
        free(idargs);
        return tk_cli_usage(DETOK_USAGE, "a model directory and ids, e.g. tk detokenize ./gpt2 15496,995");
    }
    int32_t *ids = NULL;
    size_t n = 0;
    const char *bad_arg = NULL, *bad = NULL;
    if (parse_ids(&ids, &n, idargs, nid, &bad_arg, &bad) != 0) {
        free(idargs);
        if (!bad)
            return tk_cli_errorf(cli, TK_ERR_NOMEM, 0, "out of memory");
        return tk_cli_usage(DETOK_USAGE,
                            "'%s' is not a list of token ids (at '%.20s'): ids are integers separated "
                            "by commas, e.g. 101,7592,102",
                            bad_arg, bad);
    }
    free(idargs);
    tk_tokenizer *tok = NULL;
    char *text = NULL;
    int rc = tk_tokenizer_load(&tok, dir);
    if (rc == TK_OK)
        rc = tk_tokenizer_decode(&text, tok, ids, n, skip);
    free(ids);
    tk_tokenizer_free(tok);
    if (rc != TK_OK)
        return fail(cli, rc);
    if (cli->json) {
        printf("{\"text\": ");
        tk_cli_json_str(stdout, text);
        printf("}\n");
    } else {
        printf("%s\n", text);
    }
    tk_free(text);
    return TK_EXIT_OK;
}
