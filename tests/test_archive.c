/*
 * test_archive.c — source archives: deterministic creation and hostile extraction.
 *
 * The hostile archives are real: each is written here with libarchive's own writer from raw entries
 * (path traversal, absolute paths, links, devices, FIFOs, sparse files, duplicates, bombs, truncation,
 * garbage, zip). After every refused extraction the test checks that the destination is empty and
 * that nothing appeared beside it or in the directory a symlink entry pointed to.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/time.h>
#include <unistd.h>

#include <archive.h>
#include <archive_entry.h>

#include "common/common.h"
#include "harness.h"
#include "hub/archive.h"
#include "tk.h"

static char root[256]; /* the test's private temp directory */
static char box[300], dest[320], outside[300], srcdir[300];

/* ---- helpers ---------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void fill_random(unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 7;
        rng_state ^= rng_state << 17;
        p[i] = (unsigned char)(rng_state >> 24);
    }
}

static char *pjoin(const char *a, const char *b)
{
    char *p = tk__path_join(a, b);
    if (!p)
        abort();
    return p;
}

/* Writes dir/rel (creating parent directories). */
static void put_file(const char *dir, const char *rel, const void *data, size_t n)
{
    char *full = pjoin(dir, rel);
    char *slash = strrchr(full, '/');
    *slash = '\0';
    tk__mkdirs(full, 0755);
    *slash = '/';
    int fd = open(full, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || tk__write_all(fd, data, n, full) != TK_OK)
        fprintf(stderr, "cannot write %s\n", full);
    if (fd >= 0)
        close(fd);
    free(full);
}

/* Entries in a directory (not "." or ".."), or -1 when it cannot be opened. */
static int count_entries(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            n++;
    closedir(d);
    return n;
}

/* A fresh layout: root/box/dest (the unpack directory, alone in box), root/outside (the target of
 * symlink entries), root/src (sources). */
static void fresh(void)
{
    char *p;
    tk__rmtree(box);
    tk__rmtree(outside);
    tk__mkdirs(dest, 0755);
    tk__mkdirs(outside, 0755);
    tk__mkdirs(srcdir, 0755);
    p = pjoin(root, "evil");
    tk__rmtree(p);
    free(p);
}

/* After a refused extraction: dest is empty, box holds only dest, nothing escaped. */
#define CHECK_CLEAN()                                                                                                  \
    do {                                                                                                               \
        CHECK_EQ_INT(count_entries(dest), 0);                                                                          \
        CHECK_EQ_INT(count_entries(box), 1);                                                                           \
        CHECK_EQ_INT(count_entries(outside), 0);                                                                       \
        char *th_e = pjoin(root, "evil");                                                                              \
        CHECK(!tk__path_exists(th_e));                                                                                 \
        free(th_e);                                                                                                    \
        CHECK(!tk__path_exists("/abs/path"));                                                                          \
    } while (0)

/* A raw archive entry, written as given: no sanitizing. */
typedef struct {
    const char *path;
    unsigned type;        /* AE_IFREG, AE_IFDIR, AE_IFLNK, AE_IFCHR, AE_IFBLK, AE_IFIFO */
    const char *link;     /* symlink target, or hardlink target when hard */
    int hard;
    const void *data;
    size_t len;
    int64_t size;         /* declared size; -1: len */
    int sparse;           /* 1: declare a sparse map with a hole */
} rawent;

/* Writes entries with libarchive's writer. filter: "gz", "zst", "xz", "none"; format: "pax", "zip". */
static int write_raw(const char *path, const char *filter, const char *format, const rawent *ents, size_t n)
{
    struct archive *a = archive_write_new();
    int ok = a != NULL;
    if (ok && !strcmp(format, "zip"))
        ok = archive_write_set_format_zip(a) == ARCHIVE_OK;
    else if (ok)
        ok = archive_write_set_format_pax_restricted(a) == ARCHIVE_OK;
    if (ok && !strcmp(filter, "gz"))
        ok = archive_write_add_filter_gzip(a) == ARCHIVE_OK;
    else if (ok && !strcmp(filter, "zst"))
        ok = archive_write_add_filter_zstd(a) == ARCHIVE_OK;
    else if (ok && !strcmp(filter, "xz"))
        ok = archive_write_add_filter_xz(a) == ARCHIVE_OK;
    if (ok)
        ok = archive_write_open_filename(a, path) == ARCHIVE_OK;
    for (size_t i = 0; ok && i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        const rawent *r = &ents[i];
        int64_t size = r->size >= 0 ? r->size : (int64_t)r->len;
        archive_entry_copy_pathname(e, r->path);
        archive_entry_set_filetype(e, r->type ? r->type : AE_IFREG);
        archive_entry_set_perm(e, r->type == AE_IFDIR ? 0755 : 0644);
        if (r->type == AE_IFLNK)
            archive_entry_copy_symlink(e, r->link);
        if (r->hard)
            archive_entry_copy_hardlink(e, r->link);
        if (r->type == AE_IFCHR || r->type == AE_IFBLK)
            archive_entry_set_rdev(e, makedev(1, 3));
        if (!r->type || r->type == AE_IFREG)
            archive_entry_set_size(e, r->hard ? 0 : size);
        if (r->sparse) {
            archive_entry_sparse_add_entry(e, 0, 512);
            archive_entry_sparse_add_entry(e, size - 512, 512);
        }
        ok = archive_write_header(a, e) >= ARCHIVE_WARN;
        if (ok && r->len && !r->hard)
            ok = archive_write_data(a, r->data, r->len) == (la_ssize_t)r->len;
        archive_entry_free(e);
    }
    if (!ok && a)
        fprintf(stderr, "write_raw %s: %s\n", path, archive_error_string(a));
    if (a) {
        ok = archive_write_close(a) == ARCHIVE_OK && ok;
        archive_write_free(a);
    }
    return ok ? 0 : -1;
}

static void set_expect(tk_manifest_file *x, char sha[TK_SHA256_HEX], const char *path, const void *data, size_t n)
{
    tk__sha256_hex(sha, data, n);
    x->path = path;
    x->sha256 = sha;
    x->size = (int64_t)n;
}

static int files_equal(const char *a, const char *b)
{
    char *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    int eq = tk__read_file(&da, &na, a, (size_t)1 << 30) == TK_OK &&
             tk__read_file(&db, &nb, b, (size_t)1 << 30) == TK_OK && na == nb && memcmp(da, db, na) == 0;
    free(da);
    free(db);
    return eq;
}

static const char OK_TEXT[] = "ok\n";

/* One hostile archive with a valid "ok.txt" first (so something is written before the refusal): it
 * must be refused with `want`, leaving everything clean. */
static void expect_refused(const char *filter, const rawent *ents, size_t n, const tk_manifest_file *ex, size_t nex,
                           const tk_hub_unpack_limits *lim, int want, const char *msg)
{
    fresh();
    char *arc = pjoin(root, "hostile.tar");
    CHECK_EQ_INT(write_raw(arc, filter, "pax", ents, n), 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, nex, lim), want);
    if (getenv("TK_TEST_VERBOSE"))
        printf("     refused: %s\n", tk_last_error());
    if (msg)
        CHECK_CONTAINS(tk_last_error(), msg);
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

/* ---- creation and round trips ------------------------------------------------------------------ */

#define NSRC 6
static const char *src_files[NSRC] = {
    "README.md", "big.bin", "empty.txt", "src/a.cu", "src/include/deep/b.cuh",
    /* past ustar's 255-byte name limit: needs a pax header */
    "long/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/"
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb/"
    "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc.cuh"};
static tk_manifest_file src_expect[NSRC];
static char src_sha[NSRC][TK_SHA256_HEX];

static void make_sources(void)
{
    static unsigned char big[300 * 1024];
    fill_random(big, sizeof big);
    const char *texts[NSRC] = {"# demo\n", NULL, "", "__global__ void k() {}\n", "#pragma once\n", "// long\n"};
    for (size_t i = 0; i < NSRC; i++) {
        const void *d = texts[i] ? (const void *)texts[i] : big;
        size_t n = texts[i] ? strlen(texts[i]) : sizeof big;
        put_file(srcdir, src_files[i], d, n);
        set_expect(&src_expect[i], src_sha[i], src_files[i], d, n);
    }
}

static void round_trip(const char *comp)
{
    fresh();
    char *arc = pjoin(root, !strcmp(comp, "gz") ? "rt.tar.gz" : "rt.tar.zst");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, comp), TK_OK);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_OK);
    for (size_t i = 0; i < NSRC; i++) {
        char *a = pjoin(srcdir, src_files[i]), *b = pjoin(dest, src_files[i]);
        CHECK(files_equal(a, b));
        struct stat st;
        CHECK(lstat(b, &st) == 0 && S_ISREG(st.st_mode));
        free(a);
        free(b);
    }
    unlink(arc);
    free(arc);
}

static void test_round_trip_gz(void) { round_trip("gz"); }
static void test_round_trip_zst(void) { round_trip("zst"); }

static void test_round_trip_empty(void)
{
    fresh();
    char *arc = pjoin(root, "empty.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, NULL, 0, "gz"), TK_OK);
    CHECK_RC(tk_hub__archive_extract(arc, dest, NULL, 0, NULL), TK_OK);
    CHECK_EQ_INT(count_entries(dest), 0);
    unlink(arc);
    free(arc);
}

/* Same files, different mtimes and modes, different runs: the same bytes. */
static void determinism(const char *comp)
{
    char *a = pjoin(root, "det-a"), *b = pjoin(root, "det-b");
    CHECK_RC(tk_hub__archive_create(a, srcdir, src_files, NSRC, comp), TK_OK);
    char *f = pjoin(srcdir, "src/a.cu");
    struct timeval tv[2] = {{1000000000, 0}, {1000000000, 0}};
    CHECK(utimes(f, tv) == 0);
    CHECK(chmod(f, 0600) == 0);
    CHECK_RC(tk_hub__archive_create(b, srcdir, src_files, NSRC, comp), TK_OK);
    CHECK(files_equal(a, b));
    chmod(f, 0644);

    char *data = NULL;
    size_t n = 0;
    CHECK_RC(tk__read_file(&data, &n, a, 1 << 24), TK_OK);
    if (data && !strcmp(comp, "gz")) {
        CHECK(n > 10 && (unsigned char)data[0] == 0x1f && (unsigned char)data[1] == 0x8b);
        CHECK(n > 10 && data[4] == 0 && data[5] == 0 && data[6] == 0 && data[7] == 0); /* MTIME */
        CHECK(n > 10 && (data[3] & 0x08) == 0);                                         /* no FNAME */
    } else if (data) {
        CHECK(n > 4 && (unsigned char)data[0] == 0x28 && (unsigned char)data[1] == 0xb5); /* zstd magic */
    }
    free(data);

    /* The tar inside: given order, pinned metadata. */
    struct archive *r = archive_read_new();
    archive_read_support_filter_all(r);
    archive_read_support_format_all(r);
    CHECK(archive_read_open_filename(r, a, 65536) == ARCHIVE_OK);
    struct archive_entry *e;
    size_t i = 0;
    while (archive_read_next_header(r, &e) == ARCHIVE_OK) {
        CHECK(i < NSRC && !strcmp(archive_entry_pathname(e), src_files[i]));
        CHECK_EQ_INT(archive_entry_mtime(e), 0);
        CHECK_EQ_INT(archive_entry_uid(e), 0);
        CHECK_EQ_INT(archive_entry_gid(e), 0);
        CHECK(!archive_entry_uname(e) || !*archive_entry_uname(e));
        CHECK(!archive_entry_gname(e) || !*archive_entry_gname(e));
        CHECK_EQ_INT(archive_entry_mode(e), AE_IFREG | 0644);
        i++;
    }
    CHECK_EQ_INT(i, NSRC);
    CHECK_EQ_INT(archive_format(r) & ARCHIVE_FORMAT_BASE_MASK, ARCHIVE_FORMAT_TAR);
    archive_read_free(r);
    unlink(a);
    unlink(b);
    free(a);
    free(b);
    free(f);
}

static void test_determinism_gz(void) { determinism("gz"); }
static void test_determinism_zst(void) { determinism("zst"); }

static void test_create_order_kept(void)
{
    const char *order[2] = {"src/a.cu", "README.md"};
    char *arc = pjoin(root, "order.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, order, 2, "gz"), TK_OK);
    struct archive *r = archive_read_new();
    archive_read_support_filter_gzip(r);
    archive_read_support_format_tar(r);
    CHECK(archive_read_open_filename(r, arc, 65536) == ARCHIVE_OK);
    struct archive_entry *e;
    for (int i = 0; i < 2; i++) {
        CHECK(archive_read_next_header(r, &e) == ARCHIVE_OK);
        CHECK_STR(archive_entry_pathname(e), order[i]);
    }
    CHECK(archive_read_next_header(r, &e) == ARCHIVE_EOF);
    archive_read_free(r);
    unlink(arc);
    free(arc);
}

static void test_create_errors(void)
{
    char *outdir = pjoin(root, "createout");
    tk__rmtree(outdir);
    tk__mkdirs(outdir, 0755);
    char *arc = pjoin(outdir, "x.tar.gz");
    const char *one[1] = {"README.md"};
    CHECK_RC(tk_hub__archive_create(arc, srcdir, one, 1, "bz2"), TK_ERR_INVALID);
    const char *bad[] = {"../x", "/etc/passwd", "a/./b", "a//b", "a\\b", "", "a/../b"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *f[1] = {bad[i]};
        CHECK_RC(tk_hub__archive_create(arc, srcdir, f, 1, "gz"), TK_ERR_INVALID);
    }
    const char *dup[2] = {"README.md", "README.md"};
    CHECK_RC(tk_hub__archive_create(arc, srcdir, dup, 2, "gz"), TK_ERR_INVALID);
    const char *missing[1] = {"nope.cu"};
    CHECK_RC(tk_hub__archive_create(arc, srcdir, missing, 1, "gz"), TK_ERR_NOT_FOUND);
    CHECK_CONTAINS(tk_last_error(), "nope.cu");

    char *lnk = pjoin(srcdir, "link.cu");
    unlink(lnk);
    CHECK(symlink("README.md", lnk) == 0);
    const char *viasym[1] = {"link.cu"};
    CHECK_RC(tk_hub__archive_create(arc, srcdir, viasym, 1, "gz"), TK_ERR_INVALID);
    unlink(lnk);
    const char *isdir[1] = {"src"};
    CHECK_RC(tk_hub__archive_create(arc, srcdir, isdir, 1, "gz"), TK_ERR_INVALID);
    /* no archive and no temp file left behind */
    CHECK_EQ_INT(count_entries(outdir), 0);

    char *nodir = pjoin(root, "no/such/dir/x.tar.gz");
    CHECK(tk_hub__archive_create(nodir, srcdir, one, 1, "gz") != TK_OK);

    /* replacing an existing archive is atomic and leaves only the archive */
    CHECK_RC(tk_hub__archive_create(arc, srcdir, one, 1, "zst"), TK_OK);
    CHECK_RC(tk_hub__archive_create(arc, srcdir, one, 1, "gz"), TK_OK);
    CHECK_EQ_INT(count_entries(outdir), 1);
    tk__rmtree(outdir);
    free(nodir);
    free(lnk);
    free(arc);
    free(outdir);
}

/* ---- contents against the manifest ------------------------------------------------------------ */

static void test_digest_mismatch(void)
{
    fresh();
    char *arc = pjoin(root, "d.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "gz"), TK_OK);
    tk_manifest_file ex[NSRC];
    memcpy(ex, src_expect, sizeof ex);
    char wrong[TK_SHA256_HEX];
    memset(wrong, 'a', 64);
    wrong[64] = '\0';
    ex[3].sha256 = wrong;
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, NSRC, NULL), TK_ERR_DIGEST);
    CHECK_CONTAINS(tk_last_error(), "src/a.cu");
    CHECK_CONTAINS(tk_last_error(), wrong);
    CHECK_CONTAINS(tk_last_error(), src_sha[3]);
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

static void test_missing_expected_file(void)
{
    fresh();
    char *arc = pjoin(root, "m.tar.zst");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "zst"), TK_OK);
    tk_manifest_file ex[NSRC + 1];
    memcpy(ex, src_expect, sizeof src_expect);
    ex[NSRC] = (tk_manifest_file){"src/missing.cu", src_sha[0], 7};
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, NSRC + 1, NULL), TK_ERR_DIGEST);
    CHECK_CONTAINS(tk_last_error(), "src/missing.cu");
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

static void test_unexpected_file(void)
{
    fresh();
    char *arc = pjoin(root, "u.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "gz"), TK_OK);
    /* the manifest lists all but the last file */
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC - 1, NULL), TK_ERR_ARCHIVE);
    CHECK_CONTAINS(tk_last_error(), "unexpected file 'long/");
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

static void test_size_bigger_than_expected(void)
{
    static unsigned char data[2000];
    memset(data, 'x', sizeof data);
    tk_manifest_file ex[2];
    char s0[TK_SHA256_HEX], s1[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "ok.txt", OK_TEXT, 3);
    set_expect(&ex[1], s1, "grow.cu", data, 1000); /* the manifest says 1000 bytes */
    rawent ents[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"grow.cu", 0, NULL, 0, data, 2000, -1, 0}};
    expect_refused("gz", ents, 2, ex, 2, NULL, TK_ERR_DIGEST, "grow.cu");
}

static void test_duplicate_entry(void)
{
    tk_manifest_file ex[1];
    char s0[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "ok.txt", OK_TEXT, 3);
    rawent ents[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    expect_refused("gz", ents, 2, ex, 1, NULL, TK_ERR_ARCHIVE, "twice");
}

/* ---- hostile archives ------------------------------------------------------------------------- */

static void test_hostile_paths(void)
{
    char longp[1100];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    for (size_t i = 100; i < sizeof longp - 1; i += 100)
        longp[i] = '/';
    const char *bad[] = {"../evil", "/abs/path", "a/../../x", "../../evil", "./ok2.txt", "a//b", "a\\b",
                         "a/./b",   "x\001y",    longp,       ".",          "..",        "a/.."};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tk_manifest_file ex[2];
        char s0[TK_SHA256_HEX], s1[TK_SHA256_HEX];
        set_expect(&ex[0], s0, "ok.txt", OK_TEXT, 3);
        /* even when the manifest lists the path, the rules refuse it */
        set_expect(&ex[1], s1, "ok3.txt", OK_TEXT, 3);
        rawent ents[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {bad[i], 0, NULL, 0, OK_TEXT, 3, -1, 0}};
        expect_refused(i % 2 ? "zst" : "gz", ents, 2, ex, 2, NULL, TK_ERR_ARCHIVE, "refused");
    }
    /* a hostile directory entry too */
    rawent dents[] = {{"../evil/", AE_IFDIR, NULL, 0, NULL, 0, 0, 0}};
    expect_refused("gz", dents, 1, NULL, 0, NULL, TK_ERR_ARCHIVE, "'..'");
}

static void test_links_devices_fifos(void)
{
    tk_manifest_file ex[2];
    char s0[TK_SHA256_HEX], s1[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "ok.txt", OK_TEXT, 3);
    set_expect(&ex[1], s1, "link/x", OK_TEXT, 3);

    rawent sym[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0},
                    {"link", AE_IFLNK, outside, 0, NULL, 0, 0, 0},
                    {"link/x", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    expect_refused("gz", sym, 3, ex, 2, NULL, TK_ERR_ARCHIVE, "symlink");
    rawent symrel[] = {{"up", AE_IFLNK, "..", 0, NULL, 0, 0, 0}, {"up/evil", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    expect_refused("zst", symrel, 2, ex, 2, NULL, TK_ERR_ARCHIVE, "symlink");

    tk_manifest_file exh[2];
    char h0[TK_SHA256_HEX], h1[TK_SHA256_HEX];
    set_expect(&exh[0], h0, "ok.txt", OK_TEXT, 3);
    set_expect(&exh[1], h1, "hl", OK_TEXT, 3);
    rawent hard[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"hl", AE_IFREG, "ok.txt", 1, NULL, 0, 0, 0}};
    expect_refused("gz", hard, 2, exh, 2, NULL, TK_ERR_ARCHIVE, "hard link");
    char *passwd = "/etc/passwd";
    rawent hardabs[] = {{"hl", AE_IFREG, passwd, 1, NULL, 0, 0, 0}};
    expect_refused("gz", hardabs, 1, exh, 2, NULL, TK_ERR_ARCHIVE, "hard link");

    rawent chr[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"null", AE_IFCHR, NULL, 0, NULL, 0, 0, 0}};
    expect_refused("gz", chr, 2, ex, 1, NULL, TK_ERR_ARCHIVE, "character device");
    rawent blk[] = {{"sda", AE_IFBLK, NULL, 0, NULL, 0, 0, 0}};
    expect_refused("gz", blk, 1, ex, 1, NULL, TK_ERR_ARCHIVE, "block device");
    rawent fifo[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"pipe", AE_IFIFO, NULL, 0, NULL, 0, 0, 0}};
    expect_refused("zst", fifo, 2, ex, 1, NULL, TK_ERR_ARCHIVE, "FIFO");
}

static void test_sparse_file(void)
{
    static unsigned char data[1024];
    memset(data, 's', sizeof data);
    tk_manifest_file ex[1];
    char s0[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "sparse.bin", data, 8192);
    ex[0].size = 8192;
    rawent ents[] = {{"sparse.bin", 0, NULL, 0, data, 1024, 8192, 1}};
    expect_refused("gz", ents, 1, ex, 1, NULL, TK_ERR_ARCHIVE, "sparse");
}

static void test_type_clashes(void)
{
    tk_manifest_file ex[2];
    char s0[TK_SHA256_HEX], s1[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "a", OK_TEXT, 3);
    set_expect(&ex[1], s1, "a/b", OK_TEXT, 3);
    /* a file, then a file "under" it */
    rawent under[] = {{"a", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"a/b", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    expect_refused("gz", under, 2, ex, 2, NULL, TK_ERR_ARCHIVE, "must be a directory");
    /* a directory, then a file by its name */
    rawent dirfile[] = {{"a/", AE_IFDIR, NULL, 0, NULL, 0, 0, 0}, {"a", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    expect_refused("gz", dirfile, 2, ex, 2, NULL, TK_ERR_ARCHIVE, "'a'");
    /* a file, then a directory by its name */
    rawent filedir[] = {{"a", 0, NULL, 0, OK_TEXT, 3, -1, 0}, {"a", AE_IFDIR, NULL, 0, NULL, 0, 0, 0}};
    expect_refused("gz", filedir, 2, ex, 2, NULL, TK_ERR_ARCHIVE, "must be a directory");

    /* directory entries themselves are fine */
    fresh();
    char *arc = pjoin(root, "dirs.tar.gz");
    rawent dirs[] = {{"a/", AE_IFDIR, NULL, 0, NULL, 0, 0, 0},
                     {"a", AE_IFDIR, NULL, 0, NULL, 0, 0, 0},
                     {"a/b", 0, NULL, 0, OK_TEXT, 3, -1, 0},
                     {"c/d/", AE_IFDIR, NULL, 0, NULL, 0, 0, 0}};
    CHECK_EQ_INT(write_raw(arc, "gz", "pax", dirs, 4), 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, &ex[1], 1, NULL), TK_OK);
    char *p = pjoin(dest, "c/d");
    CHECK(tk__is_dir(p));
    free(p);
    unlink(arc);
    free(arc);
}

/* 200 MiB of zeros in a ~200 KiB gzip: refused from its header with the default limits, before a byte
 * is written. */
static void test_bomb_default_limits(void)
{
    fresh();
    char *arc = pjoin(root, "bomb.tar.gz");
    const int64_t big = (int64_t)200 << 20;
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    archive_write_add_filter_gzip(a);
    archive_write_set_filter_option(a, "gzip", "compression-level", "1");
    CHECK(archive_write_open_filename(a, arc) == ARCHIVE_OK);
    struct archive_entry *e = archive_entry_new();
    archive_entry_copy_pathname(e, "zeros.bin");
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    archive_entry_set_size(e, big);
    CHECK(archive_write_header(a, e) == ARCHIVE_OK);
    unsigned char *zeros = calloc(1, 1 << 20);
    for (int64_t done = 0; zeros && done < big; done += 1 << 20)
        archive_write_data(a, zeros, 1 << 20);
    archive_write_close(a);
    archive_write_free(a);
    archive_entry_free(e);
    free(zeros);

    struct stat st;
    CHECK(stat(arc, &st) == 0 && st.st_size < big / 200);
    char sha[TK_SHA256_HEX];
    memset(sha, '0', 64);
    sha[64] = '\0';
    tk_manifest_file ex[1] = {{"zeros.bin", sha, big}};
    double t0 = tk__now_ms();
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 1, NULL), TK_ERR_ARCHIVE);
    CHECK_CONTAINS(tk_last_error(), "decompression bomb");
    CHECK(tk__now_ms() - t0 < 2000);
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

/* Small limits: the ratio is crossed by the second file, after the first was written. */
static void test_bomb_small_limits(void)
{
    static unsigned char zeros[600 * 1024];
    tk_manifest_file ex[3];
    char s[3][TK_SHA256_HEX];
    const char *names[3] = {"z1", "z2", "z3"};
    rawent ents[3];
    for (int i = 0; i < 3; i++) {
        set_expect(&ex[i], s[i], names[i], zeros, sizeof zeros);
        ents[i] = (rawent){names[i], 0, NULL, 0, zeros, sizeof zeros, -1, 0};
    }
    tk_hub_unpack_limits lim = TK_HUB_UNPACK_LIMITS_DEFAULT;
    lim.max_ratio = 10;
    expect_refused("gz", ents, 3, ex, 3, &lim, TK_ERR_ARCHIVE, "decompression bomb");
    /* zstd too */
    expect_refused("zst", ents, 3, ex, 3, &lim, TK_ERR_ARCHIVE, "decompression bomb");
    /* the same archive under a looser ratio is fine */
    fresh();
    char *arc = pjoin(root, "zeros.tar.gz");
    CHECK_EQ_INT(write_raw(arc, "gz", "pax", ents, 3), 0);
    lim.max_ratio = 100000;
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 3, &lim), TK_OK);
    CHECK_EQ_INT(count_entries(dest), 3);
    unlink(arc);
    free(arc);
}

static void test_limits(void)
{
    static unsigned char data[600];
    fill_random(data, sizeof data);
    tk_manifest_file ex[5];
    char s[5][TK_SHA256_HEX];
    const char *names[5] = {"f1", "f2", "f3", "f4", "f5"};
    rawent ents[5];
    for (int i = 0; i < 5; i++) {
        set_expect(&ex[i], s[i], names[i], data, sizeof data);
        ents[i] = (rawent){names[i], 0, NULL, 0, data, sizeof data, -1, 0};
    }
    tk_hub_unpack_limits lim = TK_HUB_UNPACK_LIMITS_DEFAULT;
    lim.max_entries = 3;
    expect_refused("gz", ents, 5, ex, 5, &lim, TK_ERR_ARCHIVE, "more than 3 entries");
    lim = (tk_hub_unpack_limits)TK_HUB_UNPACK_LIMITS_DEFAULT;
    lim.max_bytes = 1000;
    expect_refused("gz", ents, 5, ex, 5, &lim, TK_ERR_ARCHIVE, "limit of 1000 bytes");
    lim = (tk_hub_unpack_limits)TK_HUB_UNPACK_LIMITS_DEFAULT;
    lim.max_file_bytes = 500;
    expect_refused("zst", ents, 5, ex, 5, &lim, TK_ERR_ARCHIVE, "per file");
    /* exactly at the limits passes */
    fresh();
    char *arc = pjoin(root, "lim.tar.gz");
    CHECK_EQ_INT(write_raw(arc, "gz", "pax", ents, 5), 0);
    lim = (tk_hub_unpack_limits){5, 3000, 600, 200};
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 5, &lim), TK_OK);
    fresh();
    lim.max_ratio = 0;
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 5, &lim), TK_ERR_INVALID);
    CHECK_EQ_INT(count_entries(dest), 0);
    unlink(arc);
    free(arc);
}

static void truncated(const char *comp)
{
    fresh();
    char *arc = pjoin(root, "trunc.tar");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, comp), TK_OK);
    struct stat st;
    CHECK(stat(arc, &st) == 0);
    CHECK(truncate(arc, st.st_size / 2) == 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_ARCHIVE);
    CHECK_CLEAN();
    /* cut just before the end: the gzip trailer (CRC, size) or zstd's last block is missing */
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, comp), TK_OK);
    CHECK(stat(arc, &st) == 0);
    CHECK(truncate(arc, st.st_size - 4) == 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_ARCHIVE);
    CHECK_CLEAN();
    unlink(arc);
    free(arc);
}

static void test_truncated_gz(void) { truncated("gz"); }
static void test_truncated_zst(void) { truncated("zst"); }

/* Damage inside compressed text breaks deflate decoding (or the tar headers behind it): an archive
 * error, even though the first damaged file is also a digest mismatch. Damage near the end may decode
 * to wrong bytes in a well-formed stream (libarchive 3.6 does not check gzip's CRC): then it is a
 * digest mismatch. Either way nothing is left behind. */
static void test_corrupt_gz(void)
{
    static char text[3][40000];
    static const char *words[] = {"kernel ", "float ",     "__global__ ", "blockIdx.x ", "return; ",
                                  "\n",      "threadIdx ", "int64_t ",    "shape ",      "stride "};
    tk_manifest_file ex[3];
    char s[3][TK_SHA256_HEX];
    const char *names[3] = {"a.cu", "b.cu", "c.cu"};
    rawent ents[3];
    for (int f = 0; f < 3; f++) {
        size_t n = 0;
        unsigned char r;
        while (n < sizeof text[f] - 16) {
            fill_random(&r, 1);
            const char *w = words[r % 10];
            memcpy(text[f] + n, w, strlen(w));
            n += strlen(w);
        }
        set_expect(&ex[f], s[f], names[f], text[f], n);
        ents[f] = (rawent){names[f], 0, NULL, 0, text[f], n, -1, 0};
    }
    char *arc = pjoin(root, "flip.tar.gz");
    const size_t cuts[] = {0, 1, 2}; /* which third of the file to damage */
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
        fresh();
        CHECK_EQ_INT(write_raw(arc, "gz", "pax", ents, 3), 0);
        char *data = NULL;
        size_t n = 0;
        CHECK_RC(tk__read_file(&data, &n, arc, 1 << 24), TK_OK);
        if (!data || n < 1000) {
            free(data);
            continue;
        }
        for (size_t i = 0; i < 16; i++)
            data[n * cuts[c] / 3 + 200 + i] ^= 0x5a;
        CHECK_RC(tk__write_atomic(arc, data, n, 0644), TK_OK);
        int rc = tk_hub__archive_extract(arc, dest, ex, 3, NULL);
        if (cuts[c] < 2)
            CHECK_EQ_INT(rc, TK_ERR_ARCHIVE);
        else
            CHECK(rc == TK_ERR_ARCHIVE || rc == TK_ERR_DIGEST);
        CHECK_CLEAN();
        free(data);
    }
    /* a damaged gzip header: not recognized at all */
    CHECK_EQ_INT(write_raw(arc, "gz", "pax", ents, 3), 0);
    char *data = NULL;
    size_t n = 0;
    CHECK_RC(tk__read_file(&data, &n, arc, 1 << 24), TK_OK);
    if (data) {
        data[2] = 7; /* compression method */
        CHECK_RC(tk__write_atomic(arc, data, n, 0644), TK_OK);
        CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 3, NULL), TK_ERR_ARCHIVE);
        CHECK_CLEAN();
    }
    free(data);
    unlink(arc);
    free(arc);
}

/* libarchive 3.6 does not check gzip's CRC, so damage inside stored (incompressible) data decodes
 * "fine": the file's sha256 is what catches it. */
static void test_corrupt_stored_data(void)
{
    fresh();
    char *arc = pjoin(root, "flip2.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "gz"), TK_OK);
    char *data = NULL;
    size_t n = 0;
    CHECK_RC(tk__read_file(&data, &n, arc, 1 << 24), TK_OK);
    if (data && n > 100) {
        data[n / 2] ^= 0x55;
        CHECK_RC(tk__write_atomic(arc, data, n, 0644), TK_OK);
        CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_DIGEST);
        CHECK_CONTAINS(tk_last_error(), "big.bin");
        CHECK_CLEAN();
    }
    free(data);
    unlink(arc);
    free(arc);
}

static void test_garbage_and_other_formats(void)
{
    fresh();
    char *arc = pjoin(root, "junk");
    unsigned char junk[4096];
    fill_random(junk, sizeof junk);
    put_file(root, "junk", junk, sizeof junk);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_ARCHIVE);
    CHECK_CLEAN();
    junk[0] = 0x1f, junk[1] = 0x8b, junk[2] = 8, junk[3] = 0; /* gzip magic, then garbage */
    put_file(root, "junk", junk, sizeof junk);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_ARCHIVE);
    CHECK_CLEAN();
    put_file(root, "junk", "", 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_ARCHIVE);
    CHECK_CLEAN();

    tk_manifest_file ex[1];
    char s0[TK_SHA256_HEX];
    set_expect(&ex[0], s0, "ok.txt", OK_TEXT, 3);
    rawent ok[] = {{"ok.txt", 0, NULL, 0, OK_TEXT, 3, -1, 0}};
    /* zip, plain and gzipped: tar only */
    const char *zipfilters[] = {"none", "gz"};
    for (int i = 0; i < 2; i++) {
        fresh();
        CHECK_EQ_INT(write_raw(arc, zipfilters[i], "zip", ok, 1), 0);
        CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 1, NULL), TK_ERR_ARCHIVE);
        CHECK_CLEAN();
    }
    /* an uncompressed tar and an xz tar: gzip and zstd only */
    const char *filters[] = {"none", "xz"};
    for (int i = 0; i < 2; i++) {
        fresh();
        CHECK_EQ_INT(write_raw(arc, filters[i], "pax", ok, 1), 0);
        CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 1, NULL), TK_ERR_ARCHIVE);
        CHECK_CLEAN();
    }
    /* the tar.gz itself is fine */
    fresh();
    CHECK_EQ_INT(write_raw(arc, "gz", "pax", ok, 1), 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 1, NULL), TK_OK);
    unlink(arc);
    free(arc);
}

static void test_bad_destination(void)
{
    fresh();
    char *arc = pjoin(root, "dst.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "gz"), TK_OK);
    /* not empty: refused, and the caller's file is left alone */
    put_file(dest, "mine.txt", "mine", 4);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_INVALID);
    CHECK_EQ_INT(count_entries(dest), 1);
    /* missing */
    char *nope = pjoin(box, "nope");
    CHECK(tk_hub__archive_extract(arc, nope, src_expect, NSRC, NULL) != TK_OK);
    CHECK(!tk__path_exists(nope));
    /* a symlink to a directory */
    char *lnk = pjoin(box, "lnk");
    CHECK(symlink(outside, lnk) == 0);
    CHECK(tk_hub__archive_extract(arc, lnk, src_expect, NSRC, NULL) != TK_OK);
    CHECK_EQ_INT(count_entries(outside), 0);
    /* a bad manifest list */
    fresh();
    tk_manifest_file ex[2] = {src_expect[0], src_expect[0]};
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 2, NULL), TK_ERR_INVALID);
    ex[1] = (tk_manifest_file){"../x", src_sha[0], 1};
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 2, NULL), TK_ERR_INVALID);
    ex[1] = (tk_manifest_file){"x", "ABCD", 1};
    CHECK_RC(tk_hub__archive_extract(arc, dest, ex, 2, NULL), TK_ERR_INVALID);
    CHECK_EQ_INT(count_entries(dest), 0);
    /* a missing archive */
    char *none = pjoin(root, "none.tar.gz");
    CHECK_RC(tk_hub__archive_extract(none, dest, src_expect, NSRC, NULL), TK_ERR_NOT_FOUND);
    free(none);
    free(lnk);
    free(nope);
    unlink(arc);
    free(arc);
}

/* A full disk, simulated with RLIMIT_FSIZE (writes past it fail with EFBIG, which tk maps to
 * TK_ERR_NOSPACE). */
static void test_disk_full(void)
{
    struct rlimit old;
    if (getrlimit(RLIMIT_FSIZE, &old) != 0)
        SKIP("getrlimit(RLIMIT_FSIZE) failed");
    fresh();
    char *arc = pjoin(root, "full.tar.gz");
    CHECK_RC(tk_hub__archive_create(arc, srcdir, src_files, NSRC, "gz"), TK_OK);
    void (*oldsig)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {100 * 1024, old.rlim_max};
    CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0);
    CHECK_RC(tk_hub__archive_extract(arc, dest, src_expect, NSRC, NULL), TK_ERR_NOSPACE);
    CHECK_CONTAINS(tk_last_error(), "big.bin");
    CHECK_CLEAN();
    /* creating: the 300 KiB random file cannot fit in 100 KiB */
    char *outdir = pjoin(root, "fullout");
    tk__mkdirs(outdir, 0755);
    char *arc2 = pjoin(outdir, "x.tar.zst");
    CHECK_RC(tk_hub__archive_create(arc2, srcdir, src_files, NSRC, "zst"), TK_ERR_NOSPACE);
    CHECK_EQ_INT(count_entries(outdir), 0);
    CHECK(setrlimit(RLIMIT_FSIZE, &old) == 0);
    signal(SIGXFSZ, oldsig);
    tk__rmtree(outdir);
    free(arc2);
    free(outdir);
    unlink(arc);
    free(arc);
}

int main(void)
{
    snprintf(root, sizeof root, "%s/tk-test-archive-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    snprintf(box, sizeof box, "%s/box", root);
    snprintf(dest, sizeof dest, "%s/dest", box);
    snprintf(outside, sizeof outside, "%s/outside", root);
    snprintf(srcdir, sizeof srcdir, "%s/src", root);
    fresh();
    make_sources();

    RUN(test_round_trip_gz);
    RUN(test_round_trip_zst);
    RUN(test_round_trip_empty);
    RUN(test_determinism_gz);
    RUN(test_determinism_zst);
    RUN(test_create_order_kept);
    RUN(test_create_errors);
    RUN(test_digest_mismatch);
    RUN(test_missing_expected_file);
    RUN(test_unexpected_file);
    RUN(test_size_bigger_than_expected);
    RUN(test_duplicate_entry);
    RUN(test_hostile_paths);
    RUN(test_links_devices_fifos);
    RUN(test_sparse_file);
    RUN(test_type_clashes);
    RUN(test_bomb_default_limits);
    RUN(test_bomb_small_limits);
    RUN(test_limits);
    RUN(test_truncated_gz);
    RUN(test_truncated_zst);
    RUN(test_corrupt_gz);
    RUN(test_corrupt_stored_data);
    RUN(test_garbage_and_other_formats);
    RUN(test_bad_destination);
    RUN(test_disk_full);

    tk__rmtree(root);
    return th_done();
}
