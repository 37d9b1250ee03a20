/*
 * safetensors.c — Hugging Face safetensors checkpoints, mapped read-only, as they are on disk.
 *
 * Format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of a JSON object
 * {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}, then
 * the data area; offsets are relative to its start. The header is untrusted input: everything is
 * checked before any tensor is used (length cap, offsets inside the file, shape x dtype == byte length
 * without overflow, no two tensors overlapping), so a truncated or hostile file gives an error naming
 * the file and the tensor, never a read outside the mapping. tests/fuzz/fuzz_safetensors.c fuzzes
 * tk_models__st_parse.
 *
 * A sharded checkpoint (model.safetensors.index.json: {"weight_map": {"name": "shard file"}}) is the
 * union of its shards; each name must live in the shard the index says, and shard names may not leave
 * the directory.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/convert.h"
#include "models/models.h"

static const struct {
    const char *name;
    size_t size;
} st_dtypes[TK_ST_COUNT] = {
    [TK_ST_BOOL] = {"BOOL", 1}, [TK_ST_U8] = {"U8", 1},           [TK_ST_I8] = {"I8", 1},
    [TK_ST_I16] = {"I16", 2},   [TK_ST_U16] = {"U16", 2},         [TK_ST_F16] = {"F16", 2},
    [TK_ST_BF16] = {"BF16", 2}, [TK_ST_I32] = {"I32", 4},         [TK_ST_U32] = {"U32", 4},
    [TK_ST_F32] = {"F32", 4},   [TK_ST_F64] = {"F64", 8},         [TK_ST_I64] = {"I64", 8},
    [TK_ST_U64] = {"U64", 8},   [TK_ST_F8_E4M3] = {"F8_E4M3", 1}, [TK_ST_F8_E5M2] = {"F8_E5M2", 1},
};

const char *tk_models__st_dtype_name(tk_st_dtype dt) { return dt < TK_ST_COUNT ? st_dtypes[dt].name : "?"; }
size_t tk_models__st_dtype_size(tk_st_dtype dt) { return dt < TK_ST_COUNT ? st_dtypes[dt].size : 0; }

static int parse_dtype(tk_st_dtype *out, const char *s)
{
    for (int i = 0; i < TK_ST_COUNT; i++)
        if (!strcmp(s, st_dtypes[i].name)) {
            *out = (tk_st_dtype)i;
            return 0;
        }
    return -1;
}

void tk_models__st_free(tk_st_tensor *t, size_t n)
{
    for (size_t i = 0; t && i < n; i++)
        free(t[i].name);
    free(t);
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(((const tk_st_tensor *)a)->name, ((const tk_st_tensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b)
{
    const tk_st_tensor *x = *(const tk_st_tensor *const *)a, *y = *(const tk_st_tensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* A JSON integer in [0, 2^63), as jansson holds it. */
static int json_u64(uint64_t *out, const json_t *v)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *shape)
{
    size_t k = (size_t)snprintf(out, cap, "[");
    for (int d = 0; d < ndim && k < cap; d++)
        k += (size_t)snprintf(out + k, cap - k, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (k < cap)
        snprintf(out + k, cap - k, "]");
}

#define HINT_FILE "\nHINT: the file is damaged or not a safetensors file; download it again"

/* The 8-byte little-endian header length, checked against the cap and the file, and the header's '{'. */
static int header_len(uint64_t *out, const uint8_t *buf, size_t len, const char *what)
{
    if (len < 8)
        return tk__err(TK_ERR_CORRUPT, "safetensors '%s': %zu bytes, too short for the 8-byte header length" HINT_FILE,
                       what, len);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | buf[i];
    if (hlen > TK_ST_MAX_HEADER)
        return tk__err(TK_ERR_CORRUPT, "safetensors '%s': header length %llu exceeds the %u-byte cap" HINT_FILE, what,
                       (unsigned long long)hlen, TK_ST_MAX_HEADER);
    if (hlen > len - 8)
        return tk__err(
            TK_ERR_CORRUPT,
            "safetensors '%s': header length %llu runs past the end of the file (%zu bytes): truncated?" HINT_FILE,
            what, (unsigned long long)hlen, len);
    if (hlen < 2 || buf[8] != '{')
        return tk__err(TK_ERR_CORRUPT, "safetensors '%s': the header is not a JSON object" HINT_FILE, what);
    *out = hlen;
    return TK_OK;
}

/* '__metadata__' must be an object of strings; tk reads nothing from it. */
static int check_metadata(json_t *v, const char *what)
{
    const char *mk;
    json_t *mv;
    if (!json_is_object(v))
        return tk__err(TK_ERR_CORRUPT, "safetensors '%s': '__metadata__' is not an object of strings" HINT_FILE, what);
    json_object_foreach(v, mk, mv) {
        if (!json_is_string(mv))
            return tk__err(TK_ERR_CORRUPT, "safetensors '%s': '__metadata__' entry '%s' is not a string" HINT_FILE,
                           what, mk);
    }
    return TK_OK;
}

/* t->shape from the JSON shape, and *bytes = numel * the dtype's size, with *overflow set when that passes
 * 2^64 (checked at every step). */
static int parse_shape(tk_st_tensor *t, uint64_t *bytes, int *overflow, const json_t *js, const char *key,
                       const char *what)
{
    *bytes = tk_models__st_dtype_size(t->dtype);
    *overflow = 0;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t s;
        if (json_u64(&s, json_array_get(js, (size_t)d)))
            return tk__err(TK_ERR_CORRUPT,
                           "safetensors '%s': tensor '%s' has a shape entry that is not an integer >= 0" HINT_FILE,
                           what, key);
        t->shape[d] = (int64_t)s;
        if (s && *bytes > UINT64_MAX / s)
            *overflow = 1;
        else
            *bytes *= s;
    }
    return TK_OK;
}

/* One header entry into *t: its dtype, shape and offsets checked against each other and against the dlen
 * bytes of data; t->name is set last, so a failed entry owns nothing. */
static int parse_tensor(tk_st_tensor *t, const char *key, const json_t *v, const uint8_t *data, uint64_t dlen,
                        const char *what)
{
    json_t *jd = json_object_get(v, "dtype"), *js = json_object_get(v, "shape"),
           *jo = json_object_get(v, "data_offsets");
    if (!json_is_object(v) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
        json_array_size(jo) != 2)
        return tk__err(TK_ERR_CORRUPT,
                       "safetensors '%s': tensor '%s' lacks dtype, shape or data_offsets [begin, end]" HINT_FILE, what,
                       key);
    if (parse_dtype(&t->dtype, json_string_value(jd)))
        return tk__err(TK_ERR_UNSUPPORTED,
                       "safetensors '%s': tensor '%s' has dtype '%s', not one of BOOL, U8, I8, I16, U16, F16, BF16, "
                       "I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2",
                       what, key, json_string_value(jd));
    if (json_array_size(js) > TK_ST_MAX_RANK)
        return tk__err(TK_ERR_UNSUPPORTED, "safetensors '%s': tensor '%s' has %zu dimensions, at most %d are supported",
                       what, key, json_array_size(js), TK_ST_MAX_RANK);
    t->ndim = (int)json_array_size(js);
    uint64_t bytes;
    int overflow;
    int rc = parse_shape(t, &bytes, &overflow, js, key, what);
    if (rc != TK_OK)
        return rc;
    if (json_u64(&t->begin, json_array_get(jo, 0)) || json_u64(&t->end, json_array_get(jo, 1)) || t->end < t->begin)
        return tk__err(TK_ERR_CORRUPT,
                       "safetensors '%s': tensor '%s' has data_offsets that are not [begin, end] "
                       "with 0 <= begin <= end" HINT_FILE,
                       what, key);
    if (t->end > dlen)
        return tk__err(TK_ERR_CORRUPT,
                       "safetensors '%s': tensor '%s' has data_offsets [%llu, %llu] past the end of the data (%llu "
                       "bytes): truncated?" HINT_FILE,
                       what, key, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)dlen);
    if (overflow || bytes != t->end - t->begin) {
        char shp[160], nb[32];
        shape_str(shp, sizeof shp, t->ndim, t->shape);
        snprintf(nb, sizeof nb, "%llu", (unsigned long long)bytes);
        return tk__err(
            TK_ERR_CORRUPT,
            "safetensors '%s': tensor '%s' is %s %s, which is %s bytes, but its data_offsets span %llu" HINT_FILE, what,
            key, tk_models__st_dtype_name(t->dtype), shp, overflow ? "more than 2^64" : nb,
            (unsigned long long)(t->end - t->begin));
    }
    t->data = data + t->begin;
    if (!(t->name = tk__strdup(key)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    return TK_OK;
}

/* No two tensors may share bytes (empty tensors take none). */
static int check_overlap(const tk_st_tensor *ts, size_t nt, const char *what)
{
    const tk_st_tensor **order = malloc((nt ? nt : 1) * sizeof *order);
    if (!order)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < nt; i++)
        order[i] = &ts[i];
    qsort(order, nt, sizeof *order, cmp_begin);
    int rc = TK_OK;
    const tk_st_tensor *prev = NULL;
    for (size_t i = 0; i < nt; i++) {
        const tk_st_tensor *t = order[i];
        if (t->begin == t->end)
            continue;
        if (prev && t->begin < prev->end) {
            rc = tk__err(TK_ERR_CORRUPT,
                         "safetensors '%s': tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) overlap" HINT_FILE, what,
                         prev->name, (unsigned long long)prev->begin, (unsigned long long)prev->end, t->name,
                         (unsigned long long)t->begin, (unsigned long long)t->end);
            break;
        }
        prev = t;
    }
    free(order);
    return rc;
}

int tk_models__st_parse(tk_st_tensor **out, size_t *n, const uint8_t *buf, size_t len, const char *what)
{
    *out = NULL;
    *n = 0;
    json_t *root = NULL;
    tk_st_tensor *ts = NULL;
    size_t nt = 0;
    uint64_t hlen = 0;
    int rc = header_len(&hlen, buf, len, what);
    if (rc != TK_OK)
        return rc;
    const uint8_t *data = buf + 8 + hlen;
    uint64_t dlen = len - 8 - hlen;
    json_error_t jerr;
    root = json_loadb((const char *)buf + 8, (size_t)hlen, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &jerr);
    if (!root || !json_is_object(root)) {
        rc = tk__err(TK_ERR_CORRUPT, "safetensors '%s': the header is not a JSON object: %s (byte %d)" HINT_FILE, what,
                     root ? "not an object" : jerr.text, root ? 0 : jerr.position);
        goto fail;
    }
    size_t cap = json_object_size(root);
    ts = calloc(cap ? cap : 1, sizeof *ts);
    if (!ts) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        if (!strcmp(key, "__metadata__")) {
            if ((rc = check_metadata(v, what)) != TK_OK)
                goto fail;
            continue;
        }
        if ((rc = parse_tensor(&ts[nt], key, v, data, dlen, what)) != TK_OK)
            goto fail;
        nt++;
    }
    if ((rc = check_overlap(ts, nt, what)) != TK_OK)
        goto fail;
    qsort(ts, nt, sizeof *ts, cmp_name);
    *out = ts;
    *n = nt;
    ts = NULL;
fail:
    tk_models__st_free(ts, nt);
    json_decref(root);
    return rc;
}

/* ---- files and checkpoints -------------------------------------------------------------------- */

typedef struct {
    char *path;
    void *map;
    size_t size;
    tk_st_tensor *t;
    size_t n;
} st_file;

struct tk_st_set {
    st_file *files;
    size_t nfiles;
    const tk_st_tensor **all; /* every tensor of every file, sorted by name */
    size_t nall;
    int64_t bytes;
};

static int map_file(st_file *f, const char *path)
{
    memset(f, 0, sizeof *f);
    if (!(f->path = tk__strdup(path)))
        return tk__err(TK_ERR_NOMEM, "out of memory");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return tk__err_sys("cannot open", path);
    struct stat st;
    int rc = TK_OK;
    if (fstat(fd, &st) != 0) {
        rc = tk__err_sys("cannot stat", path);
        goto done;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = tk__err(TK_ERR_INVALID, "safetensors '%s' is not a regular file", path);
        goto done;
    }
    f->size = (size_t)st.st_size;
    if (f->size > 0) {
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            rc = tk__err_sys("cannot map", path);
            goto done;
        }
    }
    rc = tk_models__st_parse(&f->t, &f->n, f->map ? f->map : (const void *)"", f->size, path);
    for (size_t i = 0; rc == TK_OK && i < f->n; i++)
        f->t[i].file = f->path;
done:
    close(fd);
    return rc;
}

void tk_models__st_release(const tk_st_tensor *t)
{
    if (t && t->data && t->end > t->begin)
        tk_models__st_release_range(t->data, (size_t)(t->end - t->begin));
}

void tk_models__st_release_range(const void *p, size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || !n || pg <= 0)
        return;
    uintptr_t a = (uintptr_t)p, e = a + (uintptr_t)n;
    uintptr_t lo = (a + (uintptr_t)pg - 1) / (uintptr_t)pg * (uintptr_t)pg, hi = e / (uintptr_t)pg * (uintptr_t)pg;
    if (hi > lo) /* a private, never-written file mapping: dropped pages read back from the file */
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
void tk_models__st_populate(const void *p, size_t n)
{
    long pg = sysconf(_SC_PAGESIZE);
    if (!p || !n || pg <= 0)
        return;
    uintptr_t lo = (uintptr_t)p / (uintptr_t)pg * (uintptr_t)pg, hi = (uintptr_t)p + n;
    (void)madvise((void *)lo, hi - lo, MADV_POPULATE_READ); /* EINVAL before 5.14: pages fault in later */
}

static void unmap_file(st_file *f)
{
    if (f->map)
        munmap(f->map, f->size);
    tk_models__st_free(f->t, f->n);
    free(f->path);
}

void tk_models__st_close(tk_st_set *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++)
        unmap_file(&s->files[i]);
    free(s->files);
    free(s->all);
    free(s);
}

static int cmp_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const tk_st_tensor *const *)a)->name, (*(const tk_st_tensor *const *)b)->name);
}

const tk_st_tensor *tk_models__st_find(const tk_st_set *s, const char *name)
{
    tk_st_tensor key = {.name = (char *)name};
    const tk_st_tensor *kp = &key;
    const tk_st_tensor *const *hit = bsearch(&kp, s->all, s->nall, sizeof *s->all, cmp_ptr_name);
    return hit ? *hit : NULL;
}

size_t tk_models__st_count(const tk_st_set *s) { return s->nall; }
const tk_st_tensor *tk_models__st_at(const tk_st_set *s, size_t i) { return i < s->nall ? s->all[i] : NULL; }
int64_t tk_models__st_bytes(const tk_st_set *s) { return s->bytes; }

/* A shard name from the index must be a plain file name in the directory. */
static int safe_shard_name(const char *s)
{
    return s[0] && s[0] != '.' && !strchr(s, '/') && !strchr(s, '\\') && tk__has_suffix(s, ".safetensors");
}

/* The distinct shard file names of the index's weight map, in first-seen order, borrowed from wm; each
 * must be a plain .safetensors file name in the directory. */
static int shard_names(const char ***out, size_t *n, json_t *wm, const char *index)
{
    const char **names = calloc(json_object_size(wm) + 1, sizeof *names);
    size_t nnames = 0;
    if (!names)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) {
        const char *f = json_string_value(v);
        if (!f || !safe_shard_name(f)) {
            free(names);
            return tk__err(TK_ERR_CORRUPT, "'%s': tensor '%s' maps to %s%s%s, not a .safetensors file in the directory",
                           index, k, f ? "'" : "a non-string", f ? f : "", f ? "'" : "");
        }
        size_t j = 0;
        while (j < nnames && strcmp(names[j], f))
            j++;
        if (j == nnames)
            names[nnames++] = f;
    }
    *out = names;
    *n = nnames;
    return TK_OK;
}

/* A sharded checkpoint: maps every shard the index names into s->files. *text and *idx, the index's text
 * and JSON, are the caller's to free, on error too; check_index reads *idx afterwards. */
static int open_shards(tk_st_set *s, char **text, json_t **idx, const char *dir, const char *index)
{
    size_t len;
    int rc = tk__read_file(text, &len, index, 64u << 20);
    if (rc != TK_OK)
        return rc;
    json_error_t jerr;
    *idx = tk_models__json_loadb(*text, len, JSON_REJECT_DUPLICATES, &jerr);
    json_t *wm = *idx ? json_object_get(*idx, "weight_map") : NULL;
    if (!json_is_object(wm))
        return tk__err(TK_ERR_CORRUPT, "'%s': %s" HINT_FILE, index, *idx ? "no \"weight_map\" object" : jerr.text);
    const char **names = NULL;
    size_t nnames = 0;
    if ((rc = shard_names(&names, &nnames, wm, index)) != TK_OK)
        return rc;
    s->files = calloc(nnames ? nnames : 1, sizeof *s->files);
    if (!s->files) {
        free(names);
        return tk__err(TK_ERR_NOMEM, "out of memory");
    }
    char *path = NULL;
    for (size_t i = 0; i < nnames; i++) {
        free(path);
        if (!(path = tk__path_join(dir, names[i]))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            break;
        }
        rc = map_file(&s->files[s->nfiles++], path);
        if (rc != TK_OK)
            break;
    }
    free(path);
    free(names);
    return rc;
}

/* s->all: every tensor of every file, sorted by name; a name in two files is an error. */
static int index_tensors(tk_st_set *s)
{
    for (size_t i = 0; i < s->nfiles; i++) {
        s->nall += s->files[i].n;
        s->bytes += (int64_t)s->files[i].size;
    }
    s->all = malloc((s->nall ? s->nall : 1) * sizeof *s->all);
    if (!s->all)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    size_t k = 0;
    for (size_t i = 0; i < s->nfiles; i++)
        for (size_t j = 0; j < s->files[i].n; j++)
            s->all[k++] = &s->files[i].t[j];
    qsort(s->all, s->nall, sizeof *s->all, cmp_ptr_name);
    for (size_t i = 1; i < s->nall; i++)
        if (!strcmp(s->all[i]->name, s->all[i - 1]->name))
            return tk__err(TK_ERR_CORRUPT, "tensor '%s' is in both '%s' and '%s'", s->all[i]->name, s->all[i - 1]->file,
                           s->all[i]->file);
    return TK_OK;
}

/* Every tensor of the index is in the shard it names. */
static int check_index(const tk_st_set *s, json_t *idx)
{
    const char *name;
    json_t *v;
    json_object_foreach(json_object_get(idx, "weight_map"), name, v) {
        const tk_st_tensor *t = tk_models__st_find(s, name);
        const char *base = t ? strrchr(t->file, '/') : NULL;
        if (!t || strcmp(base ? base + 1 : t->file, json_string_value(v)))
            return tk__err(TK_ERR_CORRUPT, "tensor '%s': the index puts it in '%s', but %s%s" HINT_FILE, name,
                           json_string_value(v), t ? "it is in " : "no shard has it", t ? t->file : "");
    }
    return TK_OK;
}

int tk_models__st_open_dir(tk_st_set **out, const char *dir)
{
    *out = NULL;
    int rc = TK_OK;
    char *text = NULL;
    json_t *idx = NULL;
    tk_st_set *s = calloc(1, sizeof *s);
    if (!s)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    char *single = tk__path_join(dir, "model.safetensors");
    char *index = tk__path_join(dir, "model.safetensors.index.json");
    if (!single || !index) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (tk__path_exists(index)) {
        if ((rc = open_shards(s, &text, &idx, dir, index)) != TK_OK)
            goto fail;
    } else if (tk__path_exists(single)) {
        if (!(s->files = calloc(1, sizeof *s->files))) {
            rc = tk__err(TK_ERR_NOMEM, "out of memory");
            goto fail;
        }
        rc = map_file(&s->files[s->nfiles++], single);
        if (rc != TK_OK)
            goto fail;
    } else {
        rc = tk__err(TK_ERR_NOT_FOUND,
                     "no weights in '%s': neither model.safetensors nor model.safetensors.index.json\n"
                     "HINT: tk loads safetensors checkpoints; convert a pytorch_model.bin with "
                     "transformers' save_pretrained(dir, safe_serialization=True)",
                     dir);
        goto fail;
    }
    if ((rc = index_tensors(s)) != TK_OK)
        goto fail;
    if (idx && (rc = check_index(s, idx)) != TK_OK)
        goto fail;
    *out = s;
    s = NULL;
fail:
    tk_models__st_close(s);
    json_decref(idx);
    free(text);
    free(single);
    free(index);
    return rc;
}

/* ---- dtype conversion -------------------------------------------------------------------------- */

int tk_models__to_f32(float *dst, const void *src, size_t n, tk_st_dtype dt)
{
    const uint8_t *p = src; /* one loop per dtype: a checkpoint converted at load runs this per weight */
    switch (dt) {
    case TK_ST_F32: memcpy(dst, p, 4 * n); break;
    case TK_ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, p + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    case TK_ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tk__f16_to_f32(h);
        }
        break;
    case TK_ST_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tk__bf16_to_f32(h);
        }
        break;
    case TK_ST_F8_E4M3:
        for (size_t i = 0; i < n; i++)
            dst[i] = tk__fp8_e4m3_to_f32(p[i]);
        break;
    case TK_ST_F8_E5M2:
        for (size_t i = 0; i < n; i++)
            dst[i] = tk__fp8_e5m2_to_f32(p[i]);
        break;
    case TK_ST_I8:
        for (size_t i = 0; i < n; i++)
            dst[i] = (float)(int8_t)p[i];
        break;
    default:
        return tk__err(TK_ERR_UNSUPPORTED, "safetensors dtype %s does not convert to a float weight",
                       tk_models__st_dtype_name(dt));
    }
    return TK_OK;
}

void tk_models__from_f32(void *dst, const float *src, size_t n, tk_dtype dt)
{
    uint8_t *p = dst;
    if (dt.code == TK_DL_FLOAT && dt.bits == 32) {
        memcpy(dst, src, n * 4);
        return;
    }
    if (dt.code == TK_DL_BFLOAT)
        for (size_t i = 0; i < n; i++) {
            uint16_t h = tk__f32_to_bf16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
    else
        for (size_t i = 0; i < n; i++) {
            uint16_t h = tk__f32_to_f16(src[i]);
            memcpy(p + 2 * i, &h, 2);
        }
}

void tk_models__dtype_to_f32(float *dst, const void *src, size_t n, tk_dtype dt)
{
    const uint8_t *p = src;
    if (dt.code == TK_DL_FLOAT && dt.bits == 32) {
        memcpy(dst, src, n * 4);
        return;
    }
    if (dt.code == TK_DL_BFLOAT)
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tk__bf16_to_f32(h);
        }
    else
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = tk__f16_to_f32(h);
        }
}
