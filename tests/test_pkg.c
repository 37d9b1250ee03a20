/*
 * test_pkg.c — unit tests of the package path's pieces: references, names, versions, manifests,
 * Ed25519 signatures, the state database (schema versions, trust, rollback records) and the store.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sqlite3.h>

#include "cache/state.h"
#include "common/common.h"
#include "harness.h"
#include "hub/hub.h"
#include "manifest/manifest.h"
#include "hub/sign.h"

static char tmpdir[256];

static char *tmp(const char *name) { return tk__fmt("%s/%s", tmpdir, name); }

static void test_refs(void)
{
    tk_hub_ref r;
    CHECK_RC(tk_hub__ref_parse(&r, "kernels-community/activation"), TK_OK);
    CHECK_STR(r.org, "kernels-community");
    CHECK_STR(r.pkg, "activation");
    CHECK_EQ_INT(r.major, 0);
    CHECK_RC(tk_hub__ref_parse(&r, "a/b@2"), TK_OK);
    CHECK_EQ_INT(r.major, 2);
    CHECK_RC(tk_hub__ref_parse(&r, "a/b@v3"), TK_OK);
    CHECK_EQ_INT(r.major, 3);
    CHECK_RC(tk_hub__ref_parse(&r, "a/b@0123456789abcdef0123456789abcdef01234567"), TK_OK);
    CHECK_STR(r.commit, "0123456789abcdef0123456789abcdef01234567");
    CHECK_RC(tk_hub__ref_parse(&r, "a/b@0"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, "a/b@latest"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, "a/b/c"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, "noslash"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, "../x"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, "a/.hidden"), TK_ERR_INVALID);
    CHECK_RC(tk_hub__ref_parse(&r, ""), TK_ERR_INVALID);
    CHECK_CONTAINS(tk_last_error(), "HINT");
}

static void test_paths_and_versions(void)
{
    CHECK_EQ_INT(tk_manifest__path_check("a.cu"), 0);
    CHECK_EQ_INT(tk_manifest__path_check("include/a.cuh"), 0);
    CHECK_EQ_INT(tk_manifest__path_check("../a"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("a/../b"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("/etc/passwd"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("a//b"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("a/./b"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("a\\b"), -1);
    CHECK_EQ_INT(tk_manifest__path_check("dir/"), -1);
    char longc[300], deep[400] = "";
    memset(longc, 'n', sizeof longc - 1);
    longc[sizeof longc - 1] = '\0';
    CHECK_EQ_INT(tk_manifest__path_check(longc), -1); /* a component longer than NAME_MAX */
    for (int i = 0; i < 65; i++)
        strcat(deep, i ? "/d" : "d");
    CHECK_EQ_INT(tk_manifest__path_check(deep), -1); /* 65 levels */
    deep[strlen(deep) - 2] = '\0';
    CHECK_EQ_INT(tk_manifest__path_check(deep), 0);  /* 64 levels */
    int major = 0;
    CHECK_EQ_INT(tk_manifest__version_parse("1.2.3", &major), 0);
    CHECK_EQ_INT(major, 1);
    CHECK_EQ_INT(tk_manifest__version_parse("0.1.0", NULL), -1);
    CHECK_EQ_INT(tk_manifest__version_parse("1.2", NULL), -1);
    CHECK_EQ_INT(tk_manifest__version_parse("1.02.3", NULL), -1);
    CHECK_EQ_INT(tk_manifest__version_parse("1.2.3-rc1", NULL), -1);
    CHECK(tk_state__version_cmp("1.10.0", "1.9.9") > 0);
    CHECK(tk_state__version_cmp("1.0.0", "1.0.0") == 0);
    CHECK(tk_state__version_cmp("1.0.1", "1.0.10") < 0);
    CHECK_EQ_INT(tk_state__version_cmp("x", "1.0.0"), -2);
    CHECK_EQ_INT(tk__edit_distance("activaton", "activation"), 1);
}

static const char *good_manifest =
    "{\"format_version\": 1, \"name\": \"o/p\", \"version\": \"1.0.0\", \"license\": \"MIT\","
    " \"files\": [{\"path\": \"a.cu\", \"sha256\": \"%s\", \"size\": 3}],"
    " \"archive\": {\"path\": \"source.tar.gz\", \"sha256\": \"%s\", \"size\": 10, \"compression\": \"gz\"}}";

static void test_manifest(void)
{
    char sha[65];
    memset(sha, 'a', 64);
    sha[64] = 0;
    char *text = tk__fmt(good_manifest, sha, sha);
    tk_manifest *m = NULL;
    CHECK_RC(tk_manifest__parse(&m, text, strlen(text)), TK_OK);
    if (m) {
        CHECK_STR(m->name, "o/p");
        CHECK_EQ_INT(m->major, 1);
        CHECK_EQ_INT(m->nfiles, 1);
        CHECK_STR(m->compression, "gz");
    }
    tk_manifest__free(m);
    free(text);

    static const struct {
        const char *json;
        const char *msg;
    } bad[] = {
        {"{", "not valid JSON"},
        {"[]", "not a JSON object"},
        {"{\"format_version\": 2}", "upgrade tk"},
        {"{\"format_version\": 1, \"name\": \"nope\", \"version\": \"1.0.0\", \"license\": \"MIT\"}", "'name'"},
        {"{\"format_version\": 1, \"name\": \"o/p\", \"version\": \"1.0\", \"license\": \"MIT\"}", "'version'"},
        {"{\"format_version\": 1, \"name\": \"o/p\", \"version\": \"1.0.0\", \"license\": \"MIT\", \"files\": []}",
         "'files'"},
        {"{\"format_version\": 1, \"format_version\": 1}", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        m = NULL;
        CHECK_RC(tk_manifest__parse(&m, bad[i].json, strlen(bad[i].json)), TK_ERR_MANIFEST);
        CHECK_CONTAINS(tk_last_error(), bad[i].msg);
        CHECK(m == NULL);
    }
    /* An unsafe file path inside an otherwise valid manifest. */
    char *evil = tk__fmt(good_manifest, sha, sha);
    char *p = strstr(evil, "a.cu");
    memcpy(p, "../x", 4);
    CHECK_RC(tk_manifest__parse(&m, evil, strlen(evil)), TK_ERR_MANIFEST);
    CHECK_CONTAINS(tk_last_error(), "safe relative path");
    free(evil);
}

static void test_sign_verify(void)
{
    char *key = tmp("k.pem");
    char *pub = NULL;
    CHECK_RC(tk_hub__key_generate(&pub, key), TK_OK);
    struct stat st;
    CHECK(stat(key, &st) == 0 && (st.st_mode & 0777) == 0600);
    char *again = NULL;
    CHECK_RC(tk_hub__key_generate(&again, key), TK_ERR_IO); /* never overwrites */
    CHECK(again == NULL);
    tk_hub_key *k = NULL;
    CHECK_RC(tk_hub__key_load(&k, key), TK_OK);
    const char msg[] = "{\"manifest\": true}\n";
    char *sig = NULL;
    CHECK_RC(tk_hub__sign(&sig, k, msg, strlen(msg)), TK_OK);
    char keyid[TK_KEYID_LEN], pk[TK_PUBKEY_LEN], want[TK_KEYID_LEN];
    uint8_t raw[64];
    CHECK_RC(tk_hub__sig_parse(keyid, pk, raw, sig, strlen(sig)), TK_OK);
    CHECK_STR(pk, pub);
    CHECK_RC(tk_hub__pubkey_check(pub, want), TK_OK);
    CHECK_STR(keyid, want);
    CHECK_RC(tk_hub__verify(pk, raw, msg, strlen(msg)), TK_OK);
    /* One flipped byte of the message, or of the signature, fails. */
    char tampered[sizeof msg];
    memcpy(tampered, msg, sizeof msg);
    tampered[3] ^= 1;
    CHECK_RC(tk_hub__verify(pk, raw, tampered, strlen(tampered)), TK_ERR_SIGNATURE);
    raw[10] ^= 0x40;
    CHECK_RC(tk_hub__verify(pk, raw, msg, strlen(msg)), TK_ERR_SIGNATURE);
    /* Another key's public key with this signature fails. */
    char *key2 = tmp("k2.pem"), *pub2 = NULL;
    CHECK_RC(tk_hub__key_generate(&pub2, key2), TK_OK);
    raw[10] ^= 0x40;
    CHECK_RC(tk_hub__verify(pub2, raw, msg, strlen(msg)), TK_ERR_SIGNATURE);
    /* Malformed signature files. */
    const char *bad[] = {"x", "{}", "{\"format_version\": 1, \"alg\": \"rsa\"}",
                         "{\"format_version\": 1, \"alg\": \"ed25519\", \"keyid\": \"SHA256:00\", \"sig\": \"00\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_RC(tk_hub__sig_parse(keyid, pk, raw, bad[i], strlen(bad[i])), TK_ERR_SIGNATURE);
    CHECK_RC(tk_hub__pubkey_check("ed25519:xyz", NULL), TK_ERR_INVALID);
    tk_hub__key_free(k);
    free(sig);
    free(pub);
    free(pub2);
    free(key);
    free(key2);
}

static void test_state(void)
{
    char *dir = tmp("state");
    tk_state *st = NULL;
    CHECK_RC(tk_state__open(&st, dir), TK_OK);
    if (!st)
        return;
    /* trust */
    char *pk = NULL;
    CHECK_RC(tk_state__trust_add(st, "org", "SHA256:aa", "ed25519:00", "c"), TK_OK);
    CHECK_RC(tk_state__trust_get(&pk, st, "org", "SHA256:aa"), TK_OK);
    CHECK_STR(pk, "ed25519:00");
    free(pk);
    CHECK_RC(tk_state__trust_get(&pk, st, "other", "SHA256:aa"), TK_OK);
    CHECK(pk == NULL);
    CHECK_RC(tk_state__trust_remove(st, "org", "SHA256:aa"), TK_OK);
    CHECK_RC(tk_state__trust_remove(st, "org", "SHA256:aa"), TK_ERR_NOT_FOUND);
    /* versions seen only grow */
    char *v = NULL;
    CHECK_RC(tk_state__begin(st), TK_OK);
    CHECK_RC(tk_state__seen_put(st, "o/p", 1, "1.2.0", "c1"), TK_OK);
    CHECK_RC(tk_state__seen_put(st, "o/p", 1, "1.1.0", "c0"), TK_OK);
    CHECK_RC(tk_state__commit(st), TK_OK);
    CHECK_RC(tk_state__seen_get(&v, st, "o/p", 1), TK_OK);
    CHECK_STR(v, "1.2.0");
    free(v);
    /* packages */
    tk_state_file f = {"a.cu", "0000000000000000000000000000000000000000000000000000000000000000", 3};
    tk_state_pkg p = {"o/p", 1, "1.2.0", "c1", "ms", "{}", 2, "SHA256:aa", "file:///x", 7, 1, &f};
    CHECK_RC(tk_state__begin(st), TK_OK);
    CHECK_RC(tk_state__pkg_put(st, &p), TK_OK);
    CHECK_RC(tk_state__commit(st), TK_OK);
    tk_state_pkg *got = NULL;
    CHECK_RC(tk_state__pkg_get(&got, st, "o/p", 0), TK_OK);
    if (got) {
        CHECK_STR(got->commit, "c1");
        CHECK_EQ_INT(got->nfiles, 1);
        CHECK_STR(got->files[0].path, "a.cu");
    }
    tk_state__pkg_free(got);
    got = NULL;
    CHECK_RC(tk_state__pkg_get(&got, st, "o/p", 2), TK_ERR_NOT_FOUND);
    /* a rolled-back transaction leaves nothing */
    tk_state_pkg q = p;
    q.major = 2;
    CHECK_RC(tk_state__begin(st), TK_OK);
    CHECK_RC(tk_state__pkg_put(st, &q), TK_OK);
    tk_state__rollback(st);
    CHECK_RC(tk_state__pkg_get(&got, st, "o/p", 2), TK_ERR_NOT_FOUND);
    tk_state__close(st);

    /* A database from a newer tk is refused, not damaged. */
    char *db = tk__fmt("%s/state.db", dir);
    sqlite3 *h = NULL;
    sqlite3_open(db, &h);
    sqlite3_exec(h, "PRAGMA user_version=99", NULL, NULL, NULL);
    sqlite3_close(h);
    st = NULL;
    CHECK_RC(tk_state__open(&st, dir), TK_ERR_CACHE);
    CHECK_CONTAINS(tk_last_error(), "newer than this tk");
    CHECK(st == NULL);
    free(db);
    free(dir);
}

static void test_store_objects(void)
{
    char *dir = tmp("store");
    tk_state *st = NULL;
    CHECK_RC(tk_state__open(&st, dir), TK_OK);
    if (!st)
        return;
    char *src = tk__fmt("%s/obj", tk_state__tmp_dir(st));
    const char data[] = "hello";
    CHECK_RC(tk__write_atomic(src, data, 5, 0644), TK_OK);
    char sha[65];
    tk__sha256_hex(sha, data, 5);
    CHECK_RC(tk_state__object_put(st, src, sha), TK_OK);
    char *obj = tk_state__object_path(st, sha);
    struct stat sb;
    CHECK(stat(obj, &sb) == 0 && (sb.st_mode & 0222) == 0);
    /* unreferenced objects and stale tmp files go at gc */
    char *stale = tk__fmt("%s/.tmp-stale", tk_state__tmp_dir(st));
    CHECK_RC(tk__write_atomic(stale, "x", 1, 0644), TK_OK);
    int64_t freed = 0;
    CHECK_RC(tk_state__gc(st, &freed), TK_OK);
    CHECK_EQ_INT(freed, 5);
    CHECK(!tk__path_exists(obj));
    CHECK(!tk__path_exists(stale));
    tk_state__close(st);
    free(src);
    free(obj);
    free(stale);
    free(dir);
}

static void test_write_atomic_and_errors(void)
{
    char *p = tmp("atomic");
    CHECK_RC(tk__write_atomic(p, "one", 3, 0644), TK_OK);
    CHECK_RC(tk__write_atomic(p, "two", 3, 0644), TK_OK);
    char *got = NULL;
    size_t n = 0;
    CHECK_RC(tk__read_file(&got, &n, p, 100), TK_OK);
    CHECK_STR(got, "two");
    free(got);
    CHECK_RC(tk__read_file(&got, &n, p, 2), TK_ERR_INVALID);
    CHECK_RC(tk__write_atomic("/nonexistent-dir/x", "a", 1, 0644), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "/nonexistent-dir");
    CHECK_STR(tk_status_str(TK_ERR_ROLLBACK), "rollback refused");
    CHECK_STR(tk_status_str(12345), "unknown status");
    free(p);
}

/* Writes a small package "tktest/demo" (as tests/cli/get.sh's make_pkg) into dir. */
static void write_pkg(const char *dir)
{
    char *spec = tk__fmt("%s/kernel.json", dir), *src = tk__fmt("%s/scale.cu", dir);
    static const char k[] =
        "{\"name\": \"tktest/demo\", \"version\": \"1.0.0\", \"license\": \"MIT\", \"kernels\": [{\"name\": "
        "\"scale_f32\", \"op\": \"scale\", \"source\": \"scale.cu\", \"symbol\": \"scale\", \"params\": [{\"name\": "
        "\"out\", \"type\": \"tensor\", \"dtype\": \"f32\"}, {\"name\": \"n\", \"type\": \"i64\", \"value\": "
        "\"numel(out)\"}], \"launch\": {\"grid\": [\"cdiv(n, 256)\"], \"block\": [\"256\"], \"smem\": \"0\"}}]}\n";
    static const char c[] = "extern \"C\" __global__ void scale(float *out, long long n) {}\n";
    CHECK_RC(tk__mkdirs(dir, 0755), TK_OK);
    CHECK_RC(tk__write_atomic(spec, k, strlen(k), 0644), TK_OK);
    CHECK_RC(tk__write_atomic(src, c, strlen(c), 0644), TK_OK);
    free(spec);
    free(src);
}

/* The C API follows --trust's rules: trust_unknown trusts the signer of an org with no key (first
 * use) and never replaces one. (tk_get_kernel installs through tk_pkg_get with its opts.get; it
 * needs a device before it gets there, so it is not called here.) */
static void test_trust_first_use_api(void)
{
    char *ka = tmp("a.key"), *kb = tmp("b.key"), *pkg = tmp("pkg"), *tree = tmp("tree"), *home1 = tmp("home1"),
         *home2 = tmp("home2"), *pub_a = NULL, *pub_b = NULL, *url = tk__fmt("file://%s", tree);
    tk_ctx *ctx = NULL;
    tk_pkg *p = NULL;
    CHECK_RC(tk_keygen(&pub_a, ka), TK_OK);
    CHECK_RC(tk_keygen(&pub_b, kb), TK_OK);
    write_pkg(pkg);
    tk_ctx_opts co = TK_CTX_OPTS_INIT;
    co.home = home1;
    co.endpoint = url;
    co.offline = 0;
    CHECK_RC(tk_ctx_new(&ctx, &co), TK_OK);
    tk_publish_opts po = TK_PUBLISH_OPTS_INIT;
    po.key_path = kb;
    CHECK_RC(tk_publish(NULL, ctx, pkg, tree, &po), TK_OK);
    /* org pinned to key a; the registry's key b is refused, --trust or not */
    CHECK_RC(tk_trust_add(ctx, "tktest", pub_a, NULL), TK_OK);
    tk_get_opts go = TK_GET_OPTS_INIT;
    go.trust_unknown = 1;
    CHECK_RC(tk_pkg_get(&p, ctx, "tktest/demo", &go), TK_ERR_UNTRUSTED);
    CHECK_CONTAINS(tk_last_error(), "is pinned to key");
    CHECK(p == NULL);
    char *json = NULL;
    CHECK_RC(tk_trust_list_json(&json, ctx), TK_OK);
    CHECK(json && strstr(json, pub_b + 8) == NULL);
    free(json);
    tk_ctx_free(ctx);
    /* a home with no key for the org: first use trusts b */
    co.home = home2;
    CHECK_RC(tk_ctx_new(&ctx, &co), TK_OK);
    CHECK_RC(tk_pkg_get(&p, ctx, "tktest/demo", &go), TK_OK);
    tk_pkg_free(p);
    json = NULL;
    CHECK_RC(tk_trust_list_json(&json, ctx), TK_OK);
    CHECK(json && strstr(json, pub_b + 8) != NULL);
    free(json);
    tk_ctx_free(ctx);
    free(ka);
    free(kb);
    free(pkg);
    free(tree);
    free(home1);
    free(home2);
    free(pub_a);
    free(pub_b);
    free(url);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tk-test-pkg.%d", (int)getpid());
    tk__mkdirs(tmpdir, 0755);
    RUN(test_refs);
    RUN(test_paths_and_versions);
    RUN(test_manifest);
    RUN(test_sign_verify);
    RUN(test_state);
    RUN(test_store_objects);
    RUN(test_write_atomic_and_errors);
    RUN(test_trust_first_use_api);
    tk__rmtree(tmpdir);
    return th_done();
}
