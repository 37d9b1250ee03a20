/*
 * archive.h — source archives: deterministic creation and safe extraction, on libarchive.
 *
 * Creation writes a POSIX (pax restricted) tar of the listed files, in the given order, with
 * mtime 0, uid/gid 0, no user names and mode 0644 (directories 0755 are implied, not stored), names
 * as raw bytes (hdrcharset=BINARY, so the locale plays no part), compressed with gzip (no timestamp,
 * no name) or zstd, so the same files always give the same bytes (for one zlib/zstd version). The
 * archive is written to a temp file beside out_path, fsynced and renamed into place.
 *
 * Extraction reads only tar inside exactly one gzip or zstd layer (no zip, no plain or xz tar) and
 * applies an allowlist: only regular files and directories (no symlinks, hard links, devices, FIFOs or
 * sparse files); paths relative, at most 1024 bytes and 64 levels, with no "..", no empty or "."
 * components, no backslashes, NULs or control characters (a directory entry may end in one '/');
 * at most max_entries entries, max_bytes total unpacked bytes, max_file_bytes per file, and
 * max_ratio unpacked/compressed (a first 1 MiB is always allowed), checked from each header before
 * anything is written and again while the data streams. Each file must be listed in `expect` with
 * the same size and sha256, each expected file must be present exactly once, and any violation fails
 * the whole extraction with TK_ERR_ARCHIVE (rules, corrupt or truncated data) or TK_ERR_DIGEST
 * (contents differ from `expect`, or an expected file is missing) and removes what was written. Files
 * are created with O_EXCL|O_NOFOLLOW, walking from a descriptor of dest_dir, which must exist, be
 * empty and not be a symlink; no symlink is ever created or followed. Disk full is TK_ERR_NOSPACE.
 * Unpacked files are not fsynced: a caller that records them as installed syncs what it keeps.
 * libarchive 3.6 does not check gzip's CRC, so damage that still decodes surfaces as TK_ERR_DIGEST.
 */
#ifndef TK_HUB_ARCHIVE_H
#define TK_HUB_ARCHIVE_H

#include <stddef.h>
#include <stdint.h>

#include "manifest/manifest.h" /* tk_manifest_file */

typedef struct {
    int64_t max_entries;    /* default 10000 */
    int64_t max_bytes;      /* default 512 MiB */
    int64_t max_file_bytes; /* default 256 MiB */
    int64_t max_ratio;      /* default 200 */
} tk_hub_unpack_limits;
#define TK_HUB_UNPACK_LIMITS_DEFAULT {10000, (int64_t)512 << 20, (int64_t)256 << 20, 200}

/* Writes the archive of src_dir/files[i] (stored under files[i]) to out_path atomically.
 * compression: "gz" (also for NULL) or "zst". Each files[i] must follow the path rules above, appear
 * once, and name a regular file (not a symlink). Errors: TK_ERR_INVALID, TK_ERR_NOT_FOUND, TK_ERR_IO,
 * TK_ERR_NOSPACE, TK_ERR_NOMEM. */
int tk_hub__archive_create(const char *out_path, const char *src_dir, const char *const *files, size_t nfiles,
                           const char *compression);

/* Extracts archive_path into dest_dir under the rules above. limits may be NULL (defaults); every
 * limit must be positive. nexpect may be 0 (expect NULL). Errors: TK_ERR_ARCHIVE, TK_ERR_DIGEST,
 * TK_ERR_INVALID (bad arguments, dest_dir not empty), TK_ERR_NOT_FOUND, TK_ERR_IO, TK_ERR_NOSPACE,
 * TK_ERR_NOMEM, TK_ERR_UNSUPPORTED (a libarchive without built-in gzip/zstd). */
int tk_hub__archive_extract(const char *archive_path, const char *dest_dir, const tk_manifest_file *expect,
                            size_t nexpect, const tk_hub_unpack_limits *limits);

#endif
