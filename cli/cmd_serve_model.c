/*
 * cmd_serve_model.c — tk serve-model: an OpenAI-compatible HTTP server over one checkpoint
 * (tk_model_server_* in tk.h, serve/ in libtkhub-serve). Prints the URL on stdout once it listens, logs
 * a line per request to stderr, and drains on SIGINT/SIGTERM: running requests finish (bounded by
 * --drain), then it exits 0.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static const char *USAGE = "tk serve-model DIR [--listen HOST:PORT] [--parallel N] [--api-key KEY | --api-key-file F] "
                           "[--tp N [--tp-plan FILE]] [options]";

static void help(void)
{
    printf("usage: %s\n"
           "\n"
           "Serves the causal language model in the Hugging Face checkpoint directory DIR (config.json,\n"
           "*.safetensors, tokenizer.json; LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,\n"
           "Qwen3ForCausalLM, Olmo2ForCausalLM, GraniteForCausalLM, SmolLM3ForCausalLM,\n"
           "GemmaForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, MixtralForCausalLM,\n"
           "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, GPT2LMHeadModel)\n"
           "over OpenAI's HTTP API, so the openai client, curl, LangChain or Open WebUI can\n"
           "use it. One scheduler thread runs continuous batching over a paged KV cache: requests join the\n"
           "running batch at the next step and leave it as soon as they end; prompts that start alike share\n"
           "their KV blocks (prefix cache). Generation defaults come from the checkpoint's\n"
           "generation_config.json. A diffusion checkpoint (LLaDA, Dream, DiffusionGemma) is batched\n"
           "too: each denoising step runs every running request's canvas in one forward; max_tokens is\n"
           "its gen_length, with the extensions steps, block_length, cfg_scale, remasking and alg\n"
           "(DiffusionGemma: steps, t_min, t_max, entropy_bound, confidence_threshold and\n"
           "stability_threshold; docs/serving.md). The URL prints on stdout once the\n"
           "server listens (the model then loads: GET /health answers 503 until it is ready). SIGINT or\n"
           "SIGTERM drains: no new requests, running ones finish (at most --drain seconds), exit 0. See\n"
           "docs/serving.md.\n"
           "\n"
           "Endpoints:\n"
           "  POST /v1/chat/completions   chat with the checkpoint's chat template; \"stream\": true for SSE\n"
           "  POST /v1/completions        a prompt (text, or token ids) continued; streams too\n"
           "  GET  /v1/models             the served model (its name: --model-name)\n"
           "  GET  /health                200 ready, 503 loading or shutting down (no API key needed)\n"
           "  GET  /metrics               Prometheus text (with --metrics)\n"
           "  POST /tokenize, /detokenize {\"content\": TEXT} -> {\"tokens\": [...]}, and back\n"
           "Errors have OpenAI's shape {\"error\": {\"message\", \"type\", \"param\", \"code\"}}: 400 bad JSON or\n"
           "parameter (named), 401 bad or missing key, 404 unknown route or model, 413 body too large,\n"
           "429 queue full, 503 loading or shutting down, 500 a bug in tk.\n"
           "\n"
           "options:\n"
           "  --listen HOST:PORT     address to bind (default 127.0.0.1:0: a free port, printed)\n"
           "  --model-name NAME      the model id clients send and /v1/models lists (default: DIR's name)\n"
           "  --parallel N           sequences decoded at once (default 4); a request with n choices takes n\n"
           "  --max-queue N          requests waiting for a slot before 429 (default 64)\n"
           "  --ctx-size N           prompt + completion tokens of one sequence (default: the model's\n"
           "                         positions); the KV cache holds N x --parallel tokens at most\n"
           "  --api-key KEY          require 'Authorization: Bearer KEY'\n"
           "  --api-key-file F       the same, with the key read from the first line of F\n"
           "  --device cpu|cuda[:N]  where the model runs (default cpu)\n"
           "  --dtype f32|bf16|f16   compute dtype (default f32 on the CPU, bf16 on a GPU)\n"
           "  --kv-dtype DT          KV cache dtype: the compute dtype (default), f16 / bf16 under an f32\n"
           "                         model on the CPU, i8 or fp8_e4m3\n"
           "  --max-step-tokens N    prompt tokens one step prefills; longer prompts go in chunks so they\n"
           "                         never stall the running streams (default 512)\n"
           "  --no-prefix-cache      do not reuse the KV blocks of earlier prompts\n"
           "  --metrics              serve GET /metrics\n"
           "  --threads N            HTTP threads (default 4)\n"
           "  --max-connections N    open connections (default 1024)\n"
           "  --timeout S            close a connection idle for S seconds, or still sending its request\n"
           "                         after S seconds (default 30)\n"
           "  --max-body BYTES       largest request body (default 4194304); larger gets 413\n"
           "  --drain S              on SIGINT/SIGTERM, running requests get S seconds (default 30)\n"
           "  --tp N                 tensor parallelism over N ranks started by mpirun -np N: rank 0\n"
           "                         serves HTTP and sends each step's new requests and cancellations to\n"
           "                         the others; every rank runs the same forward on its slice of the\n"
           "                         weights, and the answers are one process's (Llama, Mistral, Qwen2,\n"
           "                         Qwen3, OLMo2, Gemma 1-3, Granite, SmolLM3, Phi-3, Mixtral,\n"
           "                         Qwen2/3-MoE, and GPT-2 with --tp-plan, on the CPU or with --device\n"
           "                         cuda on GPUs, NCCL or MPI as tk generate --help says; docs/parallel.md).\n"
           "                         SIGTERM to rank 0, or Ctrl-C to mpirun, drains and ends every rank\n"
           "  --tp-plan FILE         the tensor-parallel plan (transformers' tp_plan JSON) instead of\n"
           "                         config.json's or the architecture's default\n"
           "  --json                 print {\"url\": ...} instead of the bare URL\n"
           "\n"
           "example:\n"
           "  tk serve-model ./TinyLlama --listen 127.0.0.1:8000 --parallel 8 --metrics &\n"
           "  mpirun -np 2 tk serve-model ./TinyLlama --tp 2 --listen 127.0.0.1:8000 &\n"
           "  curl -s http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\\n"
           "    -d '{\"model\": \"TinyLlama\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}]}'\n"
           "\n"
           "exit status: 0 stopped by a signal after draining, 1 the model failed to load, 2 usage, 3 no such\n"
           "directory, 6 the address cannot be bound, 7 no GPU for --device cuda.\n",
           USAGE);
}

static int num_arg(long long *out, const char *opt, const char *v, long long lo, long long hi)
{
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < lo || n > hi)
        return tk_cli_usage(USAGE, "%s needs a whole number from %lld to %lld (got '%s')", opt, lo, hi, v);
    *out = n;
    return 0;
}

static void log_line(void *user, int level, const char *msg)
{
    tk_cli *cli = user;
    if (cli->quiet && level < TK_LOG_WARN)
        return;
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ ", &tm);
    /* one fwrite per line: lines from the server's threads never mix */
    char line[1400];
    int n = snprintf(line, sizeof line, "%s%s%s\n", ts, level >= TK_LOG_WARN ? "warning: " : "", msg);
    if (n > 0)
        fwrite(line, 1, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1, stderr);
}

/* The running server, for the signal handler: tk_model_server_stop is async-signal-safe (a write to a
 * pipe), so it works whichever thread the signal lands on (OpenBLAS starts its own threads before
 * main, so a signal mask cannot steer SIGTERM away from them). */
static tk_model_server *volatile running;
static volatile sig_atomic_t got_signal;

static void on_signal(int sig)
{
    got_signal = sig;
    if (running)
        tk_model_server_stop(running);
}

/* --tp: ranks 1..N-1 replay rank 0's scheduler. A signal does not stop them: rank 0 drains, then tells
 * them to end (mpirun hands Ctrl-C to every rank). A failure exits non-zero, and mpirun ends the job. */
static int follow(tk_cli *cli, tk_ctx *ctx, tk_model_server_opts *o)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int rc = tk_model_server_follow(ctx, o);
    tk_comm_free(o->comm);
    return rc == TK_OK ? TK_EXIT_OK : tk_cli_fail(cli, rc, o->model_dir);
}

static int serve(tk_cli *cli, tk_ctx *ctx, tk_model_server_opts *o0);

int tk_cmd_serve_model(tk_cli *cli, int argc, char **argv)
{
    tk_model_server_opts o = TK_MODEL_SERVER_OPTS_INIT;
    const char *device = "cpu", *key_file = NULL;
    int tp = 0;
    char key[512];
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (tk_cli_is_help(a)) {
            help();
            return TK_EXIT_OK;
        }
        if (a[0] != '-') {
            if (o.model_dir)
                return tk_cli_usage(USAGE, "unexpected argument '%s' (one checkpoint directory per server)", a);
            o.model_dir = a;
            continue;
        }
        if (!strcmp(a, "--metrics")) {
            o.metrics = 1;
            continue;
        }
        if (!strcmp(a, "--no-prefix-cache")) {
            o.prefix_cache = 0;
            continue;
        }
        if (!strcmp(a, "--tp")) {
            int u = tk_cli_tp_parse(USAGE, i + 1 < argc ? argv[++i] : NULL, &tp);
            if (u)
                return u;
            continue;
        }
        if (i + 1 >= argc)
            return tk_cli_usage(USAGE, "%s needs a value", a);
        const char *v = argv[++i];
        long long n = 0;
        int u = 0;
        if (!strcmp(a, "--listen"))
            o.listen = v;
        else if (!strcmp(a, "--model-name"))
            o.model_name = v;
        else if (!strcmp(a, "--api-key"))
            o.api_key = v;
        else if (!strcmp(a, "--api-key-file"))
            key_file = v;
        else if (!strcmp(a, "--device"))
            device = v;
        else if (!strcmp(a, "--dtype"))
            o.dtype = v;
        else if (!strcmp(a, "--kv-dtype"))
            o.kv_dtype = v;
        else if (!strcmp(a, "--parallel"))
            u = num_arg(&n, a, v, 1, 4096), o.parallel = (unsigned)n;
        else if (!strcmp(a, "--max-queue"))
            u = num_arg(&n, a, v, 1, 1000000), o.max_queue = (unsigned)n;
        else if (!strcmp(a, "--ctx-size"))
            u = num_arg(&n, a, v, 2, 1LL << 30), o.ctx_size = n;
        else if (!strcmp(a, "--max-step-tokens"))
            u = num_arg(&n, a, v, 1, 1LL << 30), o.max_step_tokens = n;
        else if (!strcmp(a, "--threads"))
            u = num_arg(&n, a, v, 1, 1024), o.threads = (unsigned)n;
        else if (!strcmp(a, "--max-connections"))
            u = num_arg(&n, a, v, 1, 1000000), o.max_connections = (unsigned)n;
        else if (!strcmp(a, "--timeout"))
            u = num_arg(&n, a, v, 1, 86400), o.timeout_s = (unsigned)n;
        else if (!strcmp(a, "--max-body"))
            u = num_arg(&n, a, v, 1024, 1LL << 40), o.max_body = n;
        else if (!strcmp(a, "--drain"))
            u = num_arg(&n, a, v, 1, 86400), o.drain_s = (unsigned)n;
        else if (!strcmp(a, "--tp-plan"))
            o.tp_plan = v;
        else
            return tk_cli_usage(USAGE, "unknown option '%s' (see tk serve-model --help)", a);
        if (u)
            return u;
    }
    if (!o.model_dir)
        return tk_cli_usage(USAGE, "a checkpoint directory, e.g. tk serve-model ./TinyLlama");
    if (o.api_key && key_file)
        return tk_cli_usage(USAGE, "give --api-key or --api-key-file, not both");
    if (o.tp_plan && !tp)
        return tk_cli_usage(USAGE, "--tp-plan goes with --tp N");
    if (key_file) {
        FILE *f = fopen(key_file, "r");
        if (!f)
            return tk_cli_errorf(cli, TK_ERR_NOT_FOUND, 0, "cannot read the API key file %s: %s", key_file,
                                 strerror(errno));
        int got = fgets(key, sizeof key, f) != NULL;
        fclose(f);
        key[strcspn(key, "\r\n")] = '\0';
        if (!got || !key[0])
            return tk_cli_errorf(cli, TK_ERR_INVALID, TK_EXIT_USAGE,
                                 "the API key file %s is empty\nHINT: put the "
                                 "key on its first line",
                                 key_file);
        o.api_key = key;
    }
    int id;
    if (tk_cli_parse_device(device, &id))
        return tk_cli_usage(USAGE, "--device wants cpu, cuda or cuda:N, got '%s'", device);
    o.device_type = id < 0 ? TK_DEV_CPU : TK_DEV_CUDA;
    o.device_id = id < 0 ? 0 : id;
    o.log = log_line;
    o.log_user = cli;
    tk_ctx *ctx = tk_cli_ctx(cli);
    if (!ctx)
        return cli->ctx_exit ? cli->ctx_exit : TK_EXIT_FAIL;
    if (tp) {
        tk_comm *comm = NULL;
        int ec = tk_cli_tp_join(cli, &comm, tp, device, &o.device_id);
        if (ec)
            return ec;
        o.comm = comm;
        if (tk_comm_rank(comm) != 0)
            return follow(cli, ctx, &o);
    }
    int ec = serve(cli, ctx, &o);
    tk_comm_free(o.comm);
    return ec;
}

/* Rank 0 (or the one process): the HTTP server. */
static int serve(tk_cli *cli, tk_ctx *ctx, tk_model_server_opts *o0)
{
    tk_model_server_opts o = *o0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN; /* a client that hangs up never kills the process */
    sigaction(SIGPIPE, &sa, NULL);
    tk_model_server *srv = NULL;
    int rc = tk_model_server_new(&srv, ctx, &o);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, NULL);
    running = srv;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    const char *listen = o.listen ? o.listen : "127.0.0.1:0";
    const char *colon = strrchr(listen, ':');
    char host[300], url[400];
    snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    if (!host[0] || !strcmp(host, "0.0.0.0") || !strcmp(host, "*"))
        snprintf(host, sizeof host, "127.0.0.1");
    else if (!strcmp(host, "[::]"))
        snprintf(host, sizeof host, "[::1]");
    snprintf(url, sizeof url, "http://%s:%d", host, tk_model_server_port(srv));
    int ranks = o.comm ? tk_comm_size(o.comm) : 1;
    if (cli->json && ranks > 1)
        printf("{\"url\": \"%s\", \"tensor_parallel\": %d}\n", url, ranks);
    else if (cli->json)
        printf("{\"url\": \"%s\"}\n", url);
    else
        printf("%s\n", url);
    fflush(stdout);
    char split[64] = "";
    if (ranks > 1)
        snprintf(split, sizeof split, " split over %d ranks", ranks);
    fprintf(stderr, "tk serve-model: serving %s%s on %s (loading the model; stop with Ctrl-C)\n", o.model_dir, split,
            url);
    rc = tk_model_server_run(srv);
    if (got_signal)
        fprintf(stderr, "tk serve-model: %s, stopped after draining\n",
                got_signal == SIGINT ? "interrupted" : "terminated");
    running = NULL;
    tk_model_server_free(srv);
    if (rc != TK_OK)
        return tk_cli_fail(cli, rc, o.model_dir);
    return TK_EXIT_OK;
}
