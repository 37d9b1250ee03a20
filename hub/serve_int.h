/*
 * serve_int.h — what the files of `tk serve` share (hub/serve.c: the request path and the server's
 * life; hub/serve_admin.c: tokens and trusted keys under .tk-serve/; hub/serve_page.c: the HTML
 * page): the server and request structs and the few calls that cross between them. Private to
 * those three files.
 */
#ifndef TK_HUB_SERVE_INT_H
#define TK_HUB_SERVE_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <jansson.h>
#include <microhttpd.h>

#include "common/common.h"
#include "hub/sign.h"

#define SERVER_MAGIC 0x746b5356u /* "tkSV" */
#define STATE_DIR ".tk-serve"
#define SIG_MAX (64u << 10)
#define README_MAX (64u << 10)
#define JSON_DOC_MAX (64u << 20)
#define ETAG_SLOTS 512
#define MAX_PAGE_PKGS 2000
#define SMALL_BODY ((int64_t)64 << 10) /* bodies up to this are sent from memory: see body_response */

/* A small file's bytes, shared by the etag cache and the responses sending them; freed with its last
 * reference. */
typedef struct {
    unsigned refs; /* atomic */
    char data[];
} blob;

typedef struct {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    char sha[TK_SHA256_HEX];
    blob *body;                /* the file's bytes when it has at most SMALL_BODY of them */
} etag_slot;

struct tk_server {
    uint32_t magic;
    struct MHD_Daemon *d;
    char *root;                /* realpath of the tree */
    int root_fd;               /* the tree's directory (O_PATH), for openat2 and readlinkat; -1: none */
    int64_t max_upload;
    tk_log_fn log;
    void *log_user;
    pthread_mutex_t mu;        /* guards etags (at most ETAG_SLOTS x SMALL_BODY bytes of bodies: 32 MiB) */
    unsigned max_conns;        /* open connections in all (opts->max_connections) */
    unsigned conns;            /* open now (atomic) */
    int64_t refused_at;        /* the second the last refusal was logged (atomic) */
    etag_slot etags[ETAG_SLOTS];
};

/* One request. */
typedef struct {
    double t0;
    unsigned status;
    uint64_t bytes;
    char method[12];
    char client[64];
    char *url;
    /* uploads */
    int upload;
    int yank;                  /* PUT /api/yank/{org}/{name}: the body is a signed yank statement */
    int fd;
    char *tmp;
    int64_t got;
    int overflow;
    char org[65], pkg[65];
} req;

#define say(s, level, ...) tk__logf((s)->log, (s)->log_user, (level), __VA_ARGS__)

/* hub/serve.c: queues resp (its reference released) with status, recorded for the access log. */
enum MHD_Result tk_hub__serve_queue(struct MHD_Connection *c, req *r, unsigned status, struct MHD_Response *resp);
/* hub/serve.c: a path component or name the server serves (no dot-name, no control character). */
int tk_hub__serve_component_ok(const char *p, size_t n);
int tk_hub__serve_name_ok(char org[65], char pkg[65], const char *o, const char *p);

/* hub/serve_admin.c: the state file .tk-serve/<name> of the tree at root, as a JSON object whose
 * member key is an object (created empty when missing); the org a bearer token is bound to. */
int tk_hub__serve_state_load(json_t **out, const char *root, const char *name, const char *key);
int tk_hub__serve_token_org(char org[65], const char *root, const char *token);

/* hub/serve_page.c: GET / (the HTML page of the packages, or one package with ?pkg=). */
enum MHD_Result tk_hub__serve_page(tk_server *s, struct MHD_Connection *c, req *r);

#endif
