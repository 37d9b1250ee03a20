/*
 * manifest.c — manifest parsing and validation with jansson. Every problem is reported as
 * TK_ERR_MANIFEST naming the field and what was wrong with it.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "manifest/manifest.h"

static int name_part_ok(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return 0;
    if (!((s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z') || (s[0] >= '0' && s[0] <= '9')))
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return 0;
    }
    return 1;
}

int tk_manifest__name_check(const char *name, char *org, char *pkg)
{
    const char *slash = name ? strchr(name, '/') : NULL;
    if (!slash || strchr(slash + 1, '/') || !name_part_ok(name, (size_t)(slash - name)) ||
        !name_part_ok(slash + 1, strlen(slash + 1)))
        return tk__err(TK_ERR_INVALID,
                       "'%s' is not a package name\nHINT: names look like org/name, for example "
                       "kernels-community/activation (letters, digits, '.', '_' and '-')",
                       name ? name : "(null)");
    if (org)
        snprintf(org, 65, "%.*s", (int)(slash - name), name);
    if (pkg)
        snprintf(pkg, 65, "%s", slash + 1);
    return TK_OK;
}

int tk_manifest__path_check(const char *path)
{
    if (!path || !*path || path[0] == '/' || strlen(path) > 1024 || strchr(path, '\\'))
        return -1;
    const char *p = path;
    int depth = 0;
    while (*p) {
        const char *end = strchr(p, '/');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        /* also the unpacker's limits (hub/archive.c): components of at most 255 bytes (NAME_MAX), at
         * most 64 levels, so a manifest that lists a path no file system takes is refused as such */
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.') || n > 255 || ++depth > 64)
            return -1;
        for (size_t i = 0; i < n; i++)
            if ((unsigned char)p[i] < 0x20)
                return -1;
        p += n;
        if (*p == '/')
            p++;
        if (end && !*p)
            return -1; /* trailing slash */
    }
    return 0;
}

int tk_manifest__version_parse(const char *v, int *major)
{
    int64_t parts[3];
    const char *p = v;
    for (int i = 0; i < 3; i++) {
        char buf[16];
        size_t n = 0;
        if (!p)
            return -1;
        while (p[n] >= '0' && p[n] <= '9' && n < sizeof buf - 1) {
            buf[n] = p[n];
            n++;
        }
        buf[n] = '\0';
        if (n == 0 || (n > 1 && buf[0] == '0') || tk__parse_i64(buf, 0, 999999999, &parts[i]) != 0)
            return -1;
        p += n;
        if (i < 2) {
            if (*p != '.')
                return -1;
            p++;
        } else if (*p) {
            return -1;
        }
    }
    if (parts[0] < 1)
        return -1;
    if (major)
        *major = (int)parts[0];
    return 0;
}

static const char *req_str(json_t *o, const char *key, int *rc, const char *where)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) {
        if (*rc == TK_OK)
            *rc = tk__err(TK_ERR_MANIFEST, "manifest: %s'%s' is %s; want a string", where, key,
                          v ? "not a string" : "missing");
        return NULL;
    }
    return json_string_value(v);
}

static int entry(tk_manifest_file *e, json_t *o, const char *where)
{
    int rc = TK_OK;
    if (!json_is_object(o))
        return tk__err(TK_ERR_MANIFEST, "manifest: %s is not an object", where);
    e->path = req_str(o, "path", &rc, where);
    e->sha256 = req_str(o, "sha256", &rc, where);
    json_t *size = json_object_get(o, "size");
    if (rc != TK_OK)
        return rc;
    if (!json_is_integer(size) || json_integer_value(size) < 0)
        return tk__err(TK_ERR_MANIFEST, "manifest: %s 'size' must be a non-negative integer", where);
    e->size = json_integer_value(size);
    if (tk_manifest__path_check(e->path) != 0)
        return tk__err(TK_ERR_MANIFEST,
                       "manifest: %s path '%s' is not a safe relative path (no absolute, empty, '.' or '..' "
                       "parts; at most 64 levels of at most 255 bytes each)",
                       where, e->path);
    if (!tk__is_hex(e->sha256, 64))
        return tk__err(TK_ERR_MANIFEST, "manifest: %s '%s' has a malformed sha256 (want 64 lowercase hex)", where,
                       e->path);
    return TK_OK;
}

int tk_manifest__parse(tk_manifest **out, const char *text, size_t n)
{
    *out = NULL;
    int rc = TK_OK;
    json_error_t jerr;
    tk_manifest *m = calloc(1, sizeof *m);
    if (!m)
        return tk__err(TK_ERR_NOMEM, "out of memory");
    if (n > TK_MANIFEST_MAX) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest is %zu bytes, more than the %u allowed", n, TK_MANIFEST_MAX);
        goto fail;
    }
    m->root = json_loadb(text, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!m->root) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest is not valid JSON: line %d, column %d: %s", jerr.line, jerr.column,
                     jerr.text);
        goto fail;
    }
    if (!json_is_object(m->root)) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest is not a JSON object");
        goto fail;
    }
    json_t *fv = json_object_get(m->root, "format_version");
    if (!json_is_integer(fv)) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: 'format_version' is missing or not an integer");
        goto fail;
    }
    if (json_integer_value(fv) != TK_MANIFEST_FORMAT) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest format_version %lld is not supported (this tk reads %d)%s",
                     (long long)json_integer_value(fv), TK_MANIFEST_FORMAT,
                     json_integer_value(fv) > TK_MANIFEST_FORMAT ? "\nHINT: upgrade tk" : "");
        goto fail;
    }
    m->name = req_str(m->root, "name", &rc, "");
    m->version = req_str(m->root, "version", &rc, "");
    m->license = req_str(m->root, "license", &rc, "");
    json_t *desc = json_object_get(m->root, "description");
    m->description = json_is_string(desc) ? json_string_value(desc) : "";
    if (rc != TK_OK)
        goto fail;
    if (tk_manifest__name_check(m->name, m->org, m->pkg) != TK_OK) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: 'name' ('%s') is not of the form org/name", m->name);
        goto fail;
    }
    if (tk_manifest__version_parse(m->version, &m->major) != 0) {
        rc =
            tk__err(TK_ERR_MANIFEST, "manifest: 'version' ('%s') is not MAJOR.MINOR.PATCH with MAJOR >= 1", m->version);
        goto fail;
    }
    json_t *files = json_object_get(m->root, "files");
    if (!json_is_array(files) || json_array_size(files) == 0 || json_array_size(files) > 10000) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: 'files' must be a non-empty array (at most 10000)");
        goto fail;
    }
    m->nfiles = json_array_size(files);
    if (!(m->files = calloc(m->nfiles, sizeof *m->files))) {
        rc = tk__err(TK_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (size_t i = 0; i < m->nfiles; i++) {
        char where[32];
        snprintf(where, sizeof where, "files[%zu] ", i);
        if ((rc = entry(&m->files[i], json_array_get(files, i), where)) != TK_OK)
            goto fail;
        if (i > 0 && strcmp(m->files[i - 1].path, m->files[i].path) >= 0) {
            rc = tk__err(TK_ERR_MANIFEST,
                         "manifest: 'files' must be sorted by path without duplicates "
                         "('%s' after '%s')",
                         m->files[i].path, m->files[i - 1].path);
            goto fail;
        }
    }
    json_t *arch = json_object_get(m->root, "archive");
    if ((rc = entry(&m->archive, arch, "archive ")) != TK_OK)
        goto fail;
    if (strchr(m->archive.path, '/')) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: archive path '%s' must be a plain file name", m->archive.path);
        goto fail;
    }
    m->compression = req_str(arch, "compression", &rc, "archive ");
    if (rc != TK_OK)
        goto fail;
    if (strcmp(m->compression, "gz") != 0 && strcmp(m->compression, "zst") != 0) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: archive compression '%s' is not gz or zst", m->compression);
        goto fail;
    }
    json_t *kernels = json_object_get(m->root, "kernels");
    if (kernels && !json_is_array(kernels)) {
        rc = tk__err(TK_ERR_MANIFEST, "manifest: 'kernels' must be an array");
        goto fail;
    }
    *out = m;
    return TK_OK;
fail:
    tk_manifest__free(m);
    return rc;
}

void tk_manifest__free(tk_manifest *m)
{
    if (!m)
        return;
    free(m->files);
    json_decref(m->root);
    free(m);
}
