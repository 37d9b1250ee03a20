/*
 * model.c — loading a checkpoint directory, its weights and activations, and the public tk_model_* API.
 *
 * Load: config.json picks the family (llama.c, gpt2.c, bert.c); the safetensors files are mapped; the
 * family looks up each weight by its Hugging Face name through tk_models__weight, which checks shape
 * and dtype and converts once to the compute dtype (a CPU weight whose dtype already matches stays a
 * view into the mapping; on a GPU every weight is uploaded once). Forward: the batch's inputs and every
 * activation are carved out of one arena planned for the batch shape (T tokens, nseq sequences) and
 * kept until the shape changes; the family's forward then runs one tk_op_run per step.
 */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/kv_cache.h"
#include "models/models.h"

#define MODEL_MAGIC 0x6d6f646cu /* "modl" */

static size_t dt_size(tk_dtype dt) { return dt.bits / 8u; }

static tk_dtype dt_of(uint8_t code, uint8_t bits)
{
    tk_dtype d = {code, bits, 1};
    return d;
}

/* The safetensors dtype that holds a compute dtype unchanged. */
static tk_st_dtype st_of(tk_dtype dt)
{
    if (dt.code == TK_DL_BFLOAT)
        return TK_ST_BF16;
    return dt.bits == 16 ? TK_ST_F16 : TK_ST_F32;
}

static const char *torch_name(tk_st_dtype dt)
{
    switch (dt) {
    case TK_ST_F32: return "float32";
    case TK_ST_F16: return "float16";
    case TK_ST_BF16: return "bfloat16";
    case TK_ST_F64: return "float64";
    case TK_ST_F8_E4M3: return "float8_e4m3fn";
    case TK_ST_F8_E5M2: return "float8_e5m2";
    default: return "?";
    }
}

static int is_float_st(tk_st_dtype dt)
{
    return dt == TK_ST_F32 || dt == TK_ST_F16 || dt == TK_ST_BF16 || dt == TK_ST_F64 || dt == TK_ST_F8_E4M3 ||
           dt == TK_ST_F8_E5M2 || dt == TK_ST_I8;
}

static void mt_set(tk_mt *t, void *data, tk_dtype dt, int ndim, const int64_t *shape, int dev_type, int dev_id)
{
    memset(t, 0, sizeof *t);
    t->t.data = data;
    t->t.device.device_type = dev_type;
    t->t.device.device_id = dev_id;
    t->t.ndim = ndim;
    t->t.dtype = dt;
    for (int i = 0; i < ndim; i++)
        t->shape[i] = shape[i];
    t->t.shape = t->shape;
}

static int64_t numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

void tk_models__view(tk_mt *v, const tk_mt *t, int ndim, const int64_t *shape)
{
    mt_set(v, t->t.data, t->t.dtype, ndim, shape, t->t.device.device_type, t->t.device.device_id);
}

void tk_models__rows(tk_mt *v, const tk_mt *t, int64_t r0, int64_t nr)
{
    int64_t row = numel(t->t.ndim - 1, t->shape + 1) * (int64_t)dt_size(t->t.dtype);
    int64_t shape[4];
    memcpy(shape, t->shape, sizeof shape);
    shape[0] = nr;
    mt_set(v, (char *)t->t.data + r0 * row, t->t.dtype, t->t.ndim, shape, t->t.device.device_type,
           t->t.device.device_id);
}

int tk_models__op(tk_model *m, const char *op, const tk_arg *args, size_t nargs)
{
    int rc = tk_op_run(m->ctx, op, args, nargs, NULL, NULL);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "%s forward, op %s", m->arch->name, op);
    return TK_OK;
}

/* ---- device memory ---------------------------------------------------------------------------- */

static int dev_alloc(tk_model *m, void **p, size_t bytes)
{
    *p = NULL;
    if (m->dev_type == TK_DEV_CUDA)
        return tk_device_alloc(p, m->dev_id, bytes ? bytes : 1);
    *p = tk_models__hw_malloc((bytes + 63) / 64 * 64 + 64); /* 64-byte aligned at least */
    return *p ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory (%zu bytes for the model)", bytes);
}

static void dev_free(tk_model *m, void *p)
{
    if (!p)
        return;
    if (m->dev_type == TK_DEV_CUDA)
        tk_device_free(p, m->dev_id);
    else
        free(p);
}

/* A weight's host buffer before place(): on the CPU the weight's own memory, in huge pages when it is
 * 2 MiB or more (models/host_weights.c); on a GPU a staging copy, freed after the upload. */
static void *host_buf(const tk_model *m, size_t n, int zero)
{
    if (m->dev_type == TK_DEV_CUDA)
        return zero ? calloc(n ? n : 1, 1) : malloc(n ? n : 1);
    return zero ? tk_models__hw_calloc(n) : tk_models__hw_malloc(n);
}

/* Copies host bytes to the model's memory (a memcpy on the CPU). */
static int to_dev(tk_model *m, void *dst, const void *src, size_t n)
{
    if (m->dev_type == TK_DEV_CUDA)
        return tk_device_copy(dst, src, n, TK_COPY_H2D, m->dev_id);
    memcpy(dst, src, n);
    return TK_OK;
}

static int from_dev(tk_model *m, void *dst, const void *src, size_t n)
{
    if (m->dev_type == TK_DEV_CUDA)
        return tk_device_copy(dst, src, n, TK_COPY_D2H, m->dev_id);
    memcpy(dst, src, n);
    return TK_OK;
}

static int host_tmp(tk_model *m, size_t bytes)
{
    if (m->host_tmp_bytes >= bytes)
        return TK_OK;
    free(m->host_tmp);
    m->host_tmp = malloc(bytes);
    m->host_tmp_bytes = m->host_tmp ? bytes : 0;
    return m->host_tmp ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory (%zu bytes)", bytes);
}

/* ---- weights ---------------------------------------------------------------------------------- */

static int new_weight(tk_model *m, tk_models_weight **out)
{
    *out = NULL;
    if (m->nw == m->capw) {
        size_t cap = m->capw ? 2 * m->capw : 64;
        tk_models_weight **nw = realloc(m->w, cap * sizeof *nw);
        if (!nw)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        m->w = nw;
        m->capw = cap;
    }
    tk_models_weight *w = calloc(1, sizeof *w);
    if (!w)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->w[m->nw++] = w;
    *out = w;
    return TK_OK;
}

static int set_src(tk_models_weight *w, int kind, const char *const *names, int n, int64_t rows, int64_t cols,
                   int64_t c0, int64_t nc)
{
    w->src.kind = kind;
    w->src.rows = rows;
    w->src.cols = cols;
    w->src.c0 = c0;
    w->src.nc = nc;
    for (int i = 0; i < n && i < TK_MODELS_SRC_MAX; i++) {
        if (!(w->src.names[i] = tk__strdup(names[i])))
            return tk__err(TK_ERR_NOMEM, "out of memory");
        w->src.n = i + 1;
    }
    return TK_OK;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap)
        snprintf(out + k, cap - k, "]");
}

/* Finds `name` and checks its shape against want (-1: any) and its dtype against the config. */
static int find_checked(const tk_st_tensor **out, tk_model *m, const char *name, int ndim, const int64_t *want,
                        int optional)
{
    *out = NULL;
    char own[256];
    if (m->cfg.weight_name) /* the checkpoint names its weights its own way (LLaDA) */
        name = m->cfg.weight_name(own, sizeof own, name);
    const tk_st_tensor *t = tk_models__st_find(m->st, name);
    if (!t) {
        if (optional)
            return TK_OK;
        /* Name a close tensor of the checkpoint, to tell a prefix mix-up from a missing weight. */
        const char *best = NULL;
        size_t bd = (size_t)-1;
        for (size_t i = 0; i < tk_models__st_count(m->st); i++) {
            const char *n = tk_models__st_at(m->st, i)->name;
            size_t d = tk__edit_distance(name, n);
            if (d < bd) {
                bd = d;
                best = n;
            }
        }
        return tk__err(TK_ERR_INVALID,
                       "%s checkpoint '%s': tensor '%s' is missing (%zu tensors in the checkpoint%s%s%s)\n"
                       "HINT: the checkpoint does not match config.json's architecture %s",
                       m->cfg.arch, m->dir, name, tk_models__st_count(m->st), best ? ", the closest is '" : "",
                       best ? best : "", best ? "'" : "", m->cfg.arch);
    }
    int ok = t->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++)
        ok = want[d] < 0 || t->shape[d] == want[d];
    if (!ok) {
        char got[128], exp[128];
        shape_str(got, sizeof got, t->ndim, t->shape);
        shape_str(exp, sizeof exp, ndim, want);
        return tk__err(TK_ERR_INVALID, "%s checkpoint '%s': tensor '%s' has shape %s, want %s (from config.json)",
                       m->cfg.arch, t->file, name, got, exp);
    }
    if (!is_float_st(t->dtype))
        return tk__err(TK_ERR_INVALID, "%s checkpoint '%s': tensor '%s' has dtype %s, want a float weight", m->cfg.arch,
                       t->file, name, tk_models__st_dtype_name(t->dtype));
    if (m->cfg.torch_dtype[0] && strcmp(m->cfg.torch_dtype, torch_name(t->dtype)))
        return tk__err(TK_ERR_INVALID,
                       "%s checkpoint '%s': tensor '%s' is %s, but config.json says the weights are %s\n"
                       "HINT: the config and the weights disagree; re-save the checkpoint with save_pretrained",
                       m->cfg.arch, t->file, name, torch_name(t->dtype), m->cfg.torch_dtype);
    *out = t;
    return TK_OK;
}

/* Converts n elements at src (safetensors dtype sdt, elements `stride` apart in groups of `run`) to the
 * compute dtype into dst (host). Rows of `run` contiguous elements, `nrun` of them, `stride` elements
 * between row starts. */
/* What a loader does to a weight's values on the way in: v * mul + add (in double, one rounding to f32),
 * then one rounding to dt. {1, 0, compute dtype}: a plain conversion. */
typedef struct {
    double mul, add;
    tk_dtype dt;
} xform;

#define XF_NONE(m) (&(xform){1.0, 0.0, (m)->dtype})

static int xf_plain(const tk_model *m, const xform *x)
{
    return x->mul == 1.0 && x->add == 0.0 && x->dt.code == m->dtype.code && x->dt.bits == m->dtype.bits;
}

/* nrun runs of run elements of t, stride elements apart from element first, into dst (packed) through x. */
static int convert(tk_model *m, void *dst, const tk_st_tensor *t, int64_t first, int64_t run, int64_t nrun,
                   int64_t stride, const xform *x)
{
    size_t es = tk_models__st_dtype_size(t->dtype), ds = dt_size(x->dt);
    float *tmp = malloc(sizeof(float) * (size_t)(run ? run : 1));
    if (!tmp)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = TK_OK, plain = xf_plain(m, x);
    for (int64_t r = 0; r < nrun && rc == TK_OK; r++) {
        const char *src = (const char *)t->data + (size_t)(first + r * stride) * es;
        if (plain && t->dtype == st_of(m->dtype)) {
            memcpy((char *)dst + (size_t)(r * run) * ds, src, (size_t)run * ds);
            continue;
        }
        rc = tk_models__to_f32(tmp, src, (size_t)run, t->dtype);
        for (int64_t i = 0; rc == TK_OK && !plain && i < run; i++)
            tmp[i] = (float)((double)tmp[i] * x->mul + x->add);
        if (rc == TK_OK)
            tk_models__from_f32((char *)dst + (size_t)(r * run) * ds, tmp, (size_t)run, x->dt);
    }
    free(tmp);
    return rc;
}

/* Puts host memory `host` (owned, in the compute dtype) into weight w on the model's device. */
/* Puts host (ndim, shape of dtype dt) on the model's device as w's tensor; takes host. */
static int place_dt(tk_model *m, tk_models_weight *w, void *host, int ndim, const int64_t *shape, tk_dtype dt)
{
    size_t bytes = (size_t)numel(ndim, shape) * dt_size(dt);
    void *data = host;
    if (m->dev_type == TK_DEV_CUDA) {
        int rc = dev_alloc(m, &data, bytes);
        if (rc == TK_OK)
            rc = to_dev(m, data, host, bytes);
        free(host);
        if (rc != TK_OK) {
            dev_free(m, data);
            return tk__err_wrap(rc, "uploading the weights");
        }
    }
    w->owned = data;
    mt_set(&w->mt, data, dt, ndim, shape, m->dev_type, m->dev_id);
    m->weight_bytes += (int64_t)bytes;
    return TK_OK;
}

static int place(tk_model *m, tk_models_weight *w, void *host, int ndim, const int64_t *shape)
{
    return place_dt(m, w, host, ndim, shape, m->dtype);
}

/* ---- tensor parallelism: each rank's slices of the weights ---------------------------------------- */

const tk_tp_param *tk_models__tp_param(const tk_model *m, const char *name)
{
    if (!m->tp)
        return NULL;
    for (size_t i = 0; i < m->tp->plan->nparams; i++)
        if (!strcmp(m->tp->plan->params[i].name, name))
            return &m->tp->plan->params[i];
    return NULL;
}

/* The plan's entry for t when the plan splits it (NULL: every rank holds it whole). */
static const tk_tp_param *tp_split(const tk_model *m, const tk_st_tensor *t)
{
    const tk_tp_param *p = tk_models__tp_param(m, t->name);
    return p && p->dim >= 0 && m->tp->world > 1 ? p : NULL;
}

int tk_models__tp_check(tk_model *m, const char *layers, const tk_models_tp_want *want, size_t nwant, const char *embed,
                        const char *hint)
{
    const tk_tp_plan *p = m->tp->plan;
    size_t nl = strlen(layers);
    for (size_t i = 0; i < p->nparams; i++) {
        const tk_tp_param *t = &p->params[i];
        const char *n = t->name, *rest = NULL;
        int dim = -1, split = 1, known = 0;
        char g[512] = "";
        if (!strncmp(n, layers, nl)) {
            rest = strchr(n + nl, '.');
            if (rest) /* "mlp.experts.*.gate_proj.weight": an expert's tensor by its generic name */
                tk_models__tp_generic_name(g, sizeof g, rest + 1);
            for (size_t k = 0; rest && k < nwant; k++)
                if (!strcmp(rest + 1, want[k].name) || !strcmp(g, want[k].name)) {
                    dim = want[k].dim;
                    split = want[k].split;
                    known = 1;
                }
        }
        if (!strcmp(n, embed)) {
            m->tp->embed_split = t->dim == 0 && !strcmp(t->style, "embedding_rowwise");
            dim = m->tp->embed_split ? 0 : -1;
            known = 1;
        } else if (!strcmp(n, "lm_head.weight")) {
            m->tp->head_split = t->dim == 0 && !strncmp(t->style, "colwise", 7);
            dim = m->tp->head_split ? 0 : -1;
            known = 1;
        }
        if (t->dim != dim || (t->dim >= 0 && t->split != split))
            return tk__err(TK_ERR_UNSUPPORTED,
                           "%s: the tensor-parallel plan (%s) gives '%s' the style %s (rule '%s'), which tk does not "
                           "run%s\nHINT: tk splits %s as Megatron-LM does: %s, the rest whole; the input embedding "
                           "embedding_rowwise or whole, lm_head colwise_gather_output or whole (docs/parallel.md)",
                           m->cfg.arch, p->source, n, t->style, t->rule ? t->rule : "none", known ? "" : " split",
                           m->cfg.arch, hint);
    }
    if (m->cfg.tie_embeddings) { /* no lm_head tensor: the plan's rule for the module says */
        const char *st = NULL;
        for (size_t i = 0; i < p->nrules; i++)
            if (!strcmp(p->rules[i].key, "lm_head") || !strcmp(p->rules[i].key, "lm_head.weight"))
                st = p->rules[i].style;
        m->tp->head_split = st && !strncmp(st, "colwise", 7);
        if (m->tp->embed_split && !m->tp->head_split)
            return tk__err(TK_ERR_UNSUPPORTED,
                           "%s: the plan (%s) splits the embedding on the vocabulary but not "
                           "the LM head tied to it\nHINT: give lm_head colwise_gather_output, or the embedding "
                           "replicate",
                           m->cfg.arch, p->source);
    }
    return TK_OK;
}

/* Weight w, already in the compute dtype on the CPU as stored at data (n bytes inside t's mapping): copied
 * into the model's huge pages (models/host_weights.c; t's mapped pages are dropped), or with
 * map_weights (TK_MAP_WEIGHTS=1) a view of the mapping, loaded now. */
static int as_stored(tk_model *m, tk_models_weight *w, const tk_st_tensor *t, void *data, size_t n, int ndim,
                     const int64_t *shape)
{
    if (!m->map_weights) {
        char *p = tk_models__hw_alloc(&m->hw, n);
        if (!p)
            return tk__err(TK_ERR_NOMEM,
                           "out of memory loading '%s' (%zu bytes)\nHINT: TK_MAP_WEIGHTS=1 in the environment "
                           "reads the weights where the file is mapped instead of copying them",
                           t->name, n);
        /* 8 MiB at a time, each piece's mapped pages dropped once copied: the load's peak is the weights
         * plus 8 MiB, not plus the largest tensor (an embedding table of 65 MB added 68 MB to it) */
        for (size_t o = 0, piece = (size_t)8 << 20; o < n; o += piece) {
            size_t k = n - o < piece ? n - o : piece;
            memcpy(p + o, (const char *)data + o, k);
            tk_models__st_release_range((const char *)data + o, k);
        }
        tk_models__st_release(t); /* the pages the pieces' edges shared */
        mt_set(&w->mt, p, m->dtype, ndim, shape, TK_DEV_CPU, 0);
        m->hugepage_bytes += (int64_t)n;
    } else {
        mt_set(&w->mt, data, m->dtype, ndim, shape, TK_DEV_CPU, 0);
        tk_models__st_populate(data, n);
        w->mapped = 1;
        m->mapped_bytes += (int64_t)n;
    }
    m->weight_bytes += (int64_t)n;
    return TK_OK;
}

/* Converts rank's slice of t (split as p says: s) into dst in the compute dtype, reading only the slice's
 * byte runs of the mapping. */
static int tp_convert(tk_model *m, void *dst, const tk_st_tensor *t, const tk_tp_param *p, const tk_tp_slice *s,
                      const xform *x)
{
    size_t es = tk_models__st_dtype_size(t->dtype), ds = dt_size(x->dt);
    tk_tp_run runs[TK_TP_MAX_SPLIT];
    size_t nr = tk_models__tp_runs(runs, TK_TP_MAX_SPLIT, p, s, es);
    char *d = dst;
    int rc = TK_OK;
    if (nr == 1) /* a plain split: count pieces, stride apart */
        return convert(m, d, t, (int64_t)(runs[0].offset / es), (int64_t)(runs[0].bytes / es), runs[0].count,
                       (int64_t)(runs[0].stride / es), x);
    for (int64_t o = 0; nr && o < runs[0].count && rc == TK_OK; o++) /* packed: the blocks' pieces in turn */
        for (size_t i = 0; i < nr && rc == TK_OK; i++) {
            int64_t n = (int64_t)(runs[i].bytes / es);
            rc = convert(m, d, t, (int64_t)((runs[i].offset + (uint64_t)o * runs[i].stride) / es), n, 1, 0, x);
            d += (size_t)n * ds;
        }
    return rc;
}

/* Weight w is rank's slice of t through x (counted in the model's parameters when count): a view of the
 * mapping when the slice is one contiguous range already in the compute dtype and x changes nothing (a
 * split of dim 0 on the CPU), else converted into memory the weight owns. The vocabulary-parallel
 * embedding gets one more row, of zeros: the row of every id outside the rank's range
 * (tk_models_batch.tp_ids). */
static int tp_weight(const tk_mt **out, tk_model *m, tk_models_weight *w, const tk_st_tensor *t, const tk_tp_param *p,
                     const xform *x, int count)
{
    size_t es = tk_models__st_dtype_size(t->dtype), ds = dt_size(x->dt);
    tk_tp_slice s;
    int rc = tk_models__tp_slice(&s, p, m->tp->rank, m->tp->world, es);
    if (rc != TK_OK)
        return rc;
    int extra = !strcmp(p->style, "embedding_rowwise") && p->dim == 0 && t->ndim == 2;
    int64_t n = numel(t->ndim, s.shape), full = numel(t->ndim, t->shape);
    if (count)
        m->params += full;
    m->tp->full_bytes += full * (int64_t)ds;
    if (m->dev_type == TK_DEV_CPU && xf_plain(m, x) && t->dtype == st_of(m->dtype) && p->dim == 0 && p->split <= 1 &&
        !extra) {
        tk_tp_run run;
        tk_models__tp_runs(&run, 1, p, &s, es);
        *out = &w->mt;
        return as_stored(m, w, t, (char *)t->data + (s.nranges ? run.offset : 0), (size_t)n * ds, t->ndim, s.shape);
    }
    int64_t rowel = extra ? t->shape[1] : 0;
    char *host = host_buf(m, (size_t)(n + rowel) * ds + 1, 1);
    if (!host)
        return tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", t->name);
    if (s.nranges && (rc = tp_convert(m, host, t, p, &s, x)) != TK_OK) {
        free(host);
        return tk__err_wrap(rc, "tensor '%s'", t->name);
    }
    tk_models__st_release(t); /* a column slice read every page of t: the other ranks' columns too */
    if (extra)
        s.shape[0]++;
    if ((rc = place_dt(m, w, host, t->ndim, s.shape, x->dt)) != TK_OK)
        return tk__err_wrap(rc, "tensor '%s'", t->name);
    *out = &w->mt;
    return TK_OK;
}

/* A loader that cannot slice (a transformed or partial weight) refuses a tensor the plan splits. */
static int tp_refuse(const tk_model *m, const tk_st_tensor *t)
{
    const tk_tp_param *p = t ? tp_split(m, t) : NULL;
    if (!p)
        return TK_OK;
    return tk__err(TK_ERR_UNSUPPORTED,
                   "%s: the tensor-parallel plan splits '%s' (style %s, rule '%s'), which %s "
                   "transforms at load, so tk cannot split it\nHINT: run it in one process (without --tp)",
                   m->cfg.arch, t->name, p->style, p->rule ? p->rule : "", m->cfg.arch);
}

static int weight(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want, int optional)
{
    *out = NULL;
    const tk_st_tensor *t;
    int rc = find_checked(&t, m, name, ndim, want, optional);
    if (rc != TK_OK || !t)
        return rc;
    tk_models_weight *w;
    if ((rc = new_weight(m, &w)) != TK_OK)
        return rc;
    if ((rc = set_src(w, TK_MODELS_SRC_WHOLE, &name, 1, 0, 0, 0, 0)) != TK_OK)
        return rc;
    const tk_tp_param *tp = tp_split(m, t);
    if (tp)
        return tp_weight(out, m, w, t, tp, XF_NONE(m), 1);
    int64_t n = numel(t->ndim, t->shape);
    m->params += n;
    if (m->tp)
        m->tp->full_bytes += n * (int64_t)dt_size(m->dtype);
    if (m->dev_type == TK_DEV_CPU && t->dtype == st_of(m->dtype)) {
        *out = &w->mt;
        return as_stored(m, w, t, (void *)t->data, (size_t)n * dt_size(m->dtype), t->ndim, t->shape);
    }
    void *host = host_buf(m, (size_t)(n ? n : 1) * dt_size(m->dtype), 0);
    if (!host)
        return tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", name);
    if ((rc = convert(m, host, t, 0, n, 1, 0, XF_NONE(m))) != TK_OK) {
        free(host);
        return tk__err_wrap(rc, "tensor '%s'", name);
    }
    if ((rc = place(m, w, host, t->ndim, t->shape)) != TK_OK) /* place owns host from here */
        return tk__err_wrap(rc, "tensor '%s'", name);
    *out = &w->mt;
    return TK_OK;
}

int tk_models__weight(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want)
{
    return weight(out, m, name, ndim, want, 0);
}

int tk_models__weight_opt(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want)
{
    return weight(out, m, name, ndim, want, 1);
}

/* tk_models__weight_xf into dtype dt (the model's, or f32) */
static int weight_xf_dt(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want, double mul,
                        double add, int optional, int count, tk_dtype dt)
{
    *out = NULL;
    const tk_st_tensor *t;
    int rc = find_checked(&t, m, name, ndim, want, optional);
    if (rc != TK_OK || !t)
        return rc;
    tk_models_weight *w;
    if ((rc = new_weight(m, &w)) != TK_OK || (rc = set_src(w, TK_MODELS_SRC_WHOLE, &name, 1, 0, 0, 0, 0)) != TK_OK)
        return rc;
    const tk_tp_param *tp = tp_split(m, t);
    if (tp) /* the rank's slice, transformed as the whole would be: element for element the same values */
        return tp_weight(out, m, w, t, tp, &(xform){mul, add, dt}, count);
    int64_t n = numel(t->ndim, t->shape);
    if (m->tp)
        m->tp->full_bytes += n * (int64_t)dt_size(dt);
    float *f = malloc((size_t)(n ? n : 1) * sizeof(float));
    void *host = host_buf(m, (size_t)(n ? n : 1) * dt_size(dt), 0);
    if (!f || !host) {
        free(f);
        free(host);
        return tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", name);
    }
    if ((rc = tk_models__to_f32(f, t->data, (size_t)n, t->dtype)) != TK_OK) {
        free(f);
        free(host);
        return tk__err_wrap(rc, "tensor '%s'", name);
    }
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)((double)f[i] * mul + add);
    tk_models__from_f32(host, f, (size_t)n, dt);
    free(f);
    if ((rc = place_dt(m, w, host, t->ndim, t->shape, dt)) != TK_OK)
        return tk__err_wrap(rc, "tensor '%s'", name);
    if (count)
        m->params += n;
    *out = &w->mt;
    return TK_OK;
}

int tk_models__weight_vocab_rows(const tk_mt **out, tk_model *m, const char *name, double mul)
{
    *out = NULL;
    int64_t want[2] = {m->cfg.vocab, m->cfg.hidden};
    const tk_st_tensor *t;
    tk_models_weight *w;
    int rc = find_checked(&t, m, name, 2, want, 0);
    if (rc != TK_OK || (rc = new_weight(m, &w)) != TK_OK ||
        (rc = set_src(w, TK_MODELS_SRC_WHOLE, &name, 1, 0, 0, 0, 0)) != TK_OK)
        return rc;
    if (!m->tp || m->tp->world < 2) /* one process: the whole table */
        return tk__err(TK_ERR_INTERNAL, "tk_models__weight_vocab_rows without tensor parallelism ('%s')", name);
    /* the LM head's own split (colwise on the vocabulary: torch.chunk, as tp_setup's vocab_off) */
    tk_tp_param p = {(char *)name, "colwise", NULL, 0, 1, 2, {want[0], want[1]}, {0}};
    return tp_weight(out, m, w, t, &p, &(xform){mul, 0.0, m->dtype}, 0);
}

int tk_models__weight_xf(const tk_mt **out, tk_model *m, const char *name, int ndim, const int64_t *want, double mul,
                         double add, int optional, int count)
{
    if (mul == 1.0 && add == 0.0 && count) {
        *out = NULL;
        return weight(out, m, name, ndim, want, optional);
    }
    return weight_xf_dt(out, m, name, ndim, want, mul, add, optional, count, m->dtype);
}

int tk_models__norm_weight(const tk_mt **out, tk_model *m, const char *name, int64_t d, double offset)
{
    int64_t want[1] = {d};
    if (offset == 0.0)
        return tk_models__weight_xf(out, m, name, 1, want, 1, 0, 0, 1);
    return weight_xf_dt(out, m, name, 1, want, 1, offset, 0, 1, dt_of(TK_DL_FLOAT, 32));
}

/* The parts of a concatenated weight under tensor parallelism: each part's plan entry and slice, and
 * the rows and columns of a part's slice. */
typedef struct {
    int64_t rows, cols;
    tk_tp_slice *sl;
    const tk_tp_param **tp;
} cat_split;

/* Every part must be split as the first is (the same dimension, not packed): tk runs them as one. */
static int cat_slices(cat_split *cs, tk_model *m, const tk_st_tensor *const *ts, const char *const *names, int n)
{
    cs->sl = calloc((size_t)n, sizeof *cs->sl);
    cs->tp = calloc((size_t)n, sizeof *cs->tp);
    if (!cs->sl || !cs->tp)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int rc = TK_OK;
    for (int i = 0; i < n && rc == TK_OK; i++) {
        const tk_tp_param *p = cs->tp[i] = tp_split(m, ts[i]);
        if (!p || p->dim != cs->tp[0]->dim || p->split > 1)
            return tk__err(TK_ERR_UNSUPPORTED,
                           "%s: the tensor-parallel plan splits '%s' (%s) but not '%s' alike (tk runs them as one "
                           "fused weight)\nHINT: give them the same style",
                           m->cfg.arch, names[0], cs->tp[0]->style, names[i]);
        rc = tk_models__tp_slice(&cs->sl[i], p, m->tp->rank, m->tp->world, tk_models__st_dtype_size(ts[i]->dtype));
        cs->rows = cs->sl[i].shape[0];
        cs->cols = ts[i]->ndim > 1 ? cs->sl[i].shape[1] : 0;
    }
    return rc;
}

int tk_models__weight_cat(const tk_mt **out, tk_model *m, const char *const *names, int n, int64_t rows, int64_t cols)
{
    *out = NULL;
    int ndim = cols ? 2 : 1;
    int64_t want[2] = {rows, cols}, per = rows * (cols ? cols : 1);
    const tk_st_tensor **ts = n > 0 ? calloc((size_t)n, sizeof *ts) : NULL; /* a MoE layer's experts: 3 E */
    if (!ts)
        return tk__err(n > 0 ? TK_ERR_NOMEM : TK_ERR_INTERNAL, "weight_cat: %d tensors", n);
    int rc = TK_OK;
    for (int i = 0; i < n && rc == TK_OK; i++)
        rc = find_checked(&ts[i], m, names[i], ndim, want, 0);
    tk_models_weight *w;
    if (rc == TK_OK)
        rc = new_weight(m, &w);
    if (rc == TK_OK)
        rc = set_src(w, TK_MODELS_SRC_CAT, names, n, rows, cols, 0, 0);
    if (rc != TK_OK) {
        free(ts);
        return rc;
    }
    size_t ds = dt_size(m->dtype);
    /* tensor parallelism: each part's slice, all split alike (the rank's rows of gate_proj, then of
     * up_proj; each expert's down_proj on its columns) */
    cat_split cs = {rows, cols, NULL, NULL};
    if (rc == TK_OK && m->tp && tp_split(m, ts[0]))
        rc = cat_slices(&cs, m, ts, names, n);
    if (m->tp)
        m->tp->full_bytes += per * n * (int64_t)ds;
    int64_t lper = cs.rows * (cs.cols ? cs.cols : 1);
    char *host = rc == TK_OK ? host_buf(m, (size_t)(lper * n) * ds + 1, 0) : NULL;
    if (!host) {
        free(ts);
        free(cs.sl);
        free(cs.tp);
        return rc != TK_OK ? rc : tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", names[0]);
    }
    for (int i = 0; i < n && rc == TK_OK; i++)
        rc = cs.tp ? (cs.sl[i].nranges
                          ? tp_convert(m, host + (size_t)(lper * i) * ds, ts[i], cs.tp[i], &cs.sl[i], XF_NONE(m))
                          : TK_OK)
                   : convert(m, host + (size_t)(per * i) * ds, ts[i], 0, per, 1, 0, XF_NONE(m));
    for (int i = 0; rc == TK_OK && cs.tp && i < n; i++)
        tk_models__st_release(ts[i]); /* copied: its mapped pages need not stay resident */
    free(ts);
    free(cs.sl);
    free(cs.tp);
    int64_t shape[2] = {cs.rows * n, cs.cols};
    if (rc == TK_OK)
        rc = place(m, w, host, ndim, shape);
    else
        free(host);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "tensor '%s'", names[0]);
    m->params += per * n;
    *out = &w->mt;
    return TK_OK;
}

/* Block [*at, *at + *n) of t's dimension dim (total long: one of q|k|v) under tensor parallelism: when
 * the plan splits that dimension packed and the block is one of the plan's blocks (equal ones, or a
 * fused q|k|v's unequal ones), or plainly in equal blocks of *n with plain_ok, the rank's part of the
 * block (its heads of it); not split: unchanged; any other split is refused (tp_refuse). */
static int tp_block(const tk_model *m, const tk_st_tensor *t, const tk_tp_param *tp, int dim, int64_t total,
                    int plain_ok, int64_t *at, int64_t *n)
{
    int64_t bs[TK_TP_MAX_SPLIT], bl[TK_TP_MAX_SPLIT];
    int nb = tp && tp->dim == dim && tp->split > 1 ? tk_models__tp_blocks(tp, bs, bl) : 0, ok = 0;
    for (int b = 0; b < nb; b++)
        ok |= bs[b] == *at && bl[b] == *n;
    if (tp && tp->dim == dim && tp->split == 1 && plain_ok)
        ok = total % *n == 0 && *at % *n == 0;
    if (ok) {
        int64_t off;
        tk_models__tp_chunk(*n, m->tp->world, m->tp->rank, &off, n);
        *at += off;
        return TK_OK;
    }
    return tp_refuse(m, t);
}

int tk_models__weight_cols(const tk_mt **out, tk_model *m, const char *name, int64_t rows, int64_t cols, int64_t c0,
                           int64_t nc)
{
    *out = NULL;
    int ndim = rows ? 2 : 1;
    int64_t want[2] = {rows ? rows : cols, cols};
    const tk_st_tensor *t;
    int rc = find_checked(&t, m, name, ndim, want, 0);
    if (rc != TK_OK)
        return rc;
    /* tensor parallelism: a fused q|k|v split by a packed style takes the rank's part of each block
     * (its heads of q, of k, of v), and so does its 1-D bias, which the plan splits plainly (as
     * transformers' packed_colwise does) but which must follow its weight's heads; any other split of
     * it is refused */
    const tk_tp_param *tp = tp_split(m, t);
    int64_t full = nc;
    if ((rc = tp_block(m, t, tp, ndim - 1, cols, ndim == 1, &c0, &nc)) != TK_OK)
        return rc;
    tk_models_weight *w;
    if ((rc = new_weight(m, &w)) != TK_OK || (rc = set_src(w, TK_MODELS_SRC_COLS, &name, 1, rows, cols, c0, nc)))
        return rc;
    int64_t nr = rows ? rows : 1;
    if (m->tp)
        m->tp->full_bytes += nr * full * (int64_t)dt_size(m->dtype);
    char *host = host_buf(m, (size_t)(nr * nc) * dt_size(m->dtype) + 1, 0);
    if (!host)
        return tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", name);
    rc = convert(m, host, t, c0, nc, nr, cols, XF_NONE(m));
    if (tp)
        tk_models__st_release(t);
    int64_t shape[2] = {rows ? rows : nc, nc};
    if (rc == TK_OK)
        rc = place(m, w, host, ndim, shape);
    else
        free(host);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "tensor '%s'", name);
    m->params += nr * full;
    *out = &w->mt;
    return TK_OK;
}

int tk_models__weight_rows(const tk_mt **out, tk_model *m, const char *name, int64_t rows, int64_t cols, int64_t r0,
                           int64_t nr)
{
    *out = NULL;
    int64_t want[2] = {rows, cols};
    const tk_st_tensor *t;
    int rc = find_checked(&t, m, name, 2, want, 0);
    if (rc != TK_OK)
        return rc;
    if (r0 < 0 || nr < 1 || r0 + nr > rows)
        return tk__err(TK_ERR_INTERNAL, "weight_rows: rows [%lld, %lld) of %lld", (long long)r0, (long long)(r0 + nr),
                       (long long)rows);
    /* tensor parallelism: a fused q|k|v split by a packed style (Phi-3's qkv_proj: q's heads, then k's
     * and v's kv heads) takes the rank's part of each block: its heads of q, its kv heads of k and of
     * v; any other split of it is refused */
    const tk_tp_param *tp = tp_split(m, t);
    int64_t full = nr;
    if ((rc = tp_block(m, t, tp, 0, rows, 0, &r0, &nr)) != TK_OK)
        return rc;
    if (m->tp)
        m->tp->full_bytes += full * cols * (int64_t)dt_size(m->dtype);
    tk_models_weight *w;
    if ((rc = new_weight(m, &w)) != TK_OK || (rc = set_src(w, TK_MODELS_SRC_ROWS, &name, 1, rows, cols, r0, nr)))
        return rc;
    char *host = host_buf(m, (size_t)(nr * cols) * dt_size(m->dtype) + 1, 0);
    if (!host)
        return tk__err(TK_ERR_NOMEM, "out of memory loading '%s'", name);
    rc = convert(m, host, t, r0 * cols, nr * cols, 1, 0, XF_NONE(m));
    if (tp)
        tk_models__st_release(t);
    int64_t shape[2] = {nr, cols};
    if (rc == TK_OK)
        rc = place(m, w, host, 2, shape);
    else
        free(host);
    if (rc != TK_OK)
        return tk__err_wrap(rc, "tensor '%s'", name);
    m->params += full * cols;
    *out = &w->mt;
    return TK_OK;
}

/* ---- the activation arena --------------------------------------------------------------------- */

int tk_models__ws_tensor(tk_model *m, tk_mt *t, tk_dtype dt, int ndim, const int64_t *shape)
{
    size_t bytes = ((size_t)numel(ndim, shape) * dt_size(dt) + 255) / 256 * 256;
    size_t off = m->ws_used;
    m->ws_used += bytes;
    if (m->ws_counting) {
        mt_set(t, NULL, dt, ndim, shape, m->dev_type, m->dev_id);
        return TK_OK;
    }
    if (m->ws_used > m->ws_bytes)
        return tk__err(TK_ERR_INTERNAL, "model: the activation plan grew between its two passes");
    mt_set(t, (char *)m->ws + off, dt, ndim, shape, m->dev_type, m->dev_id);
    return TK_OK;
}

static int plan_pass(tk_model *m, tk_models_batch *b)
{
    tk_dtype i32 = dt_of(TK_DL_INT, 32), i64 = dt_of(TK_DL_INT, 64);
    int64_t T = b->T, S1 = b->nseq + 1;
    int rc;
    m->ws_used = 0;
    if ((rc = tk_models__ws_tensor(m, &b->ids, i32, 1, &T)) || (rc = tk_models__ws_tensor(m, &b->pos, i64, 1, &T)) ||
        (rc = tk_models__ws_tensor(m, &b->pos32, i32, 1, &T)) || (rc = tk_models__ws_tensor(m, &b->cu, i32, 1, &S1)) ||
        (rc = tk_models__ws_tensor(m, &b->tt, i32, 1, &T)))
        return rc;
    if (m->tp && m->tp->embed_split && (rc = tk_models__ws_tensor(m, &b->tp_ids, i32, 1, &T)) != TK_OK)
        return rc;
    if (m->cfg.rope.type != TK_ROPE_LONGROPE)
        tk_models__view(&b->rope_pos, &b->pos, 1, &T);
    else if ((rc = tk_models__ws_tensor(m, &b->rope_pos, i64, 1, &T)) != TK_OK)
        return rc;
    if (m->plan_train) { /* models/train.c: what the backward needs instead of the inference buffers */
        if ((rc = m->arch->train_plan(m, b)) != TK_OK)
            return rc;
        return tk_models__train_plan_head(m, b);
    }
    return m->arch->plan(m, b);
}

/* Plans the arena for T tokens of nseq sequences, unless it is planned for that shape already. */
static int plan(tk_model *m, int64_t T, int64_t nseq)
{
    tk_models_batch *b = &m->batch;
    if (m->planned && b->T == T && b->nseq == nseq && m->planned_training == m->plan_train &&
        m->planned_key == m->plan_key)
        return TK_OK;
    m->planned = 0;
    memset(b, 0, sizeof *b);
    b->T = T;
    b->nseq = nseq;
    m->ws_counting = 1;
    int rc = plan_pass(m, b);
    m->ws_counting = 0;
    if (rc != TK_OK)
        return rc;
    size_t need = m->ws_used;
    if (need > m->ws_bytes) { /* a smaller shape reuses the arena (generation's steps change shape often) */
        dev_free(m, m->ws);
        m->ws = NULL;
        m->ws_bytes = 0;
        if ((rc = dev_alloc(m, &m->ws, need)) != TK_OK)
            return tk__err_wrap(rc, "activations for %lld tokens", (long long)T);
        m->ws_bytes = need;
    }
    if ((rc = plan_pass(m, b)) != TK_OK)
        return rc;
    m->planned = 1;
    m->planned_training = m->plan_train;
    m->planned_key = m->plan_key;
    return TK_OK;
}

/* ---- load ------------------------------------------------------------------------------------- */

/* f32, bf16 or f16, in any spelling tk_dtype_parse takes (float32, bfloat16, float16, fp16, half). */
static int parse_dtype(tk_dtype *out, const char *s)
{
    tk_dtype d;
    if (!s)
        d = dt_of(TK_DL_FLOAT, 32);
    else if (tk_dtype_parse(&d, s) != TK_OK ||
             !((d.code == TK_DL_FLOAT && (d.bits == 32 || d.bits == 16)) || (d.code == TK_DL_BFLOAT && d.bits == 16)))
        return tk__err(TK_ERR_INVALID,
                       "model dtype '%s' is not one of f32, bf16, f16, auto (or float32, bfloat16, "
                       "float16, fp16, half)",
                       s);
    *out = d;
    return TK_OK;
}

/* sentence-transformers' settings beside the checkpoint: pooling, normalisation, max length. */
static int load_st_settings(tk_model *m)
{
    m->pool_mode = TK_POOL_MEAN;
    m->normalize = 0;
    m->max_seq_len = 0;
    char *p = tk__path_join(m->dir, "modules.json");
    char *text = NULL;
    size_t len;
    int rc = TK_OK;
    json_t *j = NULL;
    if (!p)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (tk__path_exists(p) && tk__read_file(&text, &len, p, 1u << 20) == TK_OK) {
        j = tk_models__json_loadb(text, len, 0, NULL);
        size_t i;
        json_t *mod;
        json_array_foreach(j, i, mod) {
            const char *ty = json_string_value(json_object_get(mod, "type"));
            if (ty && tk__has_suffix(ty, ".Normalize"))
                m->normalize = 1;
            if (ty && tk__has_suffix(ty, ".Pooling")) {
                const char *sub = json_string_value(json_object_get(mod, "path"));
                char *pc = sub ? tk__fmt("%s/%s/config.json", m->dir, sub) : NULL;
                char *ptext = NULL;
                size_t plen;
                if (pc && tk__read_file(&ptext, &plen, pc, 1u << 20) == TK_OK) {
                    json_t *pj = tk_models__json_loadb(ptext, plen, 0, NULL);
                    if (json_is_true(json_object_get(pj, "pooling_mode_cls_token")))
                        m->pool_mode = TK_POOL_CLS;
                    else if (json_is_true(json_object_get(pj, "pooling_mode_max_tokens")))
                        m->pool_mode = TK_POOL_MAX;
                    else if (json_is_true(json_object_get(pj, "pooling_mode_mean_sqrt_len_tokens")) ||
                             json_is_true(json_object_get(pj, "pooling_mode_weightedmean_tokens")) ||
                             json_is_true(json_object_get(pj, "pooling_mode_lasttoken")))
                        rc = tk__err(TK_ERR_UNSUPPORTED,
                                     "'%s': this pooling mode is not implemented\n"
                                     "HINT: supported: mean, cls, max",
                                     pc);
                    json_decref(pj);
                }
                free(ptext);
                free(pc);
            }
        }
        json_decref(j);
        free(text);
        text = NULL;
    }
    free(p);
    p = tk__path_join(m->dir, "sentence_bert_config.json");
    if (p && tk__path_exists(p) && tk__read_file(&text, &len, p, 1u << 20) == TK_OK) {
        j = tk_models__json_loadb(text, len, 0, NULL);
        json_t *ms = json_object_get(j, "max_seq_length");
        if (json_is_integer(ms) && json_integer_value(ms) > 0)
            m->max_seq_len = json_integer_value(ms);
        json_decref(j);
    }
    free(text);
    free(p);
    return rc;
}

static int load_model(tk_model **out, tk_ctx *ctx, const char *dir, const tk_model_opts *opts, tk_comm *comm);

#define TP_CAPS (TK_ARCH_TP_LLAMA | TK_ARCH_TP_CONV1D)

/* Tensor parallelism at load: the plan for comm's ranks (checked even for one rank), and for several
 * the sizes this rank computes (the family's load sets the split flags and the vocabulary range). */
static int tp_setup(tk_model *m, tk_comm *comm, const char *plan_file)
{
    int world = tk_comm_size(comm), rank = tk_comm_rank(comm);
    if (world < 1)
        return tk__err(TK_ERR_INVALID, "tk_model_load: opts->comm is not a communicator (NULL or freed)");
    if (world > 1 && !(m->cfg.def->caps & TP_CAPS)) {
        char list[1024] = "";
        size_t used = 0;
        for (const tk_models_arch *const *a = tk_models__archs; *a; a++)
            for (const char *const *k = (*a)->classes; used < sizeof list && ((*a)->caps & TP_CAPS) && *k; k++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", used ? ", " : "", *k);
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s: tensor parallelism runs %s so far\nHINT: run it in one process (without --tp)", m->cfg.arch,
                       list);
    }
    /* on a GPU: NCCL's ranks each have their GPU, and the model must be on it; MPI stages the
     * activations through host memory from whichever GPU the model is on */
    if (world > 1 && m->dev_type == TK_DEV_CUDA && !strcmp(tk_comm_backend(comm), "nccl") &&
        m->dev_id != tk_comm_device(comm))
        return tk__err(TK_ERR_INVALID,
                       "rank %d: the model is on cuda:%d, but this rank's NCCL communicator works on cuda:%d\n"
                       "HINT: load the model on tk_comm_device() (tk's --device cuda does), or use the MPI backend",
                       rank, m->dev_id, tk_comm_device(comm));
    tk_tp_plan *plan = NULL;
    int rc = tk_models__tp_plan_load(&plan, m->dir, plan_file, world);
    if (rc != TK_OK)
        return rc;
    for (size_t i = 0; rank == 0 && i < plan->nwarnings; i++)
        tk_ctx_log(m->ctx, TK_LOG_WARN, plan->warnings[i]);
    if (world == 1) { /* one rank holds everything: an ordinary model */
        tk_models__tp_plan_free(plan);
        return TK_OK;
    }
    if (!(m->tp = calloc(1, sizeof *m->tp))) {
        tk_models__tp_plan_free(plan);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    const tk_models_config *c = &m->cfg;
    int64_t off;
    m->tp->comm = comm;
    m->tp->rank = rank;
    m->tp->world = world;
    m->tp->plan = plan;
    m->tp->heads = c->heads % world ? c->heads : c->heads / world;
    m->tp->kv_heads = c->kv_heads % world ? c->kv_heads : c->kv_heads / world;
    tk_models__tp_chunk(c->intermediate, world, rank, &off, &m->tp->inter);
    tk_models__tp_chunk(c->moe_intermediate, world, rank, &off, &m->tp->moe_inter);
    tk_models__tp_chunk(c->vocab, world, rank, &m->tp->vocab_off, &m->tp->vocab_len);
    return TK_OK;
}

/* Every rank's load status, agreed with a collective: a rank whose own load worked fails with the
 * status of the first rank that did not. */
static int tp_agree(tk_comm *comm, int rc)
{
    int world = tk_comm_size(comm), rank = tk_comm_rank(comm);
    char mine[1024];
    snprintf(mine, sizeof mine, "%s", rc != TK_OK ? tk_last_error() : "");
    int32_t *st = calloc((size_t)world, sizeof *st);
    if (!st)
        return rc != TK_OK ? rc : tk__err(TK_ERR_NOMEM, "out of memory");
    st[rank] = rc;
    int64_t shp[1] = {world};
    tk_tensor t = {st, {TK_DEV_CPU, 0}, 1, {TK_DL_INT, 32, 1}, shp, NULL, 0};
    int crc = tk_comm_all_reduce_sum(comm, &t, NULL);
    int bad = -1;
    for (int r = 0; crc == TK_OK && r < world && bad < 0; r++)
        if (st[r] != TK_OK)
            bad = r;
    int peer = bad >= 0 ? st[bad] : TK_OK;
    free(st);
    if (rc != TK_OK)
        return tk__err(rc, "%s", mine);
    if (crc != TK_OK)
        return tk__err_wrap(crc, "agreeing on the model's load with the other ranks");
    if (bad >= 0)
        return tk__err(peer,
                       "rank %d of %d could not load the model (its own message says why), so no rank runs "
                       "it\nHINT: every rank must be able to read the checkpoint directory",
                       bad, world);
    return TK_OK;
}

int tk_model_load(tk_model **out, tk_ctx *ctx, const char *dir, const tk_model_opts *opts)
{
    *out = NULL;
    tk_model_opts def = TK_MODEL_OPTS_INIT;
    if (!opts)
        opts = &def;
    if (!ctx || !dir)
        return tk__err(TK_ERR_INVALID, "tk_model_load: ctx and dir are required");
    if (opts->version < 1 || opts->version > TK_MODEL_OPTS_VERSION)
        return tk__err(TK_ERR_INVALID, "tk_model_load: opts->version is %u, want 1 to %d (TK_MODEL_OPTS_INIT)",
                       opts->version, TK_MODEL_OPTS_VERSION);
    tk_comm *comm = opts->version >= 2 ? opts->comm : NULL;
    if (comm && tk_comm_size(comm) < 1)
        return tk__err(TK_ERR_INVALID, "tk_model_load: opts->comm is not a communicator (NULL or freed)");
    int rc = load_model(out, ctx, dir, opts, comm);
    if (comm && tk_comm_size(comm) > 1 && (rc = tp_agree(comm, rc)) != TK_OK) {
        tk_model_free(*out);
        *out = NULL;
    }
    return rc;
}

static int load_model(tk_model **out, tk_ctx *ctx, const char *dir, const tk_model_opts *opts, tk_comm *comm)
{
    if (opts->device_type != TK_DEV_CPU && opts->device_type != TK_DEV_CUDA)
        return tk__err(TK_ERR_INVALID, "tk_model_load: device_type %d is not TK_DEV_CPU or TK_DEV_CUDA",
                       opts->device_type);
    tk_model *m = calloc(1, sizeof *m);
    if (!m)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    m->magic = MODEL_MAGIC;
    m->ctx = ctx;
    m->dev_type = opts->device_type;
    m->dev_id = opts->device_id;
    m->map_weights = (opts->version >= 3 && opts->map_weights) || tk_models__hw_env_map();
    int rc;
    /* NULL: f32 on the CPU; bf16 on a GPU, whose attention kernels take bf16 and f16. "auto": the
     * checkpoint's torch_dtype (known after config.json), so its weights need no conversion. */
    int autodt = opts->dtype && !strcmp(opts->dtype, "auto");
    if (!autodt && (rc = parse_dtype(&m->dtype, opts->dtype                  ? opts->dtype
                                                : m->dev_type == TK_DEV_CUDA ? "bf16"
                                                                             : "f32")) != TK_OK)
        goto fail;
    if (m->dev_type == TK_DEV_CUDA) {
        int n = 0;
        if ((rc = tk_device_count(&n)) != TK_OK)
            goto fail;
        if (opts->device_id < 0 || opts->device_id >= n) {
            rc = tk__err(TK_ERR_NO_DEVICE, "CUDA device %d does not exist (%d devices)", opts->device_id, n);
            goto fail;
        }
    }
    if (!(m->dir = tk__strdup(dir))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((rc = tk_models__config_load(&m->cfg, dir)) != TK_OK)
        goto fail;
    for (char *w = m->cfg.warnings, *nl; w && *w; w = nl ? nl + 1 : w + strlen(w)) {
        if ((nl = strchr(w, '\n')))
            *nl = 0;
        tk_ctx_log(ctx, TK_LOG_WARN, w);
        if (nl)
            *nl = '\n';
    }
    if (autodt) {
        const char *t = m->cfg.torch_dtype;
        parse_dtype(&m->dtype, !strcmp(t, "bfloat16") || !strcmp(t, "float16") ? t : "float32");
    }
    m->arch = m->cfg.def;
    if (comm && (rc = tp_setup(m, comm, opts->version >= 2 ? opts->tp_plan : NULL)) != TK_OK)
        goto fail;
    if ((rc = tk_models__st_open_dir(&m->st, dir)) != TK_OK)
        goto fail;
    if ((rc = m->arch->load(m)) != TK_OK)
        goto fail;
    if ((rc = load_st_settings(m)) != TK_OK)
        goto fail;
    *out = m;
    return TK_OK;
fail:
    tk_model_free(m);
    return rc;
}

void tk_model_free(tk_model *m)
{
    if (!m || m->magic != MODEL_MAGIC)
        return;
    if (m->arch && m->arch->free_state)
        m->arch->free_state(m);
    for (size_t i = 0; i < m->nw; i++) {
        dev_free(m, m->w[i]->owned);
        for (int k = 0; k < m->w[i]->src.n; k++)
            free(m->w[i]->src.names[k]);
        free(m->w[i]);
    }
    free(m->w);
    tk_models__hw_free(m->hw);
    dev_free(m, m->ws);
    free(m->host_tmp);
    tk_models__st_close(m->st);
    tk_models__config_free(&m->cfg);
    tk_tokenizer_free(m->tok);
    for (size_t i = 0; i < m->nqw; i++) {
        dev_free(m, m->qw[i]->mem);
        free(m->qw[i]);
    }
    free(m->qw);
    if (m->tp)
        tk_models__tp_plan_free(m->tp->plan);
    free(m->tp);
    free(m->dir);
    m->magic = 0;
    free(m);
}

static int check_model(const tk_model *m, const char *fn)
{
    if (!m || m->magic != MODEL_MAGIC)
        return tk__err(TK_ERR_INVALID, "%s: not a tk_model (NULL or freed)", fn);
    return TK_OK;
}

const char *tk_model_arch(const tk_model *m) { return m && m->magic == MODEL_MAGIC ? m->cfg.arch : ""; }
int64_t tk_model_vocab_size(const tk_model *m) { return m && m->magic == MODEL_MAGIC ? m->cfg.vocab : 0; }
int64_t tk_model_hidden_size(const tk_model *m) { return m && m->magic == MODEL_MAGIC ? m->cfg.hidden : 0; }
int tk_model_has_lm_head(const tk_model *m)
{
    return m && m->magic == MODEL_MAGIC && (m->cfg.def->caps & TK_ARCH_CAUSAL_LM);
}

/* ---- forward ---------------------------------------------------------------------------------- */

/* What a sequence of len tokens (after this step) adds to its positions to find its rows of the rope
 * table: LongRoPE's long factors' rows follow the short ones' original_max_pos rows. */
static int64_t rope_row_offset(const tk_model *m, int64_t len)
{
    const tk_models_rope *r = &m->cfg.rope;
    return r->type == TK_ROPE_LONGROPE && len > r->original_max_pos ? r->original_max_pos : 0;
}

/* Tensor parallelism with a vocabulary-parallel embedding: the batch's ids as rows of the rank's table
 * (b->tp_ids): id - vocab_off inside the rank's range, else vocab_len, the table's row of zeros. */
static int tp_fill_ids(tk_model *m, const int32_t *ids, int64_t T)
{
    if (!m->tp || !m->tp->embed_split)
        return TK_OK;
    int32_t *l = malloc((size_t)(T ? T : 1) * sizeof *l);
    if (!l)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int64_t off = m->tp->vocab_off, len = m->tp->vocab_len;
    for (int64_t i = 0; i < T; i++)
        l[i] = ids[i] >= off && ids[i] < off + len ? (int32_t)(ids[i] - off) : (int32_t)len;
    int rc = to_dev(m, m->batch.tp_ids.t.data, l, (size_t)T * sizeof *l);
    free(l);
    return rc;
}

int tk_models__tp_reduce(tk_model *m, const tk_mt *t)
{
    if (!m->tp)
        return TK_OK;
    tk_tensor x = t->t;
    int rc = tk_comm_all_reduce_sum(m->tp->comm, &x, NULL);
    return rc == TK_OK ? TK_OK : tk__err_wrap(rc, "tensor parallelism (rank %d of %d)", m->tp->rank, m->tp->world);
}

int64_t tk_models__kv_heads(const tk_model *m) { return m->tp ? m->tp->kv_heads : m->cfg.kv_heads; }

static int copy_out(tk_model *m, float *dst, const tk_mt *src);

/* Rows rows[0..n) of a split head's logits into dst [n, V]: this rank's columns at its vocabulary
 * offset, -inf elsewhere (no rank's logits but its own exist here). */
static int logits_local(tk_model *m, float *dst, const tk_mt *logits, const int64_t *rows, size_t n)
{
    int64_t V = m->cfg.vocab, off = m->tp->vocab_off, len = m->tp->vocab_len;
    tk_mt row;
    int rc = TK_OK;
    for (size_t i = 0; i < n && rc == TK_OK; i++) {
        float *d = dst + i * (size_t)V;
        for (int64_t j = 0; j < V; j++)
            d[j] = -INFINITY;
        if (len <= 0 || logits->shape[1] <= 0)
            continue;
        tk_models__rows(&row, logits, rows[i], 1);
        rc = copy_out(m, d + off, &row);
    }
    return rc;
}

/* Rows rows[0..n) of the logits into dst [n, V] (f32, host): copied, or with a split LM head each rank's
 * columns (its vocabulary range) gathered from every rank. The ranks' parts travel padded to
 * ceil(V / N) columns, torch.chunk's widest, so the all-gather moves equal parts. */
static int logits_out(tk_model *m, float *dst, const tk_mt *logits, const int64_t *rows, size_t n)
{
    int rc = TK_OK;
    tk_mt row;
    if (!m->tp || !m->tp->head_split) {
        for (size_t i = 0; i < n && rc == TK_OK; i++) {
            tk_models__rows(&row, logits, rows[i], 1);
            rc = copy_out(m, dst + i * (size_t)m->cfg.vocab, &row);
        }
        return rc;
    }
    int W = m->tp->world;
    int64_t V = m->cfg.vocab, C = (V + W - 1) / W, off, len;
    if (m->tp->local_logits) /* generation picks over the ranks' columns (models/tp_pick.c) */
        return logits_local(m, dst, logits, rows, n);
    m->tp->head_bytes += (int64_t)n * C * (int64_t)sizeof(float);
    float *mine = calloc(n * (size_t)C + 1, sizeof *mine), *all = malloc((size_t)W * n * (size_t)C * sizeof *all + 1);
    if (!mine || !all) {
        free(mine);
        free(all);
        return tk__err(TK_ERR_NOMEM, "out of memory gathering the logits");
    }
    for (size_t i = 0; i < n && rc == TK_OK && logits->shape[1] > 0; i++) {
        tk_models__rows(&row, logits, rows[i], 1);
        rc = copy_out(m, mine + i * (size_t)C, &row);
    }
    int64_t s1[1] = {(int64_t)n * C}, sa[1] = {(int64_t)n * C * W};
    tk_tensor tin = {mine, {TK_DEV_CPU, 0}, 1, {TK_DL_FLOAT, 32, 1}, s1, NULL, 0};
    tk_tensor tout = {all, {TK_DEV_CPU, 0}, 1, {TK_DL_FLOAT, 32, 1}, sa, NULL, 0};
    if (rc == TK_OK && (rc = tk_comm_all_gather(m->tp->comm, &tout, &tin, NULL)) != TK_OK)
        tk__err_wrap(rc, "gathering the logits (rank %d of %d)", m->tp->rank, W);
    for (int r = 0; r < W && rc == TK_OK; r++) {
        tk_models__tp_chunk(V, W, r, &off, &len);
        for (size_t i = 0; i < n && len > 0; i++)
            memcpy(dst + i * (size_t)V + off, all + ((size_t)r * n + i) * (size_t)C, (size_t)len * sizeof *dst);
    }
    free(mine);
    free(all);
    return rc;
}

/* Checks the batch, plans for its shape and fills the inputs. */
static int prepare(tk_model *m, const int32_t *ids, const size_t *lens, size_t nseq)
{
    if (!ids || !lens || nseq == 0)
        return tk__err(TK_ERR_INVALID, "model forward: no sequences (ids, lens and nseq >= 1 are required)");
    int64_t T = 0, max_len = 0;
    for (size_t s = 0; s < nseq; s++) {
        if (lens[s] == 0)
            return tk__err(TK_ERR_INVALID, "model forward: sequence %zu is empty", s);
        if ((m->cfg.def->caps & TK_ARCH_BOUNDED_POS) && (int64_t)lens[s] > m->cfg.max_pos)
            return tk__err(TK_ERR_INVALID,
                           "model forward: sequence %zu has %zu tokens, more than the %lld positions of %s", s, lens[s],
                           (long long)m->cfg.max_pos, m->cfg.arch);
        if ((int64_t)lens[s] > INT32_MAX || T > INT32_MAX - (int64_t)lens[s])
            return tk__err(TK_ERR_INVALID, "model forward: more than 2^31 tokens");
        T += (int64_t)lens[s];
        if ((int64_t)lens[s] > max_len)
            max_len = (int64_t)lens[s];
    }
    for (int64_t i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab)
            return tk__err(TK_ERR_INVALID,
                           "model forward: token id %d at position %lld is outside the vocabulary [0, %lld)", ids[i],
                           (long long)i, (long long)m->cfg.vocab);
    int rc = plan(m, T, (int64_t)nseq);
    if (rc != TK_OK)
        return rc;
    tk_models_batch *b = &m->batch;
    b->max_len = max_len;
    /* Inputs: staged on the host, then copied (a memcpy on the CPU). */
    size_t need = (size_t)T * 24 + ((size_t)nseq + 1) * 4;
    if ((rc = host_tmp(m, need)) != TK_OK)
        return rc;
    int64_t *pos = m->host_tmp, *rpos = pos + T;
    int32_t *pos32 = (int32_t *)(rpos + T), *cu = pos32 + T, *zeros = cu + nseq + 1;
    int64_t k = 0;
    cu[0] = 0;
    for (size_t s = 0; s < nseq; s++) {
        int64_t off = rope_row_offset(m, (int64_t)lens[s]);
        for (size_t j = 0; j < lens[s]; j++, k++) {
            pos[k] = (int64_t)j;
            rpos[k] = (int64_t)j + off;
            pos32[k] = (int32_t)j;
            zeros[k] = 0;
        }
        cu[s + 1] = (int32_t)k;
    }
    if ((rc = to_dev(m, b->ids.t.data, ids, (size_t)T * 4)) || (rc = to_dev(m, b->pos.t.data, pos, (size_t)T * 8)) ||
        (rc = to_dev(m, b->pos32.t.data, pos32, (size_t)T * 4)) ||
        (rc = to_dev(m, b->cu.t.data, cu, ((size_t)nseq + 1) * 4)) ||
        (rc = to_dev(m, b->tt.t.data, zeros, (size_t)T * 4)) ||
        (b->rope_pos.t.data != b->pos.t.data && (rc = to_dev(m, b->rope_pos.t.data, rpos, (size_t)T * 8))))
        return rc;
    return tp_fill_ids(m, ids, T);
}

/* ---- for models/train.c ----------------------------------------------------------------------- */

int tk_models__prepare(tk_model *m, const int32_t *ids, const size_t *lens, size_t nseq)
{
    m->plan_train = 1; /* the training plan; tk_model_forward between steps plans inference again */
    int rc = prepare(m, ids, lens, nseq);
    m->plan_train = 0;
    return rc;
}

int tk_models__dev_alloc(tk_model *m, void **p, size_t bytes) { return dev_alloc(m, p, bytes); }
void tk_models__dev_free(tk_model *m, void *p) { dev_free(m, p); }
int tk_models__to_dev(tk_model *m, void *dst, const void *src, size_t n) { return to_dev(m, dst, src, n); }
int tk_models__from_dev(tk_model *m, void *dst, const void *src, size_t n) { return from_dev(m, dst, src, n); }

/* Copies a [rows, cols] activation in the compute dtype to f32 host memory. */
static int copy_out(tk_model *m, float *dst, const tk_mt *src)
{
    size_t n = (size_t)numel(src->t.ndim, src->shape);
    if (m->dev_type == TK_DEV_CPU) {
        tk_models__dtype_to_f32(dst, src->t.data, n, src->t.dtype);
        return TK_OK;
    }
    int rc = host_tmp(m, n * dt_size(src->t.dtype));
    if (rc == TK_OK)
        rc = from_dev(m, m->host_tmp, src->t.data, n * dt_size(src->t.dtype));
    if (rc == TK_OK)
        tk_models__dtype_to_f32(dst, m->host_tmp, n, src->t.dtype);
    return rc;
}

int tk_model_forward(tk_model *m, const int32_t *ids, const size_t *lens, size_t nseq, float *logits, float *hidden)
{
    int rc = check_model(m, "tk_model_forward");
    if (rc != TK_OK)
        return rc;
    if (logits && !tk_model_has_lm_head(m))
        return tk__err(TK_ERR_INVALID,
                       "%s has no LM head, so no logits\nHINT: ask for the hidden states, or "
                       "sentence embeddings (tk embed)",
                       m->cfg.arch);
    if ((rc = prepare(m, ids, lens, nseq)) != TK_OK)
        return rc;
    m->batch.want_logits = logits != NULL;
    if ((rc = m->arch->forward(m, &m->batch)) != TK_OK)
        return rc;
    if (logits && m->tp && m->tp->head_split) {
        int64_t T = m->batch.T, *rows = malloc((size_t)T * sizeof *rows);
        if (!rows)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        for (int64_t i = 0; i < T; i++)
            rows[i] = i;
        rc = logits_out(m, logits, m->batch.logits, rows, (size_t)T);
        free(rows);
        if (rc != TK_OK)
            return rc;
    } else if (logits && (rc = copy_out(m, logits, m->batch.logits)) != TK_OK) {
        return rc;
    }
    if (hidden && (rc = copy_out(m, hidden, m->batch.hidden)) != TK_OK)
        return rc;
    return TK_OK;
}

int tk_model_pooler_output(float *out, tk_model *m)
{
    int rc = check_model(m, "tk_model_pooler_output");
    if (rc != TK_OK)
        return rc;
    if (!m->planned || !m->batch.pooled)
        return tk__err(TK_ERR_INVALID, "%s: no pooler output (%s)", m->cfg.arch,
                       m->batch.pooled || (m->cfg.def->caps & TK_ARCH_POOLER) ? "run tk_model_forward first"
                                                                              : "only BertModel has a pooler");
    return copy_out(m, out, m->batch.pooled);
}

/* ---- info ------------------------------------------------------------------------------------- */

int tk_model_info_json(char **out, const tk_model *m)
{
    *out = NULL;
    int rc = check_model(m, "tk_model_info_json");
    if (rc != TK_OK)
        return rc;
    const tk_models_config *c = &m->cfg;
    /* The checkpoint's dtypes, counted by parameters. */
    int64_t by[TK_ST_COUNT] = {0};
    for (size_t i = 0; i < tk_models__st_count(m->st); i++) {
        const tk_st_tensor *t = tk_models__st_at(m->st, i);
        by[t->dtype] += numel(t->ndim, t->shape);
    }
    json_t *dts = json_object();
    for (int i = 0; i < TK_ST_COUNT; i++)
        if (by[i])
            json_object_set_new(dts, tk_models__st_dtype_name((tk_st_dtype)i), json_integer(by[i]));
    static const char *rope_names[TK_ROPE_COUNT] = {"default", "linear", "dynamic", "yarn", "llama3", "longrope"};
    int64_t sliding_layers = 0;
    for (int64_t l = 0; l < c->layers; l++)
        sliding_layers += c->sliding[l];
    json_t *o = json_pack(
        "{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:s, s:s, s:o, s:s, s:I, s:I, s:I, "
        "s:I, s:b, s:s, s:I, s:I}",
        "architecture", c->arch, "family", c->def->name, "model_type", c->model_type, "vocab_size",
        (json_int_t)c->vocab, "hidden_size", (json_int_t)c->hidden, "layers", (json_int_t)c->layers, "heads",
        (json_int_t)c->heads, "kv_heads", (json_int_t)c->kv_heads, "head_dim", (json_int_t)c->head_dim,
        "intermediate_size", (json_int_t)c->intermediate, "max_positions", (json_int_t)c->max_pos, "parameters",
        (json_int_t)m->params, "dtype", tk_dtype_name(m->dtype), "device", m->dev_type == TK_DEV_CUDA ? "cuda" : "cpu",
        "checkpoint_dtype", c->torch_dtype[0] ? c->torch_dtype : "", "checkpoint_dtypes", dts, "activation", c->act,
        "checkpoint_bytes", (json_int_t)tk_models__st_bytes(m->st), "weight_bytes", (json_int_t)m->weight_bytes,
        "mapped_bytes", (json_int_t)m->mapped_bytes, "hugepage_bytes", (json_int_t)m->hugepage_bytes,
        "tie_word_embeddings", c->tie_embeddings, "rope_type",
        (c->def->caps & TK_ARCH_ROPE) ? rope_names[c->rope.type] : "none", "sliding_window",
        (json_int_t)c->sliding_window, "sliding_layers", (json_int_t)sliding_layers);
    if (!o)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (c->def->caps & TK_ARCH_POOLER) {
        static const char *pools[] = {"mean", "cls", "max"};
        json_object_set_new(o, "pooling", json_string(pools[m->pool_mode]));
        json_object_set_new(o, "normalize", json_boolean(m->normalize));
    }
    if (c->experts > 0) { /* mixture of experts: the moe op's layers */
        int64_t sparse = 0;
        for (int64_t l = 0; l < c->layers; l++)
            sparse += c->moe[l];
        json_object_set_new(o, "experts", json_integer((json_int_t)c->experts));
        json_object_set_new(o, "experts_per_token", json_integer((json_int_t)c->experts_topk));
        json_object_set_new(o, "moe_intermediate_size", json_integer((json_int_t)c->moe_intermediate));
        json_object_set_new(o, "shared_expert_intermediate_size", json_integer((json_int_t)c->shared_intermediate));
        json_object_set_new(o, "sparse_layers", json_integer((json_int_t)sparse));
        json_object_set_new(o, "norm_topk_prob", json_boolean(c->moe_norm_topk));
    }
    if ((c->def->caps & TK_ARCH_ROPE) && c->rope.original_max_pos > 0 && c->rope.type != TK_ROPE_DEFAULT &&
        c->rope.type != TK_ROPE_LINEAR)
        json_object_set_new(o, "rope_original_max_positions", json_integer((json_int_t)c->rope.original_max_pos));
    json_object_set_new(o, "generation_config", json_boolean(c->generation_json != NULL));
    if (m->tp) /* what this rank holds; weight_bytes above is this rank's */
        json_object_set_new(
            o, "tensor_parallel",
            json_pack("{s:i, s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:b, s:b, s:I, s:I}", "rank", m->tp->rank, "world",
                      m->tp->world, "plan", m->tp->plan->source, "heads", (json_int_t)m->tp->heads, "kv_heads",
                      (json_int_t)m->tp->kv_heads, "intermediate_size", (json_int_t)m->tp->inter, "vocab_offset",
                      (json_int_t)m->tp->vocab_off, "vocab_rows", (json_int_t)m->tp->vocab_len, "embedding_split",
                      m->tp->embed_split, "lm_head_split", m->tp->head_split, "unsplit_weight_bytes",
                      (json_int_t)m->tp->full_bytes, "head_bytes_sent", (json_int_t)m->tp->head_bytes));
    *out = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return *out ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

/* ---- tokenizer and sentence embeddings -------------------------------------------------------- */

int tk_model_tokenizer(const tk_tokenizer **out, tk_model *m)
{
    *out = NULL;
    int rc = check_model(m, "tk_model_tokenizer");
    if (rc != TK_OK)
        return rc;
    if (!m->tok && (rc = tk_tokenizer_load(&m->tok, m->dir)) != TK_OK)
        return rc;
    *out = m->tok;
    return TK_OK;
}

int tk_model_embed(float *out, tk_model *m, const char *const *texts, size_t n)
{
    int rc = check_model(m, "tk_model_embed");
    if (rc != TK_OK)
        return rc;
    if (!(m->cfg.def->caps & TK_ARCH_POOLER))
        return tk__err(TK_ERR_UNSUPPORTED,
                       "sentence embeddings come from encoder models; %s is a causal LM\n"
                       "HINT: supported: BertModel (e.g. sentence-transformers/all-MiniLM-L6-v2)",
                       m->cfg.arch);
    if (!out || !texts || n == 0)
        return tk__err(TK_ERR_INVALID, "tk_model_embed: out, texts and n >= 1 are required");
    const tk_tokenizer *tok;
    if ((rc = tk_model_tokenizer(&tok, m)) != TK_OK)
        return rc;
    int64_t H = m->cfg.hidden,
            max = m->max_seq_len > 0 && m->max_seq_len < m->cfg.max_pos ? m->max_seq_len : m->cfg.max_pos;
    int32_t *all = NULL, *ids = NULL;
    size_t *lens = calloc(n, sizeof *lens), total = 0;
    float *hidden = NULL;
    if (!lens)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        if (!texts[i]) {
            rc = tk__err(TK_ERR_INVALID, "tk_model_embed: text %zu is NULL", i);
            goto done;
        }
        if ((rc = tk_tokenizer_encode(&ids, &k, tok, texts[i], strlen(texts[i]), 1)) != TK_OK)
            goto done;
        /* sentence-transformers truncates to max_seq_length, keeping the final special token ([SEP]) */
        if ((int64_t)k > max) {
            ids[max - 1] = ids[k - 1];
            k = (size_t)max;
        }
        if (k == 0) {
            rc = tk__err(TK_ERR_INVALID, "tk_model_embed: text %zu encodes to no tokens", i);
            goto done;
        }
        int32_t *na = realloc(all, (total + k) * sizeof *all);
        if (!na) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto done;
        }
        all = na;
        memcpy(all + total, ids, k * sizeof *ids);
        total += k;
        lens[i] = k;
        tk_free(ids);
        ids = NULL;
    }
    if (!(hidden = malloc(total * (size_t)H * sizeof *hidden))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    if ((rc = tk_model_forward(m, all, lens, n, NULL, hidden)) != TK_OK)
        goto done;
    /* Pooling (sentence_transformers.models.Pooling) and Normalize (F.normalize, eps 1e-12). */
    size_t row = 0;
    for (size_t i = 0; i < n; i++) {
        float *o = out + i * (size_t)H;
        const float *h = hidden + row * (size_t)H;
        for (int64_t d = 0; d < H; d++) {
            double acc = m->pool_mode == TK_POOL_MAX ? -INFINITY : 0;
            size_t cnt = m->pool_mode == TK_POOL_CLS ? 1 : lens[i];
            for (size_t t = 0; t < cnt; t++) {
                double v = h[t * (size_t)H + (size_t)d];
                acc = m->pool_mode == TK_POOL_MAX ? (v > acc ? v : acc) : acc + v;
            }
            o[d] = (float)(m->pool_mode == TK_POOL_MEAN ? acc / (double)lens[i] : acc);
        }
        if (m->normalize) {
            double ss = 0;
            for (int64_t d = 0; d < H; d++)
                ss += (double)o[d] * o[d];
            double nrm = sqrt(ss);
            if (nrm < 1e-12)
                nrm = 1e-12;
            for (int64_t d = 0; d < H; d++)
                o[d] = (float)(o[d] / nrm);
        }
        row += lens[i];
    }
done:
    tk_free(ids);
    free(all);
    free(lens);
    free(hidden);
    return rc;
}

/* ---- generation's forward over the paged KV cache (generate.c drives it) ----------------------- */

/* Tokens [t0, t0 + numel(shape) / (H D)) of x ([1, T, H, D] or [T, H, D]) with another shape. */
static void tok_view(tk_mt *v, const tk_mt *x, int64_t t0, int ndim, const int64_t *shape)
{
    int64_t per = x->shape[x->t.ndim - 2] * x->shape[x->t.ndim - 1] * (int64_t)dt_size(x->t.dtype);
    mt_set(v, (char *)x->t.data + t0 * per, x->t.dtype, ndim, shape, x->t.device.device_type, x->t.device.device_id);
}

int tk_models__attend(tk_model *m, tk_models_batch *b, int64_t l, const tk_mt *out, const tk_mt *q, const tk_mt *k,
                      const tk_mt *v, double scale, int64_t window_left)
{
    /* the architecture's attention softcap (Gemma 2), passed only when set */
    double cap = m->cfg.attn_softcap;
    int rc;
    if (b->kv && m->cfg.bidirectional)
        return tk__err(TK_ERR_UNSUPPORTED,
                       "%s attends bidirectionally (a masked diffusion LM): it cannot decode "
                       "token by token with a KV cache\nHINT: generate with tk_diffusion_generate (tk generate "
                       "--diffusion)",
                       m->cfg.arch);
    if (b->kv) {
        tk_kv *kv = b->kv;
        int64_t T = b->T, Hkv = k->shape[2], D = k->shape[3], Hq = q->shape[2];
        int64_t s3[3] = {T, Hkv, D}, kshp[4], vshp[4], sshp[1];
        tk_mt k3, v3;
        tk_models__view(&k3, k, 3, s3);
        tk_models__view(&v3, v, 3, s3);
        tk_tensor kc, vc, ks, vs;
        tk_kv__layer(kv, l, &kc, kshp, &vc, vshp, &ks, &vs, sshp);
        if (kv->quant && !kv->calibrated[l]) { /* the per-head scales, from this (first) step's keys */
            size_t nel = (size_t)(T * Hkv * D);
            float *kf = malloc(nel * sizeof *kf), *vf = malloc(nel * sizeof *vf);
            void *tmp = NULL;
            size_t es = k3.t.dtype.bits / 8u;
            rc = kf && vf ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
            if (rc == TK_OK && m->dev_type == TK_DEV_CUDA) {
                rc = (tmp = malloc(nel * es)) ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
                if (rc == TK_OK && (rc = from_dev(m, tmp, k3.t.data, nel * es)) == TK_OK) {
                    tk_models__dtype_to_f32(kf, tmp, nel, k3.t.dtype);
                    if ((rc = from_dev(m, tmp, v3.t.data, nel * es)) == TK_OK)
                        tk_models__dtype_to_f32(vf, tmp, nel, v3.t.dtype);
                }
            } else if (rc == TK_OK) {
                tk_models__dtype_to_f32(kf, k3.t.data, nel, k3.t.dtype);
                tk_models__dtype_to_f32(vf, v3.t.data, nel, v3.t.dtype);
            }
            if (rc == TK_OK)
                rc = tk_kv__calibrate(kv, l, kf, vf, T);
            free(kf);
            free(vf);
            free(tmp);
            if (rc != TK_OK)
                return rc;
        }
        tk_arg ap[] = {{TK_ARG_TENSOR, "k_cache", &kc, 0, 0},
                       {TK_ARG_TENSOR, "v_cache", &vc, 0, 0},
                       TK_A_T("k", &k3),
                       TK_A_T("v", &v3),
                       TK_A_T("slot_mapping", &b->kv_slots),
                       {TK_ARG_TENSOR, "k_scale", &ks, 0, 0},
                       {TK_ARG_TENSOR, "v_scale", &vs, 0, 0}};
        if ((rc = tk_models__op(m, "paged_kv_append", ap, kv->quant ? 7 : 5)) != TK_OK)
            return rc;
        /* a mixed step: each run of tokens attends on its own (tk_models_kvrun) */
        for (int64_t r = 0; !b->kv_prefill && r < b->kv_nruns; r++) {
            const tk_models_kvrun *run = &b->kv_runs[r];
            tk_mt q4, o4, k4, v4;
            if (run->fresh) {
                int64_t sq[4] = {1, run->ntok, Hq, D}, sk[4] = {1, run->ntok, Hkv, D};
                tok_view(&q4, q, run->t0, 4, sq);
                tok_view(&o4, out, run->t0, 4, sq);
                tok_view(&k4, k, run->t0, 4, sk);
                tok_view(&v4, v, run->t0, 4, sk);
                tk_arg af[] = {TK_A_T("out", &o4),
                               TK_A_T("q", &q4),
                               TK_A_T("k", &k4),
                               TK_A_T("v", &v4),
                               TK_A_T("cu_seqlens_q", &run->cu),
                               TK_A_T("cu_seqlens_k", &run->cu),
                               TK_A_I("max_seqlen_q", run->max_len),
                               TK_A_F("scale", scale),
                               TK_A_I("causal", 1),
                               TK_A_I("window_left", window_left),
                               TK_A_F("softcap", cap)};
                rc = tk_models__op(m, "attention", af, TK_NARGS(af) - !cap);
            } else {
                int64_t s4[4] = {run->nrows, run->sq, Hq, D};
                tok_view(&q4, q, run->t0, 4, s4);
                tok_view(&o4, out, run->t0, 4, s4);
                tk_arg ad[] = {TK_A_T("out", &o4),
                               TK_A_T("q", &q4),
                               {TK_ARG_TENSOR, "k_cache", &kc, 0, 0},
                               {TK_ARG_TENSOR, "v_cache", &vc, 0, 0},
                               TK_A_T("block_table", &run->bt),
                               TK_A_T("seq_lens", &run->sl),
                               TK_A_F("scale", scale),
                               TK_A_I("window_left", window_left),
                               {TK_ARG_TENSOR, "k_scale", &ks, 0, 0},
                               {TK_ARG_TENSOR, "v_scale", &vs, 0, 0},
                               TK_A_F("softcap", cap)};
                if (cap && !kv->quant) /* the softcap in the slot the scales leave free */
                    ad[8] = ad[10];
                rc = tk_models__op(m, "attention_decode", ad, (kv->quant ? 10 : 8) + !!cap);
            }
            if (rc != TK_OK || r + 1 == b->kv_nruns)
                return rc;
        }
    }
    tk_arg at[] = {TK_A_T("out", out),
                   TK_A_T("q", q),
                   TK_A_T("k", k),
                   TK_A_T("v", v),
                   TK_A_T("cu_seqlens_q", &b->cu),
                   TK_A_T("cu_seqlens_k", &b->cu),
                   TK_A_I("max_seqlen_q", b->max_len),
                   TK_A_F("scale", scale),
                   TK_A_I("causal", !m->cfg.bidirectional),
                   TK_A_I("window_left", window_left),
                   TK_A_F("softcap", cap)};
    return tk_models__op(m, "attention", at, TK_NARGS(at) - !cap);
}

/* The attention runs of a step that is not a plain prefill: in the packed order, sequences that start
 * empty join a fresh run (their cu offsets); the others' new tokens are cut into rows of at most 16
 * (each with the sequence's block table and its own end as length), and consecutive rows of one size
 * make a run. bt is the step's [nseq, w] block table. *mem holds every run's index arrays (host memory on
 * the CPU, in the block *runs heads: free(*runs) frees them; a device copy on a GPU: *mem, for dev_free). */
static int kv_runs(tk_model *m, const int32_t *n, const int64_t *st, const int32_t *bt, int64_t w, size_t nseq,
                   tk_models_kvrun **out, int64_t *nout, void **mem)
{
    size_t cap = 0;
    for (size_t s = 0; s < nseq; s++)
        cap += st[s] == 0 ? 1 : (size_t)(n[s] + 15) / 16;
    /* one buffer: bt rows [cap, w], then sl [cap], then cu entries [2 cap] */
    size_t words = cap * (size_t)w + cap + 2 * cap;
    /* the runs, then their host index arrays, in one block (a tk_mt's shape points into itself: the
     * block never moves once the views are set) */
    tk_models_kvrun *runs = calloc(1, cap * sizeof *runs + words * sizeof(int32_t));
    size_t *off = calloc(cap, sizeof *off); /* each run's first row (bt, sl) or cu entry */
    void *d = NULL;
    int rc = TK_OK;
    if (!runs || !off) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    int32_t *h = (int32_t *)(runs + cap);
    int32_t *hbt = h, *hsl = h + cap * (size_t)w, *hcu = hsl + cap;
    int64_t nr = 0, t = 0, r = 0, c = 0;
    for (size_t s = 0; s < nseq; s++) {
        if (st[s] == 0) {
            if (nr == 0 || !runs[nr - 1].fresh) {
                runs[nr].fresh = 1;
                runs[nr].t0 = t;
                off[nr++] = (size_t)c;
                hcu[c++] = 0;
            }
            tk_models_kvrun *u = &runs[nr - 1];
            u->nrows++;
            u->ntok += n[s];
            hcu[c++] = (int32_t)u->ntok;
            u->max_len = n[s] > u->max_len ? n[s] : u->max_len;
            t += n[s];
            continue;
        }
        for (int64_t done = 0; done < n[s];) {
            int64_t sq = n[s] - done < 16 ? n[s] - done : 16;
            if (nr == 0 || runs[nr - 1].fresh || runs[nr - 1].sq != sq) {
                runs[nr].t0 = t;
                runs[nr].sq = sq;
                off[nr++] = (size_t)r;
            }
            memcpy(hbt + r * w, bt + s * (size_t)w, (size_t)w * sizeof *hbt);
            hsl[r++] = (int32_t)(st[s] + done + sq);
            runs[nr - 1].nrows++;
            runs[nr - 1].ntok += sq;
            t += sq;
            done += sq;
        }
    }
    int32_t *base = h;
    if (m->dev_type == TK_DEV_CUDA) {
        if ((rc = dev_alloc(m, &d, words * sizeof *h)) != TK_OK || (rc = to_dev(m, d, h, words * sizeof *h)) != TK_OK)
            goto fail;
        base = d;
    }
    int32_t *dbt = base, *dsl = base + cap * (size_t)w, *dcu = dsl + cap;
    tk_dtype i32 = dt_of(TK_DL_INT, 32);
    for (int64_t i = 0; i < nr; i++) {
        tk_models_kvrun *u = &runs[i];
        if (u->fresh) {
            int64_t shp = u->nrows + 1;
            mt_set(&u->cu, dcu + off[i], i32, 1, &shp, m->dev_type, m->dev_id);
        } else {
            int64_t sb[2] = {u->nrows, w};
            mt_set(&u->bt, dbt + off[i] * (size_t)w, i32, 2, sb, m->dev_type, m->dev_id);
            mt_set(&u->sl, dsl + off[i], i32, 1, &u->nrows, m->dev_type, m->dev_id);
        }
    }
    free(off);
    *out = runs;
    *nout = nr;
    *mem = d;
    return TK_OK;
fail:
    if (d)
        dev_free(m, d);
    free(runs);
    free(off);
    return rc;
}

int tk_models__forward_kv(tk_model *m, tk_kv *kv, const int32_t *slots, size_t nseq, const int32_t *ids,
                          const int32_t *cu, float *logits)
{
    int rc = check_model(m, "generate");
    if (rc != TK_OK)
        return rc;
    if (!tk_model_has_lm_head(m))
        return tk__err(TK_ERR_INVALID,
                       "%s has no LM head: it cannot generate text\nHINT: generation needs a "
                       "causal LM (LlamaForCausalLM, GPT2LMHeadModel, ...)",
                       m->cfg.arch);
    int64_t T = cu[nseq], V = m->cfg.vocab;
    int32_t *n = malloc(nseq * sizeof *n), *bt = NULL, *sl = NULL;
    int64_t *sm = NULL, *st = NULL, *last = NULL, w = 0, nruns = 0;
    void *dsm = NULL, *dbt = NULL, *dsl = NULL, *run_mem = NULL;
    tk_models_kvrun *runs = NULL;
    tk_models_batch *b = &m->batch;
    if (!n) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t s = 0; s < nseq; s++)
        n[s] = cu[s + 1] - cu[s];
    for (int64_t i = 0; i < T; i++)
        if (ids[i] < 0 || ids[i] >= V) {
            rc = tk__err(TK_ERR_INVALID, "generate: token id %d is outside the vocabulary [0, %lld)", ids[i],
                         (long long)V);
            goto done;
        }
    if ((rc = tk_kv__prepare(kv, slots, nseq, n, &sm, &bt, &w, &sl, &st)) != TK_OK)
        goto done;
    int prefill = 1;
    int64_t maxn = 0, maxl = 0;
    for (size_t s = 0; s < nseq; s++) {
        prefill &= st[s] == 0;
        maxn = n[s] > maxn ? n[s] : maxn;
        maxl = sl[s] > maxl ? sl[s] : maxl;
    }
    if (!prefill && (rc = kv_runs(m, n, st, bt, w, nseq, &runs, &nruns, &run_mem)) != TK_OK)
        goto done;
    if ((m->cfg.def->caps & TK_ARCH_BOUNDED_POS) && maxl > m->cfg.max_pos) {
        rc = tk__err(TK_ERR_INVALID, "generate: a sequence reaches %lld tokens, more than the %lld positions of %s",
                     (long long)maxl, (long long)m->cfg.max_pos, m->cfg.arch);
        goto done;
    }
    if ((rc = plan(m, T, (int64_t)nseq)) != TK_OK)
        goto done;
    b->max_len = prefill ? maxn : maxl;
    size_t need = (size_t)T * 24 + (nseq + 1) * 4;
    if ((rc = host_tmp(m, need)) != TK_OK)
        goto done;
    int64_t *pos = m->host_tmp, *rpos = pos + T;
    int32_t *pos32 = (int32_t *)(rpos + T), *cu2 = pos32 + T, *zeros = cu2 + nseq + 1;
    int64_t k = 0;
    for (size_t s = 0; s < nseq; s++) {
        int64_t off = rope_row_offset(m, sl[s]); /* its length after this step: HF's max(position_ids) + 1 */
        for (int32_t j = 0; j < n[s]; j++, k++) {
            pos[k] = st[s] + j;
            rpos[k] = st[s] + j + off;
            pos32[k] = (int32_t)(st[s] + j);
            zeros[k] = 0;
        }
    }
    memcpy(cu2, cu, (nseq + 1) * sizeof *cu2);
    if ((rc = to_dev(m, b->ids.t.data, ids, (size_t)T * 4)) || (rc = to_dev(m, b->pos.t.data, pos, (size_t)T * 8)) ||
        (rc = to_dev(m, b->pos32.t.data, pos32, (size_t)T * 4)) ||
        (rc = to_dev(m, b->cu.t.data, cu2, (nseq + 1) * 4)) || (rc = to_dev(m, b->tt.t.data, zeros, (size_t)T * 4)) ||
        (b->rope_pos.t.data != b->pos.t.data && (rc = to_dev(m, b->rope_pos.t.data, rpos, (size_t)T * 8))) ||
        (rc = tp_fill_ids(m, ids, T)))
        goto done;
    /* the cache's index tensors: host arrays on the CPU, copies on a GPU */
    size_t bsm = (size_t)T * 8, bbt = nseq * (size_t)w * 4, bsl = nseq * 4;
    if (m->dev_type == TK_DEV_CUDA) {
        if ((rc = dev_alloc(m, &dsm, bsm)) || (rc = dev_alloc(m, &dbt, bbt)) || (rc = dev_alloc(m, &dsl, bsl)) ||
            (rc = to_dev(m, dsm, sm, bsm)) || (rc = to_dev(m, dbt, bt, bbt)) || (rc = to_dev(m, dsl, sl, bsl)))
            goto done;
    }
    int64_t shp_bt[2] = {(int64_t)nseq, w}, shp_sl[1] = {(int64_t)nseq};
    mt_set(&b->kv_slots, dsm ? dsm : sm, dt_of(TK_DL_INT, 64), 1, &T, m->dev_type, m->dev_id);
    mt_set(&b->kv_bt, dbt ? dbt : bt, dt_of(TK_DL_INT, 32), 2, shp_bt, m->dev_type, m->dev_id);
    mt_set(&b->kv_sl, dsl ? dsl : sl, dt_of(TK_DL_INT, 32), 1, shp_sl, m->dev_type, m->dev_id);
    b->kv = kv;
    b->kv_prefill = prefill;
    b->kv_runs = runs;
    b->kv_nruns = nruns;
    b->want_logits = 1;
    b->logits_last = cu; /* a prompt's other rows of logits are never read: not computed */
    rc = m->arch->forward(m, b);
    b->logits_last = NULL;
    b->kv = NULL;
    b->kv_runs = NULL;
    b->kv_nruns = 0;
    if (rc != TK_OK)
        goto done;
    if (!(last = malloc(nseq * sizeof *last))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t s = 0; s < nseq; s++)
        last[s] = cu[s + 1] - 1;
    rc = logits_out(m, logits, b->logits, last, nseq);
done:
    free(last);
    dev_free(m, dsm);
    dev_free(m, dbt);
    dev_free(m, dsl);
    dev_free(m, run_mem);
    free(runs);
    free(n);
    free(sm);
    free(bt);
    free(sl);
    free(st);
    return rc;
}

/* ---- weight-only quantisation (casted_linear) ------------------------------------------------- */

/* f32 -> fp8 e4m3fn (bias 7, no infinities, max 448): round to nearest even, saturating. */
static uint8_t to_e4m3(float x)
{
    uint8_t sign = signbit(x) ? 0x80 : 0;
    float a = fabsf(x);
    if (a != a)
        return sign | 0x7F;
    if (a >= 448.0f)
        return sign | 0x7E;
    if (a < 0.015625f) /* below 2^-6: subnormal steps of 2^-9 (a count of 8 is the smallest normal) */
        return sign | (uint8_t)rintf(a * 512.0f);
    int e;
    float f = frexpf(a, &e); /* a = f 2^e, f in [0.5, 1) */
    int E = e - 1, mant = (int)rintf((2 * f - 1) * 8);
    if (mant == 8) {
        mant = 0;
        E++;
    }
    if (E > 8 || (E == 8 && mant == 7))
        return sign | 0x7E;
    return sign | (uint8_t)(((E + 7) << 3) | mant);
}

int tk_model_quantize(tk_model *m, const char *dtype)
{
    int rc = check_model(m, "tk_model_quantize");
    if (rc != TK_OK)
        return rc;
    tk_dtype q = {0, 0, 0};
    if (dtype && strcmp(dtype, "none")) {
        if (!strcmp(dtype, "int8") || !strcmp(dtype, "i8"))
            q = dt_of(TK_DL_INT, 8);
        else if (!strcmp(dtype, "fp8") || !strcmp(dtype, "fp8_e4m3"))
            q = dt_of(TK_DL_FLOAT8_E4M3FN, 8);
        else
            return tk__err(TK_ERR_INVALID, "quantisation '%s': want int8 (i8), fp8 (fp8_e4m3) or none", dtype);
    }
    for (size_t i = 0; i < m->nqw; i++) {
        dev_free(m, m->qw[i]->mem);
        free(m->qw[i]);
    }
    m->nqw = 0;
    m->q_float_bytes = m->q_bytes = 0;
    m->quant = q;
    return TK_OK;
}

int tk_model_quant_json(char **json, const tk_model *m)
{
    *json = NULL;
    int rc = check_model(m, "tk_model_quant_json");
    if (rc != TK_OK)
        return rc;
    json_t *o = json_pack(
        "{s:s, s:I, s:I, s:I}", "quant", m->quant.code || m->quant.bits ? tk_dtype_name(m->quant) : "none", "weights",
        (json_int_t)m->nqw, "float_bytes", (json_int_t)m->q_float_bytes, "quant_bytes", (json_int_t)m->q_bytes);
    if (!o)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    *json = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(o);
    return *json ? TK_OK : tk__err(TK_ERR_NOMEM, "out of memory");
}

/* The quantised copy of w (made now if need be): rows are output features, so a Conv1D weight
 * ([K, N], transposed) is transposed on the way. */
static int qweight(struct tk_models_qweight **out, tk_model *m, const tk_mt *w, int transposed)
{
    for (size_t i = 0; i < m->nqw; i++)
        if (m->qw[i]->w == w) {
            *out = m->qw[i];
            return TK_OK;
        }
    if (m->nqw == m->capqw) {
        size_t c = m->capqw ? 2 * m->capqw : 64;
        struct tk_models_qweight **p = realloc(m->qw, c * sizeof *p);
        if (!p)
            return tk__err(TK_ERR_NOMEM, "out of memory");
        m->qw = p;
        m->capqw = c;
    }
    int64_t R = w->shape[0], C = w->shape[1], N = transposed ? C : R, K = transposed ? R : C;
    size_t nel = (size_t)(N * K), es = w->t.dtype.bits / 8u;
    float *wf = malloc(nel * sizeof *wf), *sc = malloc((size_t)N * sizeof *sc);
    uint8_t *qv = malloc(nel);
    void *tmp = NULL, *mem = NULL;
    struct tk_models_qweight *e = calloc(1, sizeof *e);
    int rc = wf && sc && qv && e
                 ? TK_OK
                 : tk__err(TK_ERR_NOMEM, "out of memory quantising a [%lld, %lld] weight", (long long)R, (long long)C);
    if (rc == TK_OK && m->dev_type == TK_DEV_CUDA) {
        if (!(tmp = malloc(nel * es)))
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
        else if ((rc = from_dev(m, tmp, w->t.data, nel * es)) == TK_OK)
            tk_models__dtype_to_f32(wf, tmp, nel, w->t.dtype);
    } else if (rc == TK_OK) {
        tk_models__dtype_to_f32(wf, w->t.data, nel, w->t.dtype);
    }
    int i8 = m->quant.code == TK_DL_INT;
    float qmax = i8 ? 127.0f : 448.0f;
    for (int64_t n = 0; rc == TK_OK && n < N; n++) {
        float amax = 0;
        for (int64_t k = 0; k < K; k++) {
            float x = wf[transposed ? k * N + n : n * K + k];
            amax = fabsf(x) > amax ? fabsf(x) : amax;
        }
        float s = amax > 0 && isfinite(amax) ? amax / qmax : 1.0f;
        sc[n] = s;
        for (int64_t k = 0; k < K; k++) {
            float y = wf[transposed ? k * N + n : n * K + k] / s;
            if (i8) {
                float r = rintf(y);
                qv[n * K + k] = (uint8_t)(int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
            } else {
                qv[n * K + k] = to_e4m3(y);
            }
        }
    }
    size_t qbytes = nel + (size_t)N * sizeof(float);
    if (rc == TK_OK && (rc = dev_alloc(m, &mem, qbytes)) == TK_OK && (rc = to_dev(m, mem, qv, nel)) == TK_OK)
        rc = to_dev(m, (char *)mem + nel, sc, (size_t)N * sizeof(float));
    if (rc == TK_OK) {
        m->qw[m->nqw++] = e;
        int64_t qs[2] = {N, K};
        e->w = w;
        e->mem = mem;
        mt_set(&e->q, mem, m->quant, 2, qs, m->dev_type, m->dev_id);
        mt_set(&e->scale, (char *)mem + nel, dt_of(TK_DL_FLOAT, 32), 1, &N, m->dev_type, m->dev_id);
        m->q_float_bytes += (int64_t)(nel * es);
        m->q_bytes += (int64_t)qbytes;
        *out = e;
        mem = NULL;
        e = NULL;
    }
    dev_free(m, mem);
    free(e);
    free(wf);
    free(sc);
    free(qv);
    free(tmp);
    return rc;
}

static int linear_all(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias, int transposed);

int tk_models__linear(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias, int transposed)
{
    const tk_models_batch *b = &m->batch;
    if (!b->logits_last || out != b->logits || b->T <= b->nseq || b->nseq > 16)
        return linear_all(m, out, x, w, bias, transposed);
    /* the LM head of a prefill: the last row of each sequence only (transformers' logits_to_keep=1),
     * one row at a time (each reads the whole head; past 16 sequences one product over all rows is
     * cheaper) */
    for (int64_t s = 0; s < b->nseq; s++) {
        if (b->logits_last[s + 1] == b->logits_last[s])
            continue;
        tk_mt xr, orow;
        tk_models__rows(&xr, x, b->logits_last[s + 1] - 1, 1);
        tk_models__rows(&orow, out, b->logits_last[s + 1] - 1, 1);
        int rc = linear_all(m, &orow, &xr, w, bias, transposed);
        if (rc != TK_OK)
            return rc;
    }
    return TK_OK;
}

static int linear_all(tk_model *m, const tk_mt *out, const tk_mt *x, const tk_mt *w, const tk_mt *bias, int transposed)
{
    if (m->quant.bits) {
        struct tk_models_qweight *q = NULL;
        int rc = qweight(&q, m, w, transposed);
        if (rc != TK_OK)
            return rc;
        tk_arg a[] = {TK_A_T("out", out),
                      TK_A_T("x", x),
                      TK_A_T("weight", &q->q),
                      TK_A_T("scale", &q->scale),
                      {TK_ARG_TENSOR, "bias", bias ? &bias->t : NULL, 0, 0}};
        return tk_models__op(m, "casted_linear", a, bias ? 5 : 4);
    }
    tk_arg a[] = {TK_A_T("out", out),
                  TK_A_T("x", x),
                  TK_A_T("weight", w),
                  TK_A_I("transposed", transposed),
                  {TK_ARG_TENSOR, "bias", bias ? &bias->t : NULL, 0, 0}};
    return tk_models__op(m, "linear", a, bias ? 5 : 4);
}
