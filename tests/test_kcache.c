/*
 * test_kcache.c — the compiled-binary cache: hits and misses, LRU eviction, corrupt blobs, schema
 * versions, the content key's sensitivity, the blob format, and two processes putting the same key
 * at once; the self-test records (keying, invalidation, an old cache.db migrating, two processes
 * writing results). No GPU and no NVRTC needed.
 */
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#include "cache/kcache.h"
#include "jit/jit.h"

static char tmpl[] = "/tmp/tk-test-kcache.XXXXXX";
static char *root;
static int ndirs;

static char *fresh_dir(void) { return tk__fmt("%s/c%d", root, ndirs++); }

static void key_of(char out[TK_SHA256_HEX], int i)
{
    char s[32];
    snprintf(s, sizeof s, "key-%d", i);
    tk__sha256_hex(out, s, strlen(s));
}

static void test_hit_miss(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[TK_SHA256_HEX];
    uint8_t *data = NULL;
    size_t len = 0;
    int inserted = -1;
    int64_t n = -1, bytes = -1;
    tk_kcache_meta meta = {"org/pkg@abc", "a.cu: k1", "sm_90", "13.0"};

    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    key_of(key, 1);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_ERR_NOT_FOUND);
    CHECK(data == NULL);
    CHECK_RC(tk_kcache__put(c, key, &meta, "hello", 5, &inserted), TK_OK);
    CHECK_EQ_INT(inserted, 1);
    CHECK_RC(tk_kcache__put(c, key, &meta, "other", 5, &inserted), TK_OK);
    CHECK_EQ_INT(inserted, 0); /* the first one wins */
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_OK);
    CHECK_EQ_INT(len, 5);
    CHECK(data && memcmp(data, "hello", 5) == 0);
    free(data);
    CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(bytes, 5);
    CHECK_RC(tk_kcache__get(c, "not-a-key", &data, &len), TK_ERR_INVALID);
    /* a zero-length payload is a valid entry */
    key_of(key, 2);
    CHECK_RC(tk_kcache__put(c, key, NULL, NULL, 0, NULL), TK_OK);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_OK);
    CHECK_EQ_INT(len, 0);
    free(data);
    tk_kcache__close(c);

    /* persists across opens */
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    key_of(key, 1);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_OK);
    free(data);
    tk_kcache__close(c);
    CHECK(!tk_jit__nvrtc_loaded()); /* cache work never loads NVRTC */
    free(dir);
}

static int collect(void *user, const tk_kcache_entry *e)
{
    char *order = user;
    size_t l = strlen(order);
    snprintf(order + l, 256 - l, "%s%s", l ? "," : "", e->unit);
    return 0;
}

static void test_lru(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[5][TK_SHA256_HEX], payload[1000];
    uint8_t *data = NULL;
    size_t len;
    int64_t n, bytes, freed = -1;
    char order[256] = "";

    memset(payload, 'x', sizeof payload);
    CHECK_RC(tk_kcache__open(&c, dir, 3000), TK_OK);
    CHECK_EQ_INT(tk_kcache__max_bytes(c), 3000);
    for (int i = 0; i < 5; i++)
        key_of(key[i], 100 + i);
    for (int i = 0; i < 3; i++) {
        char unit[8];
        tk_kcache_meta m = {NULL, unit, NULL, NULL};
        snprintf(unit, sizeof unit, "u%d", i);
        CHECK_RC(tk_kcache__put(c, key[i], &m, payload, sizeof payload, NULL), TK_OK);
    }
    /* touch 0: now 1 is the least recently used */
    CHECK_RC(tk_kcache__get(c, key[0], &data, &len), TK_OK);
    free(data);
    CHECK_RC(tk_kcache__list(c, collect, order), TK_OK);
    CHECK_STR(order, "u0,u2,u1");
    {
        tk_kcache_meta m = {NULL, "u3", NULL, NULL};
        CHECK_RC(tk_kcache__put(c, key[3], &m, payload, sizeof payload, NULL), TK_OK);
    }
    CHECK_RC(tk_kcache__get(c, key[1], &data, &len), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_kcache__get(c, key[0], &data, &len), TK_OK);
    free(data);
    CHECK_RC(tk_kcache__get(c, key[2], &data, &len), TK_OK);
    free(data);
    CHECK_RC(tk_kcache__get(c, key[3], &data, &len), TK_OK);
    free(data);
    CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
    CHECK_EQ_INT(n, 3);
    CHECK_EQ_INT(bytes, 3000);
    /* an entry bigger than the cap is kept (it was just made) but pushes the others out */
    {
        char *big = calloc(1, 5000);
        CHECK_RC(tk_kcache__put(c, key[4], NULL, big, 5000, NULL), TK_OK);
        free(big);
        CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
        CHECK_EQ_INT(n, 1);
    }
    /* the next put pushes the big one out */
    CHECK_RC(tk_kcache__put(c, key[0], NULL, payload, 10, NULL), TK_OK);
    CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(bytes, 10);
    /* explicit gc and clear */
    CHECK_RC(tk_kcache__put(c, key[1], NULL, payload, 20, NULL), TK_OK);
    CHECK_RC(tk_kcache__gc(c, 25, &freed), TK_OK);
    CHECK_EQ_INT(freed, 10);
    CHECK_RC(tk_kcache__get(c, key[1], &data, &len), TK_OK);
    free(data);
    CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_RC(tk_kcache__clear(c, &freed), TK_OK);
    CHECK_EQ_INT(freed, 20);
    CHECK_RC(tk_kcache__stats(c, &n, &bytes), TK_OK);
    CHECK_EQ_INT(n, 0);
    tk_kcache__close(c);
    free(dir);
}

static int collect_hits(void *user, const tk_kcache_entry *e)
{
    char *out = user;
    size_t l = strlen(out);
    snprintf(out + l, 256 - l, "%s%s=%lld", l ? "," : "", e->unit, (long long)e->hits);
    return 0;
}

/* A hit of the entry that is already the newest, within a minute of its last use, writes nothing (a
 * warm tk_get_kernel on a fresh context paid a WAL transaction and the close's checkpoint, 4 fsyncs,
 * for it); a hit that changes the order is still written. */
static void test_hit_of_newest_writes_nothing(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[2][TK_SHA256_HEX], hits[256] = "", payload[100];
    uint8_t *data = NULL;
    size_t len;
    memset(payload, 'y', sizeof payload);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    for (int i = 0; i < 2; i++) {
        tk_kcache_meta m = {NULL, i ? "b" : "a", NULL, NULL};
        key_of(key[i], 300 + i);
        CHECK_RC(tk_kcache__put(c, key[i], &m, payload, sizeof payload, NULL), TK_OK);
    }
    CHECK_RC(tk_kcache__get(c, key[1], &data, &len), TK_OK); /* b is the newest: not written */
    free(data);
    CHECK_RC(tk_kcache__get(c, key[0], &data, &len), TK_OK); /* a moves to the front: written */
    free(data);
    CHECK_RC(tk_kcache__get(c, key[0], &data, &len), TK_OK); /* a again: not written */
    free(data);
    CHECK_RC(tk_kcache__list(c, collect_hits, hits), TK_OK);
    CHECK_STR(hits, "a=1,b=0");
    tk_kcache__close(c);
    /* nothing was left to checkpoint: the last close removed the WAL, and reads recreate none */
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_RC(tk_kcache__get(c, key[0], &data, &len), TK_OK);
    free(data);
    char *wal = tk__path_join(dir, "cache.db-wal");
    struct stat sb;
    CHECK(stat(wal, &sb) != 0 || sb.st_size == 0);
    free(wal);
    tk_kcache__close(c);
    free(dir);
}

/* Runs SQL against a cache.db behind the cache's back. */
static int sql(const char *dir, const char *q)
{
    sqlite3 *db = NULL;
    char *path = tk__path_join(dir, "cache.db");
    int rc = sqlite3_open(path, &db);
    if (rc == SQLITE_OK)
        rc = sqlite3_exec(db, q, NULL, NULL, NULL);
    sqlite3_close(db);
    free(path);
    return rc;
}

static void test_corrupt(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[TK_SHA256_HEX], q[256];
    uint8_t *data = NULL;
    size_t len;
    int64_t n;

    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    key_of(key, 7);
    CHECK_RC(tk_kcache__put(c, key, NULL, "payload-bytes", 13, NULL), TK_OK);
    /* flip one payload byte: the digest no longer matches */
    snprintf(q, sizeof q, "UPDATE entries SET blob = substr(blob, 1, 10) || X'00' || substr(blob, 12) WHERE key = '%s'",
             key);
    CHECK_EQ_INT(sql(dir, q), SQLITE_OK);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "corrupt");
    CHECK(data == NULL);
    CHECK_RC(tk_kcache__stats(c, &n, NULL), TK_OK);
    CHECK_EQ_INT(n, 0); /* deleted */
    /* a bad magic with a matching digest is a miss too */
    CHECK_RC(tk_kcache__put(c, key, NULL, "payload-bytes", 13, NULL), TK_OK);
    snprintf(q, sizeof q, "UPDATE entries SET blob = X'00112233445566778899' WHERE key = '%s'", key);
    CHECK_EQ_INT(sql(dir, q), SQLITE_OK);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_ERR_NOT_FOUND);
    /* after a miss the key can be put again */
    CHECK_RC(tk_kcache__put(c, key, NULL, "payload-bytes", 13, NULL), TK_OK);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_OK);
    free(data);
    tk_kcache__close(c);
    free(dir);
}

static void test_schema(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[TK_SHA256_HEX];
    int64_t n = -1;
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    tk_kcache__close(c);
    CHECK_EQ_INT(sql(dir, "PRAGMA user_version = 99"), SQLITE_OK);
    c = (tk_kcache *)1;
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_ERR_CACHE);
    CHECK(c == NULL);
    CHECK_CONTAINS(tk_last_error(), "newer");
    CHECK_CONTAINS(tk_last_error(), "HINT");
    /* an older schema is replaced: it is only a cache */
    CHECK_EQ_INT(sql(dir, "PRAGMA user_version = 0; DROP TABLE entries; CREATE TABLE entries(x)"), SQLITE_OK);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    key_of(key, 1);
    CHECK_RC(tk_kcache__put(c, key, NULL, "a", 1, NULL), TK_OK);
    CHECK_RC(tk_kcache__stats(c, &n, NULL), TK_OK);
    CHECK_EQ_INT(n, 1);
    tk_kcache__close(c);
    /* WAL mode */
    {
        char *wal = tk__fmt("%s/cache.db-wal", dir);
        CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
        CHECK(tk__path_exists(wal));
        tk_kcache__close(c);
        free(wal);
    }
    /* an unusable directory */
    CHECK(tk_kcache__open(&c, "/proc/nope/dir", 0) != TK_OK);
    CHECK(c == NULL);
    free(dir);
}

/* Autotune results: put/get/replace, cleared with the cache, and kept when a schema-1 cache (from
 * before autotune) is opened: the binaries stay, the tune table is added. */
static void test_tune(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[TK_SHA256_HEX], k2[TK_SHA256_HEX], *impl = NULL;
    int64_t n = -1;
    key_of(key, 7);
    key_of(k2, 8);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_RC(tk_kcache__tune_get(c, key, &impl), TK_ERR_NOT_FOUND);
    CHECK(impl == NULL);
    CHECK_RC(tk_kcache__tune_put(c, key, "org/a:k1", 12.5, "org/a:k1=12.50;org/b:k2=20.00"), TK_OK);
    CHECK_RC(tk_kcache__tune_put(c, key, "org/b:k2", 9.0, "org/b:k2=9.00"), TK_OK);
    CHECK_RC(tk_kcache__tune_get(c, key, &impl), TK_OK);
    CHECK_STR(impl, "org/b:k2");
    free(impl);
    CHECK_RC(tk_kcache__tune_put(c, "not-hex", "x", 1, NULL), TK_ERR_INVALID);
    CHECK_RC(tk_kcache__put(c, k2, NULL, "blob", 4, NULL), TK_OK);
    tk_kcache__close(c);
    /* a schema-1 cache: no tune table; opening migrates and keeps the binaries */
    CHECK_EQ_INT(sql(dir, "DROP TABLE tune; DROP TABLE selftest; PRAGMA user_version = 1"), SQLITE_OK);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_RC(tk_kcache__stats(c, &n, NULL), TK_OK);
    CHECK_EQ_INT(n, 1);
    CHECK_RC(tk_kcache__tune_get(c, key, &impl), TK_ERR_NOT_FOUND);
    CHECK_RC(tk_kcache__tune_put(c, key, "org/a:k1", 3, NULL), TK_OK);
    CHECK_RC(tk_kcache__clear(c, NULL), TK_OK);
    CHECK_RC(tk_kcache__tune_get(c, key, &impl), TK_ERR_NOT_FOUND);
    tk_kcache__close(c);
    free(dir);
}

static void test_parse_size(void)
{
    int64_t v;
    CHECK(tk_kcache__parse_size("123", &v) == 0 && v == 123);
    CHECK(tk_kcache__parse_size("4K", &v) == 0 && v == 4096);
    CHECK(tk_kcache__parse_size("10M", &v) == 0 && v == 10 << 20);
    CHECK(tk_kcache__parse_size("2G", &v) == 0 && v == (int64_t)2 << 30);
    CHECK(tk_kcache__parse_size("2GiB", &v) == 0 && v == (int64_t)2 << 30);
    CHECK(tk_kcache__parse_size("512mb", &v) == 0 && v == (int64_t)512 << 20);
    CHECK(tk_kcache__parse_size("", &v) != 0);
    CHECK(tk_kcache__parse_size("-1", &v) != 0);
    CHECK(tk_kcache__parse_size("1X", &v) != 0);
    CHECK(tk_kcache__parse_size("M", &v) != 0);
    CHECK(tk_kcache__parse_size("99999999999T", &v) != 0);
}

/* ---- the key ---------------------------------------------------------------------------------- */

static char hdr_a[] = "#define A 1\n", hdr_b[] = "#define B 2\n", hdr_a2[] = "#define A 2\n";
static const char *src = "#include \"a.cuh\"\n__global__ void k(float *o) { o[0] = A; }\n";

static void unit_init(tk_jit_unit *u, tk_jit_file *hdrs, const char **names, const char **opts)
{
    memset(u, 0, sizeof *u);
    hdrs[0] = (tk_jit_file){"a.cuh", hdr_a, sizeof hdr_a - 1};
    hdrs[1] = (tk_jit_file){"sub/b.cuh", hdr_b, sizeof hdr_b - 1};
    names[0] = "k";
    names[1] = "ns::t<float>";
    opts[0] = "-std=c++17";
    opts[1] = "-use_fast_math";
    u->src_path = "k.cu";
    u->src = src;
    u->src_len = strlen(src);
    u->headers = hdrs;
    u->nheaders = 2;
    u->names = names;
    u->nnames = 2;
    u->options = opts;
    u->noptions = 2;
    u->cc = 90;
}

static void test_key(void)
{
    tk_jit_unit u;
    tk_jit_file hdrs[2], h2[2];
    const char *names[2], *opts[2];
    char base[TK_SHA256_HEX], k[TK_SHA256_HEX];

    unit_init(&u, hdrs, names, opts);
    CHECK_RC(tk_jit__key(base, &u, "13.0"), TK_OK);
    CHECK(tk__is_hex(base, 64));
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK_STR(k, base); /* deterministic */

    /* one header byte */
    hdrs[0].data = hdr_a2;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    hdrs[0].data = hdr_a;
    /* a header's path */
    hdrs[1].path = "sub/c.cuh";
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    hdrs[1].path = "sub/b.cuh";
    /* one option */
    opts[1] = "-ftz=true";
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    opts[1] = " -use_fast_math "; /* normalised: blanks do not matter */
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK_STR(k, base);
    opts[1] = "-use_fast_math";
    /* the target */
    u.arch_specific = 1;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    u.arch_specific = 0;
    u.cc = 80;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    u.cc = 90;
    /* NVRTC's version */
    CHECK_RC(tk_jit__key(k, &u, "12.8"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    /* the source's name and bytes */
    u.src_path = "k2.cu";
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    u.src_path = "k.cu";
    u.src_len--;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    u.src_len++;
    /* the name expressions: their order does not matter, their content does */
    names[0] = "ns::t<float>";
    names[1] = "k";
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK_STR(k, base);
    names[1] = "ns::t<double>";
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    names[1] = "k";
    /* header order does not matter */
    h2[0] = hdrs[1];
    h2[1] = hdrs[0];
    u.headers = h2;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK_STR(k, base);
    /* bytes moved between a path and content give another key (fields are length-framed) */
    {
        tk_jit_file hx[2] = {{"a.cuh#", hdr_a + 1, sizeof hdr_a - 2}, hdrs[1]};
        u.headers = hx;
        CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
        CHECK(strcmp(k, base) != 0);
    }
}

/* The device toolkit (<tk/device.cuh>) is in every key: one byte of it more or less, or other bytes,
 * give another key; the built-in one and an explicit copy of it give the same key. */
static void test_key_toolkit(void)
{
    tk_jit_unit u;
    tk_jit_file hdrs[2], tk = tk_jit__device_toolkit(), other;
    const char *names[2], *opts[2];
    char base[TK_SHA256_HEX], k[TK_SHA256_HEX];
    char *copy;

    CHECK_STR(tk.path, "tk/device.cuh");
    CHECK(tk.len > 1000 && tk.data[tk.len] == '\0' && strlen(tk.data) == tk.len);
    CHECK_CONTAINS(tk.data, "#define TK_DEVICE_TOOLKIT_VERSION 1\n");
    CHECK_EQ_INT(TK_JIT_DEVICE_TOOLKIT_VERSION, 1);
    unit_init(&u, hdrs, names, opts);
    CHECK_RC(tk_jit__key(base, &u, "13.0"), TK_OK);
    if (!(copy = malloc(tk.len + 2)))
        return;
    memcpy(copy, tk.data, tk.len + 1);
    other = (tk_jit_file){tk.path, copy, tk.len};
    u.toolkit = &other;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK_STR(k, base); /* the same bytes: the same key */
    copy[tk.len / 2] ^= 1;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    copy[tk.len / 2] ^= 1;
    memcpy(copy + tk.len, "\n", 2);
    other.len = tk.len + 1;
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    /* the toolkit's bytes are framed apart from the headers': the same bytes as a header differ */
    other.len = tk.len;
    copy[tk.len] = '\0';
    u.toolkit = NULL;
    hdrs[1] = (tk_jit_file){"tk/device.cuh", tk.data, tk.len};
    CHECK_RC(tk_jit__key(k, &u, "13.0"), TK_OK);
    CHECK(strcmp(k, base) != 0);
    free(copy);
}

static void test_options(void)
{
    CHECK_RC(tk_jit__option_check("-std=c++17"), TK_OK);
    CHECK_RC(tk_jit__option_check("-DFOO=1"), TK_OK);
    CHECK_RC(tk_jit__option_check("--use_fast_math"), TK_OK);
    CHECK_RC(tk_jit__option_check("-maxrregcount=64"), TK_OK);
    CHECK_RC(tk_jit__option_check("--time=/tmp/x"), TK_ERR_MANIFEST);
    CHECK_CONTAINS(tk_last_error(), "--time=/tmp/x");
    CHECK_RC(tk_jit__option_check("-I/etc"), TK_ERR_MANIFEST);
    CHECK_RC(tk_jit__option_check("--gpu-architecture=sm_70"), TK_ERR_MANIFEST);
    CHECK_RC(tk_jit__option_check("-arch=sm_70"), TK_ERR_MANIFEST);
    CHECK_RC(tk_jit__option_check("--pch-dir=/tmp"), TK_ERR_MANIFEST);
    CHECK_RC(tk_jit__option_check("-D"), TK_ERR_MANIFEST);
    CHECK_RC(tk_jit__option_check(""), TK_ERR_MANIFEST);
}

static void test_blob(void)
{
    tk_jit_binary b, *r = NULL;
    char *low[2] = {"_Z1kPf", "plain"};
    uint8_t cubin[5] = {0x7f, 'E', 'L', 'F', 2};
    uint8_t *blob = NULL;
    size_t len = 0;

    memset(&b, 0, sizeof b);
    b.cubin = cubin;
    b.cubin_len = sizeof cubin;
    b.ptx = ".version 9.0\n";
    b.ptx_len = strlen(b.ptx);
    b.lowered = low;
    b.nlowered = 2;
    CHECK_RC(tk_jit__binary_pack(&blob, &len, &b), TK_OK);
    CHECK_RC(tk_jit__binary_unpack(&r, blob, len), TK_OK);
    if (r) {
        CHECK_EQ_INT(r->cubin_len, 5);
        CHECK(memcmp(r->cubin, cubin, 5) == 0);
        CHECK_STR(r->ptx, b.ptx);
        CHECK_EQ_INT(r->nlowered, 2);
        CHECK_STR(r->lowered[1], "plain");
    }
    tk_jit__binary_free(r);
    /* every truncation and a bad magic are refused */
    for (size_t n = 0; n < len; n++) {
        r = (tk_jit_binary *)1;
        CHECK_RC(tk_jit__binary_unpack(&r, blob, n), TK_ERR_CACHE);
        CHECK(r == NULL);
    }
    blob[0] = 'X';
    CHECK_RC(tk_jit__binary_unpack(&r, blob, len), TK_ERR_CACHE);
    free(blob);
}

/* Several processes look up, "compile" and put the same keys at once: all succeed, one row each. */
static void test_concurrent_processes(void)
{
    char *dir = fresh_dir();
    tk_kcache *c = NULL;
    pid_t pids[4];
    int64_t n = -1;
    int ok = 1;

    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK); /* create it first: both race on content only */
    tk_kcache__close(c);
    for (int p = 0; p < 4; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            tk_kcache *cc = NULL;
            int bad = 0;
            if (tk_kcache__open(&cc, dir, 0) != TK_OK) {
                fprintf(stderr, "child %d: %s\n", p, tk_last_error());
                _exit(2);
            }
            for (int i = 0; i < 20; i++) {
                char key[TK_SHA256_HEX], payload[64];
                uint8_t *d = NULL;
                size_t l;
                key_of(key, 1000 + i);
                snprintf(payload, sizeof payload, "binary-%d", i);
                if (tk_kcache__get(cc, key, &d, &l) == TK_OK) {
                    bad |= l != strlen(payload) || memcmp(d, payload, l) != 0;
                    free(d);
                    continue;
                }
                usleep(2000); /* the compile, outside any transaction */
                if (tk_kcache__put(cc, key, NULL, payload, strlen(payload), NULL) != TK_OK) {
                    fprintf(stderr, "child %d: put: %s\n", p, tk_last_error());
                    bad = 1;
                }
            }
            tk_kcache__close(cc);
            _exit(bad ? 1 : 0);
        }
    }
    for (int p = 0; p < 4; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            ok = 0;
    }
    CHECK(ok);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_RC(tk_kcache__stats(c, &n, NULL), TK_OK);
    CHECK_EQ_INT(n, 20);
    tk_kcache__close(c);
    free(dir);
}

/* ---- self-test records (docs/selftest.md) ------------------------------------------------------ */

typedef struct {
    int n;
    char status[32], detail[256], package[128];
} st_found;

static int st_count(void *user, const tk_kcache_selftest *r)
{
    st_found *f = user;
    if (!f->n) {
        snprintf(f->status, sizeof f->status, "%s", r->status);
        snprintf(f->detail, sizeof f->detail, "%s", r->detail);
        snprintf(f->package, sizeof f->package, "%s", r->package);
    }
    f->n++;
    return 0;
}

/* One record as a dispatch lookup asks for it: the full key. */
static st_found st_lookup(tk_kcache *c, const char *key, const char *kernel, const char *uuid, const char *driver,
                          const char *tkv)
{
    st_found f;
    memset(&f, 0, sizeof f);
    tk_kcache_selftest q = {0};
    q.binary_key = key;
    q.kernel = kernel;
    q.gpu_uuid = uuid;
    q.driver = driver;
    q.tk_version = tkv;
    if (tk_kcache__selftest_query(c, &q, st_count, &f) != TK_OK)
        f.n = -1;
    return f;
}

static tk_kcache_selftest st_rec(const char *key, const char *kernel, const char *status)
{
    tk_kcache_selftest r = {0};
    r.binary_key = key;
    r.kernel = kernel;
    r.gpu_uuid = "GPU-11111111-2222-3333-4444-555555555555";
    r.driver = "570.86.15/12080";
    r.tk_version = "0.1.0";
    r.package = "org/pkg@0123456789abcdef0123456789abcdef01234567";
    r.op = "silu";
    r.status = status;
    r.detail = "{\"summary\": \"x\"}";
    r.gpu_name = "NVIDIA H100 80GB HBM3";
    return r;
}

/* The key is (binary, kernel, GPU, driver, tk): a record answers only the exact tuple, so a rebuilt
 * binary, another GPU, a new driver string or a new tk reads as never tested; a later result for the
 * same tuple replaces the earlier one. */
static void test_selftest_keying(void)
{
    tk_kcache *c = NULL;
    char *dir = fresh_dir(), key[TK_SHA256_HEX], key2[TK_SHA256_HEX];
    const char *uuid = "GPU-11111111-2222-3333-4444-555555555555", *drv = "570.86.15/12080";
    key_of(key, 50);
    key_of(key2, 51);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    tk_kcache_selftest r = st_rec(key, "silu_f32", "failed");
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_OK);
    st_found f = st_lookup(c, key, "silu_f32", uuid, drv, "0.1.0");
    CHECK_EQ_INT(f.n, 1);
    CHECK_STR(f.status, "failed");
    CHECK_CONTAINS(f.detail, "summary");
    /* every other field of the key misses */
    CHECK_EQ_INT(st_lookup(c, key2, "silu_f32", uuid, drv, "0.1.0").n, 0);     /* a new build */
    CHECK_EQ_INT(st_lookup(c, key, "silu_f16", uuid, drv, "0.1.0").n, 0);      /* another kernel of it */
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", "GPU-99999999-2222-3333-4444-555555555555", drv, "0.1.0").n, 0);
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", uuid, "575.51.03/12090", "0.1.0").n, 0); /* a new driver */
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", uuid, "570.86.15/12090", "0.1.0").n, 0); /* a new CUDA in it */
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", uuid, drv, "0.2.0").n, 0);       /* a new tk */
    /* the same tuple: replaced, not added */
    r.status = "passed";
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_OK);
    f = st_lookup(c, key, "silu_f32", uuid, drv, "0.1.0");
    CHECK_EQ_INT(f.n, 1);
    CHECK_STR(f.status, "passed");
    /* the new driver's record stands beside the old one */
    r.driver = "575.51.03/12090";
    r.status = "crashed";
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_OK);
    CHECK_STR(st_lookup(c, key, "silu_f32", uuid, drv, "0.1.0").status, "passed");
    CHECK_STR(st_lookup(c, key, "silu_f32", uuid, "575.51.03/12090", "0.1.0").status, "crashed");
    /* a record without its key fields is refused */
    r.binary_key = "short";
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_ERR_INVALID);
    r.binary_key = key;
    r.driver = NULL;
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_ERR_INVALID);
    /* gc and clear drop binaries and tuned choices, never the results (the binary recompiles to its key) */
    CHECK_RC(tk_kcache__clear(c, NULL), TK_OK);
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", uuid, drv, "0.1.0").n, 1);
    /* forget: one package, then all */
    int64_t removed = -1;
    CHECK_RC(tk_kcache__selftest_forget(c, "org/other@x", &removed), TK_OK);
    CHECK_EQ_INT(removed, 0);
    CHECK_RC(tk_kcache__selftest_forget(c, "org/pkg@0123456789abcdef0123456789abcdef01234567", &removed), TK_OK);
    CHECK_EQ_INT(removed, 2);
    CHECK_EQ_INT(st_lookup(c, key, "silu_f32", uuid, drv, "0.1.0").n, 0);
    tk_kcache__close(c);
    free(dir);
}

/* A cache.db written by the tk before self-tests (schema 2: binaries and tuned choices, the exact DDL
 * of that version) opens: the schema becomes 3, its binaries and tuned choices stay, and results can
 * be recorded. */
static void test_selftest_migrates_schema2(void)
{
    char *dir = fresh_dir(), *path = NULL, key[TK_SHA256_HEX], *impl = NULL;
    tk_kcache *c = NULL;
    sqlite3 *db = NULL;
    uint8_t *data = NULL;
    size_t len = 0;
    key_of(key, 60);
    CHECK_RC(tk__mkdirs(dir, 0700), TK_OK);
    path = tk__fmt("%s/cache.db", dir);
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    /* the blob: "TKKC", version 1, payload "bin!"; its sha256 over all of it */
    uint8_t blob[12] = {'T', 'K', 'K', 'C', 1, 0, 0, 0, 'b', 'i', 'n', '!'};
    char digest[TK_SHA256_HEX];
    tk__sha256_hex(digest, blob, sizeof blob);
    char *ddl = tk__fmt("PRAGMA journal_mode = WAL;"
                        "CREATE TABLE entries( key TEXT PRIMARY KEY, package TEXT, unit TEXT, target TEXT, nvrtc TEXT,"
                        " size INTEGER NOT NULL, sha256 TEXT NOT NULL, blob BLOB NOT NULL, created INTEGER NOT NULL,"
                        " last_used INTEGER NOT NULL, hits INTEGER NOT NULL DEFAULT 0);"
                        "CREATE INDEX entries_lru ON entries(last_used);"
                        "CREATE TABLE tune(key TEXT PRIMARY KEY, impl TEXT NOT NULL, us REAL NOT NULL, detail TEXT,"
                        " measured INTEGER NOT NULL);"
                        "INSERT INTO entries VALUES('%s', 'org/p@c', 'a.cu: k', 'sm_90', '13.0', 4, '%s',"
                        " X'544b4b430100000062696e21', 1, 1, 0);"
                        "INSERT INTO tune VALUES('%s', 'org/p:k', 3.5, '', 1);"
                        "PRAGMA user_version = 2;",
                        key, digest, key);
    CHECK_EQ_INT(sqlite3_exec(db, ddl, NULL, NULL, NULL), SQLITE_OK);
    free(ddl);
    sqlite3_close(db);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_RC(tk_kcache__get(c, key, &data, &len), TK_OK);
    CHECK(len == 4 && data && memcmp(data, "bin!", 4) == 0);
    free(data);
    CHECK_RC(tk_kcache__tune_get(c, key, &impl), TK_OK);
    CHECK_STR(impl, "org/p:k");
    free(impl);
    tk_kcache_selftest r = st_rec(key, "k", "passed");
    CHECK_RC(tk_kcache__selftest_put(c, &r), TK_OK);
    CHECK_EQ_INT(st_lookup(c, key, "k", r.gpu_uuid, r.driver, r.tk_version).n, 1);
    tk_kcache__close(c);
    db = NULL;
    CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st = NULL;
    CHECK_EQ_INT(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL), SQLITE_OK);
    CHECK_EQ_INT(sqlite3_step(st), SQLITE_ROW);
    CHECK_EQ_INT(sqlite3_column_int(st, 0), 3);
    sqlite3_finalize(st);
    sqlite3_close(db);
    /* opened again: nothing to migrate, the record is there */
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    CHECK_EQ_INT(st_lookup(c, key, "k", r.gpu_uuid, r.driver, r.tk_version).n, 1);
    tk_kcache__close(c);
    free(path);
    free(dir);
}

/* Two processes record results into one cache.db at the same time (each its own kernels, and both the
 * same one): every write succeeds and every record is there once. */
static void test_selftest_two_processes(void)
{
    char *dir = fresh_dir();
    tk_kcache *c = NULL;
    pid_t pids[2];
    int ok = 1;
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    tk_kcache__close(c);
    for (int p = 0; p < 2; p++) {
        pids[p] = fork();
        if (pids[p] == 0) {
            tk_kcache *cc = NULL;
            int bad = 0;
            if (tk_kcache__open(&cc, dir, 0) != TK_OK)
                _exit(2);
            for (int i = 0; i < 100; i++) {
                char key[TK_SHA256_HEX], kernel[32];
                key_of(key, 2000 + i);
                snprintf(kernel, sizeof kernel, "k%d_%d", p, i);
                tk_kcache_selftest r = st_rec(key, kernel, "running");
                r.pid = getpid();
                bad |= tk_kcache__selftest_put(cc, &r) != TK_OK;
                r.status = i % 7 ? "passed" : "failed";
                bad |= tk_kcache__selftest_put(cc, &r) != TK_OK;
                r.kernel = "shared"; /* both write this one */
                bad |= tk_kcache__selftest_put(cc, &r) != TK_OK;
                if (bad) {
                    fprintf(stderr, "child %d: %s\n", p, tk_last_error());
                    break;
                }
            }
            tk_kcache__close(cc);
            _exit(bad ? 1 : 0);
        }
    }
    for (int p = 0; p < 2; p++) {
        int st = 0;
        waitpid(pids[p], &st, 0);
        ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
    }
    CHECK(ok);
    CHECK_RC(tk_kcache__open(&c, dir, 0), TK_OK);
    st_found all;
    memset(&all, 0, sizeof all);
    CHECK_RC(tk_kcache__selftest_query(c, NULL, st_count, &all), TK_OK);
    CHECK_EQ_INT(all.n, 2 * 100 + 100); /* k0_i, k1_i, and one "shared" a key */
    char key[TK_SHA256_HEX];
    key_of(key, 2007);
    CHECK_STR(st_lookup(c, key, "k1_7", "GPU-11111111-2222-3333-4444-555555555555", "570.86.15/12080", "0.1.0").status,
              "failed");
    tk_kcache__close(c);
    free(dir);
}

int main(void)
{
    root = mkdtemp(tmpl);
    if (!root) {
        perror("mkdtemp");
        return 1;
    }
    RUN(test_hit_miss);
    RUN(test_lru);
    RUN(test_hit_of_newest_writes_nothing);
    RUN(test_corrupt);
    RUN(test_schema);
    RUN(test_tune);
    RUN(test_parse_size);
    RUN(test_key);
    RUN(test_key_toolkit);
    RUN(test_options);
    RUN(test_blob);
    RUN(test_concurrent_processes);
    RUN(test_selftest_keying);
    RUN(test_selftest_migrates_schema2);
    RUN(test_selftest_two_processes);
    tk__rmtree(root);
    return th_done();
}
