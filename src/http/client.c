/*
 * client.c: see client.h.
 *
 * Sockets: resolved with getaddrinfo, connected non-blocking under poll() for the connect
 * timeout, then made blocking with SO_RCVTIMEO / SO_SNDTIMEO so that no later call hangs.
 * Responses: the raw bytes accumulate in one buffer; the head ends at the first CRLFCRLF,
 * its status is read from "HTTP/1.x NNN"; Content-Length decides where a whole body ends.
 * Invariants: r->buf[r->len] is NUL whenever r->buf is not NULL; r->body_at and r->status are
 * set together, once. Ownership: the caller's (client.h). Threads: any. Cost: see client.h.
 */
#include "http/client.h"
#include "base/clock.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/endpoint.h"
#include "kvrouter.h"

#define RECV_ROOM 65536

/* ---- the endpoint ----------------------------------------------------------------------- */

int kvr_http_target_parse(const char *url, kvr_http_target_t *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    kvr_url_t u;
    int rc = kvr_endpoint_parse_url(url ? url : "", NULL, &u, err, err_len);
    if (rc != KVR_OK)
        return rc;
    snprintf(t->host, sizeof t->host, "%s", u.host);
    snprintf(t->host_hdr, sizeof t->host_hdr, "%s", u.host_hdr);
    snprintf(t->base_path, sizeof t->base_path, "%s", u.base_path);
    t->port = u.port;
    return KVR_OK;
}

static int resolve(const char *host, uint16_t port, bool numeric, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (numeric)
        hints.ai_flags = AI_NUMERICHOST;
    char ports[16];
    snprintf(ports, sizeof ports, "%u", port);
    return getaddrinfo(host, ports, &hints, res);
}

/* A non-blocking socket connected to a within timeout_ms; -1 with an errno value in *err. */
static int dial(const struct addrinfo *a, int timeout_ms, int *err)
{
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
        *err = errno;
        return -1;
    }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        rc = poll(&p, 1, timeout_ms);
        if (rc == 1) {
            socklen_t len = sizeof *err;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, err, &len);
            rc = *err == 0 ? 0 : -1;
        } else {
            *err = rc == 0 ? ETIMEDOUT : errno;
            rc = -1;
        }
    } else if (rc != 0) {
        *err = errno;
    }
    if (rc != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static bool numeric_name(const struct addrinfo *a, char *out, size_t cap)
{
    return getnameinfo(a->ai_addr, a->ai_addrlen, out, (socklen_t)cap, NULL, 0,
                       NI_NUMERICHOST) == 0;
}

int kvr_http_probe(kvr_http_target_t *t, int timeout_ms, char *err, size_t err_len)
{
    struct addrinfo *res = NULL;
    int gai = resolve(t->host, t->port, false, &res);
    if (gai != 0) {
        snprintf(err, err_len, "cannot resolve '%s': %s", t->host, gai_strerror(gai));
        return KVR_EIO;
    }
    int e = ETIMEDOUT;
    bool ok = false;
    for (struct addrinfo *a = res; a && !ok; a = a->ai_next) {
        int fd = dial(a, timeout_ms, &e);
        if (fd >= 0) {
            ok = numeric_name(a, t->addr, sizeof t->addr);
            close(fd);
        }
    }
    freeaddrinfo(res);
    if (!ok) {
        snprintf(err, err_len, "cannot connect to %s port %u: %s", t->host, t->port,
                 strerror(e));
        return KVR_EIO;
    }
    return KVR_OK;
}

/* ---- a connection ----------------------------------------------------------------------- */

static void make_blocking(int fd, int timeout_ms)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    struct timeval tv = {timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int kvr_http_connect(kvr_http_target_t *t, int timeout_ms, int *err)
{
    struct addrinfo *res = NULL;
    *err = EHOSTUNREACH;
    if (resolve(t->addr[0] ? t->addr : t->host, t->port, t->addr[0] != '\0', &res) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = dial(a, timeout_ms, err);
        if (fd >= 0 && !t->addr[0] && !numeric_name(a, t->addr, sizeof t->addr)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd >= 0)
        make_blocking(fd, timeout_ms);
    return fd;
}

bool kvr_http_send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t k = send(fd, c, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        c += k;
        n -= (size_t)k;
    }
    return true;
}

size_t kvr_http_head(char *out, size_t cap, const char *method, const char *path,
                     const char *host_hdr, const char *ctype, size_t body_len, bool close)
{
    int n;
    if (ctype != NULL)
        n = snprintf(out, cap, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\n"
                     "Content-Length: %zu\r\n%s\r\n", method, path, host_hdr, ctype, body_len,
                     close ? "Connection: close\r\n" : "");
    else
        n = snprintf(out, cap, "%s %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", method, path, host_hdr,
                     close ? "Connection: close\r\n" : "");
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

/* ---- a response ------------------------------------------------------------------------- */

void kvr_http_resp_reset(kvr_http_resp_t *r)
{
    r->len = r->body_at = 0;
    r->status = 0;
    r->truncated = r->closed = false;
    if (r->buf)
        r->buf[0] = '\0';
}

void kvr_http_resp_free(kvr_http_resp_t *r)
{
    free(r->buf);
    memset(r, 0, sizeof *r);
}

const char *kvr_http_find(const char *hay, size_t n, const char *needle)
{
    size_t nn = strlen(needle);
    for (size_t i = 0; i + nn <= n; i++) {
        const char *q = memchr(hay + i, needle[0], n - i - nn + 1);
        if (q == NULL)
            return NULL;
        if (memcmp(q, needle, nn) == 0)
            return q;
        i = (size_t)(q - hay);
    }
    return NULL;
}

static int make_room(kvr_http_resp_t *r)
{
    if (r->cap - r->len > RECV_ROOM)
        return KVR_OK;
    size_t cap = r->cap ? r->cap * 2 : (size_t)1 << 17;
    char *b = realloc(r->buf, cap);
    if (b == NULL)
        return KVR_ENOMEM;
    r->buf = b;
    r->cap = cap;
    return KVR_OK;
}

/* The head is in once CRLFCRLF is: its status, and where the body starts. */
static int parse_head(kvr_http_resp_t *r)
{
    const char *e = kvr_http_find(r->buf, r->len, "\r\n\r\n");
    if (e == NULL)
        return KVR_OK;
    if (r->len < 12 || memcmp(r->buf, "HTTP/1.", 7) != 0 || r->buf[8] != ' ')
        return KVR_EPARSE;
    int st = 0;
    for (int i = 9; i < 12; i++) {
        if (r->buf[i] < '0' || r->buf[i] > '9')
            return KVR_EPARSE;
        st = st * 10 + (r->buf[i] - '0');
    }
    r->status = st;
    r->body_at = (size_t)(e - r->buf) + 4;
    return KVR_OK;
}

int kvr_http_recv(int fd, kvr_http_resp_t *r)
{
    if (make_room(r) != KVR_OK)
        return KVR_ENOMEM;
    ssize_t k;
    do
        k = recv(fd, r->buf + r->len, r->cap - r->len - 1, 0);
    while (k < 0 && errno == EINTR);
    if (k <= 0) {
        r->closed = k == 0;
        return KVR_EIO;
    }
    r->len += (size_t)k;
    r->buf[r->len] = '\0';
    return r->body_at == 0 ? parse_head(r) : KVR_OK;
}

const char *kvr_http_header(const kvr_http_resp_t *r, const char *name, size_t *len)
{
    size_t nl = strlen(name), end = r->body_at ? r->body_at - 2 : 0;
    const char *p = r->buf ? memchr(r->buf, '\n', end) : NULL;
    while (p != NULL && (size_t)(++p - r->buf) + nl < end) {
        const char *eol = memchr(p, '\n', end - (size_t)(p - r->buf));
        if (eol == NULL)
            return NULL;
        if (strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            while (v < eol && (*v == ' ' || *v == '\t'))
                v++;
            const char *ve = eol;
            while (ve > v && (ve[-1] == '\r' || ve[-1] == ' '))
                ve--;
            *len = (size_t)(ve - v);
            return v;
        }
        p = eol;
    }
    return NULL;
}

/* True once the body is whole (or cut at max_body: truncated). */
static bool whole(kvr_http_resp_t *r, size_t max_body)
{
    size_t have = r->len - r->body_at, n;
    const char *cl = kvr_http_header(r, "Content-Length", &n);
    if (cl != NULL && have >= strtoull(cl, NULL, 10)) {
        r->len = r->body_at + (size_t)strtoull(cl, NULL, 10);
        r->buf[r->len] = '\0';
        return true;
    }
    if (have < max_body)
        return false;
    r->truncated = true;
    r->len = r->body_at + max_body;
    r->buf[r->len] = '\0';
    return true;
}

/* Waits until fd is readable or the deadline (0: none, no syscall) passes. */
static bool wait_readable(int fd, uint64_t deadline_ms)
{
    if (deadline_ms == 0)
        return true;
    uint64_t now = kvr_now_ms();
    struct pollfd p = {fd, POLLIN, 0};
    return now < deadline_ms && poll(&p, 1, (int)(deadline_ms - now)) != 0;
}

int kvr_http_read_whole(int fd, kvr_http_resp_t *r, size_t max_body, int timeout_ms)
{
    uint64_t deadline = timeout_ms > 0 ? kvr_now_ms() + (uint64_t)timeout_ms : 0;
    for (;;) {
        if (r->body_at != 0 && whole(r, max_body))
            return KVR_OK;
        if (!wait_readable(fd, deadline))
            return KVR_EIO; /* timed out: r->closed stays false */
        int rc = kvr_http_recv(fd, r);
        if (rc == KVR_EIO && r->closed && r->body_at != 0 &&
            kvr_http_header(r, "Content-Length", &(size_t){0}) == NULL)
            return KVR_OK; /* no length: the body ends with the connection */
        if (rc != KVR_OK)
            return rc;
    }
}

/* ---- one request ------------------------------------------------------------------------ */

int kvr_http_get(kvr_http_target_t *t, const char *path, int timeout_ms, size_t max_body,
                 kvr_http_resp_t *r, char *err, size_t err_len)
{
    kvr_http_resp_reset(r);
    int e;
    int fd = kvr_http_connect(t, timeout_ms, &e);
    if (fd < 0) {
        snprintf(err, err_len, "cannot connect: %s", strerror(e));
        return KVR_EIO;
    }
    char head[2048], full[600], auth[sizeof t->bearer + 32] = "";
    snprintf(full, sizeof full, "%s%s", t->base_path, path);
    if (t->bearer[0] != '\0')
        snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", t->bearer);
    size_t alen = strlen(auth);
    size_t hl = kvr_http_head(head, sizeof head - alen, "GET", full, t->host_hdr, NULL, 0, true);
    if (hl >= 2 && alen > 0) { /* before the head's closing blank line */
        memcpy(head + hl - 2, auth, alen);
        memcpy(head + hl - 2 + alen, "\r\n", 2);
        hl += alen;
    }
    if (hl == 0 || !kvr_http_send_all(fd, head, hl)) {
        close(fd);
        snprintf(err, err_len, "cannot send the request");
        return KVR_EIO;
    }
    int rc = kvr_http_read_whole(fd, r, max_body, timeout_ms);
    close(fd);
    if (rc == KVR_EIO)
        snprintf(err, err_len, "%s", r->closed ? r->body_at ? "connection closed mid-response"
                                                            : "connection closed before a response"
                                               : "timed out");
    else if (rc != KVR_OK)
        snprintf(err, err_len, "%s", rc == KVR_EPARSE ? "not an HTTP/1.x answer"
                                                      : "out of memory");
    return rc;
}
