/*
 * endpoint.c: see endpoint.h. Written by hand: the grammar accepted is deliberately narrower
 * than a URI parser's (no userinfo, query, fragment, zone ids or wildcards), and what it
 * refuses must be named precisely; libevent's evhttp_uri_parse (used to connect) accepts far
 * more and says only "failed".
 * Invariants: a URL or address accepted here is one the connecting code can use as is; a
 * refusal names the part. Ownership: the caller's buffers, no allocation. Threads: any (pure).
 * Cost: O(length of the text and of the allow lists).
 */
#include "core/endpoint.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kvrouter/status.h"

static int fail(char *err, size_t len, const char *fmt, ...)
{
    if (err != NULL && len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, len, fmt, ap);
        va_end(ap);
    }
    return KVR_EINVAL;
}

static bool name_char(char c)
{
    return isalnum((unsigned char)c) || c == '.' || c == '-' || c == '_';
}

/* Host of [s, s+n): a DNS name / IPv4 (letters, digits, '.', '-', '_') or "[v6]". */
static bool host_ok(const char *s, size_t n)
{
    if (n == 0)
        return false;
    if (s[0] == '[') {
        if (n < 4 || s[n - 1] != ']')
            return false;
        for (size_t i = 1; i + 1 < n; i++)
            if (!isxdigit((unsigned char)s[i]) && s[i] != ':' && s[i] != '.')
                return false;
        return true;
    }
    for (size_t i = 0; i < n; i++)
        if (!name_char(s[i]))
            return false;
    return s[0] != '.' && s[0] != '-';
}

/* Port digits of [s, s+n) in [1, 65535]. */
static bool port_ok(const char *s, size_t n)
{
    if (n == 0 || n > 5)
        return false;
    unsigned v = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isdigit((unsigned char)s[i]))
            return false;
        v = v * 10 + (unsigned)(s[i] - '0');
    }
    return v >= 1 && v <= 65535;
}

/* Why the host of [s, s+n) (as host_ok accepted it) can only be a local bind address and
 * never a remote engine's: an unspecified address (0.0.0.0, ::, in any spelling: ZeroMQ and
 * the kernel take it for this machine) or the name of one of this machine's network
 * interfaces (ZeroMQ reads "tcp://eth0:5557" as that interface's address). NULL when neither. */
static const char *bind_only(const char *s, size_t n)
{
    char h[64];
    if (s[0] == '[') { /* [v6] */
        s++;
        n -= 2;
    }
    if (n == 0 || n >= sizeof h)
        return NULL;
    memcpy(h, s, n);
    h[n] = '\0';
    struct in_addr a4;
    struct in6_addr a6;
    if ((inet_pton(AF_INET, h, &a4) == 1 && a4.s_addr == 0) ||
        (inet_pton(AF_INET6, h, &a6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&a6)))
        return "an unspecified address (it means every address of the router's own host)";
    if (n < IF_NAMESIZE && if_nametoindex(h) != 0)
        return "the name of a network interface of the router's host";
    return NULL;
}

/* True when [s, s+n) equals an entry of the comma-separated list (case-insensitive). */
static bool in_list(const char *list, const char *s, size_t n)
{
    for (const char *p = list; *p != '\0';) {
        const char *e = strchr(p, ',');
        size_t m = e ? (size_t)(e - p) : strlen(p);
        while (m > 0 && p[0] == ' ')
            p++, m--;
        while (m > 0 && p[m - 1] == ' ')
            m--;
        if (m == n && strncasecmp(p, s, n) == 0)
            return true;
        if (e == NULL)
            break;
        p = e + 1;
    }
    return false;
}

/* host:port at [s, s+n); port optional when need_port is false. */
static int check_authority(const char *field, const char *s, size_t n, bool need_port,
                           const kvr_endpoint_policy_t *p, char *err, size_t len)
{
    const char *colon = NULL;
    if (n > 0 && s[0] == '[') {
        const char *rb = memchr(s, ']', n);
        if (rb != NULL && (size_t)(rb - s) + 1 < n)
            colon = rb + 1;
        if (colon != NULL && *colon != ':')
            return fail(err, len, "%s: unexpected text after the IPv6 address", field);
    } else {
        colon = memchr(s, ':', n);
    }
    size_t hn = colon ? (size_t)(colon - s) : n;
    if (memchr(s, '*', n) != NULL)
        return fail(err, len, "%s: a wildcard ('*') is not an engine address: the router "
                    "connects to the engine, so give the engine's host, e.g. tcp://10.0.0.5:5557",
                    field);
    if (!host_ok(s, hn))
        return fail(err, len, "%s: '%.*s' is not a host name, IPv4 or [IPv6] address", field,
                    (int)hn, s);
    if (colon == NULL && need_port)
        return fail(err, len, "%s: a port is required (HOST:PORT)", field);
    if (colon != NULL && !port_ok(colon + 1, n - hn - 1))
        return fail(err, len, "%s: port '%.*s' is not in [1, 65535]", field, (int)(n - hn - 1),
                    colon + 1);
    const char *why = p != NULL ? bind_only(s, hn) : NULL;
    if (why != NULL)
        return fail(err, len, "%s: host '%.*s' is %s, not an engine's address", field, (int)hn,
                    s, why);
    if (p != NULL && p->hosts != NULL && p->hosts[0] != '\0' && !in_list(p->hosts, s, hn))
        return fail(err, len, "%s: host '%.*s' is not in allowed_worker_hosts", field, (int)hn, s);
    return KVR_OK;
}

/* An absolute path without empty, "." or ".." components or a trailing '/', and without
 * controls or the bytes ZeroMQ or our lists give a meaning (',' '*' ';'). */
static bool path_normal(const char *s, size_t n)
{
    if (n < 2 || s[0] != '/' || s[n - 1] == '/')
        return false;
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && s[j] != '/')
            j++;
        size_t m = j - i - 1; /* component (i+1, j) */
        if (m == 0 || (m == 1 && s[i + 1] == '.') || (m == 2 && s[i + 1] == '.' && s[i + 2] == '.'))
            return false;
        for (size_t k = i + 1; k < j; k++)
            if ((unsigned char)s[k] < 0x20 || s[k] == ',' || s[k] == '*' || s[k] == ';')
                return false;
        i = j;
    }
    return true;
}

/* True when path lies strictly inside one of the directories of the list. */
static bool under_dirs(const char *dirs, const char *path)
{
    size_t pl = strlen(path);
    for (const char *p = dirs; *p != '\0';) {
        const char *e = strchr(p, ',');
        size_t m = e ? (size_t)(e - p) : strlen(p);
        if (m > 0 && m < pl && strncmp(p, path, m) == 0 && path[m] == '/')
            return true;
        if (e == NULL)
            break;
        p = e + 1;
    }
    return false;
}

int kvr_endpoint_check_zmq(const char *field, const char *addr, const kvr_endpoint_policy_t *p,
                           char *err, size_t err_len)
{
    if (strncmp(addr, "tcp://", 6) == 0) {
        const char *a = addr + 6;
        if (strchr(a, ';') != NULL)
            return fail(err, err_len, "%s: a source address (';') is not accepted", field);
        return check_authority(field, a, strlen(a), true, p, err, err_len);
    }
    if (strncmp(addr, "ipc://", 6) == 0) {
        const char *path = addr + 6;
        if (p == NULL || p->ipc_dirs == NULL || p->ipc_dirs[0] == '\0')
            return fail(err, err_len, "%s: ipc:// endpoints are refused unless allowed_ipc_dirs "
                        "names their directory", field);
        if (!path_normal(path, strlen(path)))
            return fail(err, err_len, "%s: '%s' is not an absolute, normalised path", field, path);
        if (!under_dirs(p->ipc_dirs, path))
            return fail(err, err_len, "%s: '%s' is not under allowed_ipc_dirs", field, path);
        return KVR_OK;
    }
    return fail(err, err_len, "%s: '%s': only tcp://HOST:PORT (or ipc:// with allowed_ipc_dirs) "
                "is accepted", field, addr);
}

/* Fills u from a checked url: authority at [a, a+n), path from slash (or NULL). */
static int fill_url(kvr_url_t *u, const char *a, size_t n, const char *slash, char *err,
                    size_t err_len)
{
    const char *h = a, *colon;
    size_t hn;
    bool v6 = a[0] == '[';
    if (v6) {
        const char *rb = memchr(a, ']', n);
        h = a + 1;
        hn = (size_t)(rb - h);
        colon = (size_t)(rb - a) + 1 < n ? rb + 1 : NULL;
    } else {
        colon = memchr(a, ':', n);
        hn = colon ? (size_t)(colon - a) : n;
    }
    size_t pl = slash ? strlen(slash) : 0;
    while (pl > 0 && slash[pl - 1] == '/')
        pl--;
    if (hn >= sizeof u->host)
        return fail(err, err_len, "url: host longer than %zu bytes", sizeof u->host - 1);
    if (pl >= sizeof u->base_path)
        return fail(err, err_len, "url: base path longer than %zu bytes", sizeof u->base_path - 1);
    unsigned port = 80;
    if (colon != NULL) {
        port = 0;
        for (const char *c = colon + 1; c < a + n; c++)
            port = port * 10 + (unsigned)(*c - '0');
    }
    memcpy(u->host, h, hn);
    u->host[hn] = '\0';
    u->port = (uint16_t)port;
    snprintf(u->host_hdr, sizeof u->host_hdr, v6 ? "[%s]:%u" : "%s:%u", u->host, port);
    memcpy(u->base_path, slash ? slash : "", pl);
    u->base_path[pl] = '\0';
    return KVR_OK;
}

int kvr_endpoint_parse_url(const char *url, const kvr_endpoint_policy_t *p, kvr_url_t *out,
                           char *err, size_t err_len)
{
    if (strncasecmp(url, "https://", 8) == 0)
        return fail(err, err_len, "url: https is not spoken to workers; use http:// on a "
                    "trusted network (or a local TLS proxy)");
    if (strncasecmp(url, "http://", 7) != 0)
        return fail(err, err_len, "url: must start with http:// ('%s')", url);
    const char *a = url + 7, *slash = strchr(a, '/');
    size_t n = slash ? (size_t)(slash - a) : strlen(a);
    if (memchr(a, '@', n) != NULL)
        return fail(err, err_len, "url: credentials in the url are not accepted");
    int rc = check_authority("url", a, n, false, p, err, err_len);
    if (rc != KVR_OK)
        return rc;
    for (const char *c = slash; c != NULL && *c != '\0'; c++)
        if ((unsigned char)*c <= 0x20 || *c == '?' || *c == '#' || (unsigned char)*c >= 0x7f)
            return fail(err, err_len, "url: the base path may not hold spaces, controls, '?' "
                        "or '#'");
    return out != NULL ? fill_url(out, a, n, slash, err, err_len) : KVR_OK;
}

int kvr_endpoint_check_url(const char *url, const kvr_endpoint_policy_t *p, char *err,
                           size_t err_len)
{
    return kvr_endpoint_parse_url(url, p, NULL, err, err_len);
}

int kvr_endpoint_check_ipc_dirs(const char *dirs, char *err, size_t err_len)
{
    return kvr_endpoint_check_dir_list("allowed_ipc_dirs", dirs, err, err_len);
}

int kvr_endpoint_check_dir(const char *field, const char *path, const char *setting,
                           const char *dirs, char *err, size_t err_len)
{
    if (dirs == NULL || dirs[0] == '\0')
        return fail(err, err_len, "%s: refused unless %s names its directory", field, setting);
    if (!path_normal(path, strlen(path)))
        return fail(err, err_len, "%s: '%s' is not an absolute, normalised path", field, path);
    if (!under_dirs(dirs, path))
        return fail(err, err_len, "%s: '%s' is not under %s", field, path, setting);
    return KVR_OK;
}

int kvr_endpoint_check_dir_list(const char *setting, const char *dirs, char *err, size_t err_len)
{
    if (dirs[0] == '\0')
        return KVR_OK;
    for (const char *p = dirs;;) { /* every entry, an empty last one included */
        const char *e = strchr(p, ',');
        size_t m = e ? (size_t)(e - p) : strlen(p);
        if (!path_normal(p, m))
            return fail(err, err_len, "%s: '%.*s' is not an absolute, normalised directory",
                        setting, (int)m, p);
        if (e == NULL)
            break;
        p = e + 1;
    }
    return KVR_OK;
}

bool kvr_endpoint_host_listed(const char *list, const char *host)
{
    return list != NULL && host != NULL && in_list(list, host, strlen(host));
}
