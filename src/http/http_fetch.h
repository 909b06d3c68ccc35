/*
 * http_fetch.h: one blocking HTTP GET (libevent's evhttp client on a private event base), for
 * what a router does once at start-up before its loop runs: a joining replica fetching a
 * peer's index snapshot.
 * Every answer is bounded as it arrives: its headers by KVR_HTTP_FETCH_MAX_HEADER_BYTES, a 200's
 * body by max_bytes (a Content-Length above it is refused before the body is read) and by
 * magic (the first bytes must be these, checked as soon as they are in), any other status's
 * body by KVR_HTTP_FETCH_MAX_ERROR_BYTES: a peer that sends junk costs at most those bytes.
 * Ownership: the body is malloc'd and the caller's. Threads: any (nothing shared).
 * Cost: one connection; the body is grown by doubling up to max_bytes.
 */
#ifndef KVR_NET_HTTP_FETCH_H
#define KVR_NET_HTTP_FETCH_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_http_fetch {
    const char *url;    /* http://host:port[/base] */
    const char *path;   /* appended to the url's path, e.g. "/v1/index/snapshot" */
    const char *bearer; /* sent as Authorization: Bearer; NULL or "" = none */
    uint64_t timeout_ms;
    size_t max_bytes;   /* a 200's body at most */
    const void *magic;  /* a 200's body must start with these magic_len bytes; NULL = any */
    size_t magic_len;
} kvr_http_fetch_t;

#define KVR_HTTP_FETCH_MAX_HEADER_BYTES 16384
#define KVR_HTTP_FETCH_MAX_ERROR_BYTES 65536

/* KVR_OK with the status and body (any status: the caller judges it); KVR_EINVAL (a bad
 * url), KVR_EIO (no answer, headers over the cap, or the timeout), KVR_ETOOBIG (over max_bytes,
 * or an error answer over KVR_HTTP_FETCH_MAX_ERROR_BYTES), KVR_EPARSE (a 200 not starting with
 * magic), KVR_ENOMEM; err says which. */
int kvr_http_fetch(const kvr_http_fetch_t *q, uint8_t **body, size_t *len, int *status,
                   char *err, size_t err_len);

#endif
