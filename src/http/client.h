/*
 * client.h: one small blocking HTTP/1.1 client on a plain socket, for tools that talk to a
 * server one request at a time (replay's start-up, the benchmarks' probes, scrapes and
 * single-connection drivers). A router's own loop never blocks on it (it uses evhttp).
 *
 *   kvr_http_target_parse(url, &t)   http://host[:port][/base] -> host, Host header, port
 *   kvr_http_probe(&t, ms)           a TCP connect, so an absent server is a message; sets addr
 *   fd = kvr_http_connect(&t, ms)    a connected blocking socket (TCP_NODELAY, send and
 *                                    receive timeouts of ms)
 *   kvr_http_head(...)               a request's line and headers; send with kvr_http_send_all
 *   kvr_http_recv(fd, &r)            one read into r; r.status and r.body_at once the head is in
 *   kvr_http_read_whole(fd, &r, ...) the rest of a Content-Length (or until-close) answer
 *   kvr_http_get(&t, path, ...)      all of it on a fresh connection, Connection: close
 *
 * The response buffer (kvr_http_resp_t) keeps the raw bytes, head and body, growing by
 * doubling: a keep-alive caller resets it per request and reuses its memory. A streamed
 * (chunked, SSE) answer is not decoded: the caller reads r.buf from r.body_at as it grows.
 * Ownership: the socket and r.buf are the caller's (close, kvr_http_resp_free).
 * Threads: any; nothing shared. Cost: one recv per kvr_http_recv; the head is searched once
 * per read until found.
 */
#ifndef KVR_HTTP_CLIENT_H
#define KVR_HTTP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the endpoint ----------------------------------------------------------------------- */

typedef struct kvr_http_target {
    char host[256];      /* as given, without IPv6 brackets */
    char host_hdr[300];  /* for the Host header: host[:port], IPv6 in brackets */
    char addr[64];       /* numeric address (set by kvr_http_probe / kvr_http_connect) */
    uint16_t port;
    char base_path[260]; /* the URL's path without trailing '/' ("" for none) */
    char bearer[520];    /* a token kvr_http_get sends as `Authorization: Bearer` ("" none;
                            kvr_http_target_parse leaves it empty) */
} kvr_http_target_t;

/* http://host[:port][/base]: KVR_OK, or KVR_EINVAL with err saying why. */
int kvr_http_target_parse(const char *url, kvr_http_target_t *t, char *err, size_t err_len);
/* A TCP connect to t->host within timeout_ms. Sets t->addr. KVR_OK, or KVR_EIO with err
 * ("cannot connect to 127.0.0.1 port 9: Connection refused"). */
int kvr_http_probe(kvr_http_target_t *t, int timeout_ms, char *err, size_t err_len);

/* ---- a connection ----------------------------------------------------------------------- */

/* A socket connected to t (t->addr when set, else t->host, then t->addr is set) within
 * timeout_ms, blocking, with TCP_NODELAY and send and receive timeouts of timeout_ms; -1 with
 * an errno value in *err. */
int kvr_http_connect(kvr_http_target_t *t, int timeout_ms, int *err);
/* All of p, or false (the peer closed, a timeout). */
bool kvr_http_send_all(int fd, const void *p, size_t n);
/* "METHOD path HTTP/1.1", Host, Content-Type and Content-Length when ctype is not NULL,
 * Connection: close when close; its length, 0 when it does not fit cap. */
size_t kvr_http_head(char *out, size_t cap, const char *method, const char *path,
                     const char *host_hdr, const char *ctype, size_t body_len, bool close);

/* ---- a response ------------------------------------------------------------------------- */

typedef struct kvr_http_resp {
    char *buf;        /* the bytes read: head, then body (NUL-terminated after len) */
    size_t len, cap;
    size_t body_at;   /* the body's offset once the head is in; 0 before */
    int status;       /* the status once the head is in; 0 before */
    bool truncated;   /* kvr_http_read_whole stopped at its max */
    bool closed;      /* the peer closed the connection (a read got EOF) */
} kvr_http_resp_t;

/* For the next request on the connection: empty, the memory kept. */
void kvr_http_resp_reset(kvr_http_resp_t *r);
void kvr_http_resp_free(kvr_http_resp_t *r);
/* One read (with at least 64 KiB of room). KVR_OK; KVR_EIO (closed: r->closed, or an error
 * or the receive timeout); KVR_EPARSE (a head that is not HTTP/1.x); KVR_ENOMEM. */
int kvr_http_recv(int fd, kvr_http_resp_t *r);
/* Reads until the answer is whole: Content-Length bytes of body, or (without it) until the
 * peer closes; at most max_body bytes of body are kept (truncated then, the rest unread), and
 * no later than timeout_ms from the call (0: no deadline of its own, no poll() per read: the
 * socket's receive timeout applies). KVR_OK; KVR_EIO (closed early, timed out); KVR_EPARSE;
 * KVR_ENOMEM. */
int kvr_http_read_whole(int fd, kvr_http_resp_t *r, size_t max_body, int timeout_ms);
/* A header's value in the head (name matched without case); NULL when absent. */
const char *kvr_http_header(const kvr_http_resp_t *r, const char *name, size_t *len);
/* needle in hay[0..n), or NULL. */
const char *kvr_http_find(const char *hay, size_t n, const char *needle);

/* ---- one request ------------------------------------------------------------------------ */

/* GET {base}path on a fresh connection (Connection: close) into r, within timeout_ms, keeping
 * at most max_body bytes of body, with t->bearer as its Authorization when set. KVR_OK (any status: the caller judges r->status); KVR_EIO
 * with err ("cannot connect: ...", "timed out", "connection closed before a response") or
 * another status of kvr_http_read_whole. */
int kvr_http_get(kvr_http_target_t *t, const char *path, int timeout_ms, size_t max_body,
                 kvr_http_resp_t *r, char *err, size_t err_len);

#endif /* KVR_HTTP_CLIENT_H */
