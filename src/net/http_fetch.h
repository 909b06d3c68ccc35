/*
 * http_fetch.h: one blocking HTTP GET (libevent's evhttp client on a private event base), for
 * what a router does once at start-up before its loop runs: a joining replica fetching a
 * peer's index snapshot.
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
    size_t max_bytes;
} kvr_http_fetch_t;

/* KVR_OK with the status and body (any status: the caller judges it); KVR_EINVAL (a bad
 * url), KVR_EIO (no answer, or the timeout), KVR_ETOOBIG (over max_bytes), KVR_ENOMEM; err says
 * which. */
int kvr_http_fetch(const kvr_http_fetch_t *q, uint8_t **body, size_t *len, int *status,
                   char *err, size_t err_len);

#endif
