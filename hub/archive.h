/*
 * archive.h — source archives: deterministic creation and safe extraction, on libarchive.
 *
 * Creation writes a POSIX (pax restricted) tar of the listed files, in the given order, with
 * mtime 0, uid/gid 0, no user names and mode 0644 (directories 0755 are implied, not stored),
 * compressed with gzip (no timestamp) or zstd, so the same files always give the same bytes.
 *
 * Extraction is from an allowlist: only regular files and directories; paths relative, with no "..",
 * no empty or "." components, no backslashes or NULs; at most max_entries entries, max_bytes total
 * unpacked bytes, max_ratio unpacked/compressed, max_file_bytes per file. Each file must be listed in
 * `expect` with the same size and sha256, each expected file must be present exactly once, and any
 * violation fails the whole extraction with TK_ERR_ARCHIVE (rules) or TK_ERR_DIGEST (contents) and
 * removes what was written. Files are created with O_EXCL|O_NOFOLLOW under dest_dir, which must exist
 * and be empty; no symlink is ever created or followed.
 */
#ifndef TK_HUB_ARCHIVE_H
#define TK_HUB_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    const char *path;   /* relative path inside the archive */
    const char *sha256; /* 64 lowercase hex */
    int64_t size;
} tk_hub_archive_entry;

typedef struct {
    int64_t max_entries;    /* default 10000 */
    int64_t max_bytes;      /* default 512 MiB */
    int64_t max_file_bytes; /* default 256 MiB */
    int64_t max_ratio;      /* default 200 */
} tk_hub_unpack_limits;
#define TK_HUB_UNPACK_LIMITS_DEFAULT {10000, (int64_t)512 << 20, (int64_t)256 << 20, 200}

/* Writes the archive of src_dir/files[i] (stored under files[i]) to out_path atomically.
 * compression: "gz" or "zst". */
int tk_hub__archive_create(const char *out_path, const char *src_dir, const char *const *files,
                           size_t nfiles, const char *compression);

/* Extracts archive_path into dest_dir under the rules above. limits may be NULL (defaults). */
int tk_hub__archive_extract(const char *archive_path, const char *dest_dir,
                            const tk_hub_archive_entry *expect, size_t nexpect,
                            const tk_hub_unpack_limits *limits);

#endif
