/*
 * fuzz_endpoint.c: libFuzzer target for the registration checks (core/endpoint.c), the trust
 * boundary of POST /v1/workers and --worker. Byte 0 picks the check (events address, url,
 * allowed_ipc_dirs value); the rest, cut at the first NUL, is the string checked.
 *
 * Invariants checked: a refusal leaves a non-empty message naming the field; an acceptance
 * has no wildcard, no ';' or '@', the scheme the check demands, and an ipc:// path strictly
 * under an allowed directory with no "." or ".." component; the same input gives the same
 * verdict twice (no hidden state); a url taken apart (kvr_endpoint_parse_url) gives a host,
 * port and Host header that rebuild its authority.
 * Memory: stack only. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/endpoint.h"
#include "kvrouter.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_zmq(const char *s, const kvr_endpoint_policy_t *pol)
{
    char err[256] = "";
    int rc = kvr_endpoint_check_zmq("events", s, pol, err, sizeof err);
    char err2[256] = "";
    check(kvr_endpoint_check_zmq("events", s, pol, err2, sizeof err2) == rc);
    if (rc != KVR_OK) {
        check(rc == KVR_EINVAL && strncmp(err, "events: ", 8) == 0);
        return;
    }
    check(strchr(s, '*') == NULL && strchr(s, ';') == NULL);
    if (strncmp(s, "ipc://", 6) == 0) {
        check(strncmp(s + 6, "/run/kvr/", 9) == 0 || strncmp(s + 6, "/tmp/e/", 7) == 0);
        check(strstr(s, "/../") == NULL && strstr(s, "/./") == NULL && strstr(s, "//") == s + 4);
    } else {
        check(strncmp(s, "tcp://", 6) == 0 && strrchr(s, ':') > s + 6);
    }
}

static void check_url(const char *s, const kvr_endpoint_policy_t *pol)
{
    char err[256] = "";
    int rc = kvr_endpoint_check_url(s, pol, err, sizeof err);
    if (rc != KVR_OK) {
        check(rc == KVR_EINVAL && strncmp(err, "url: ", 5) == 0);
        return;
    }
    check(strncasecmp(s, "http://", 7) == 0 && strchr(s, '?') == NULL && strchr(s, '#') == NULL &&
          strchr(s, ' ') == NULL);
    const char *slash = strchr(s + 7, '/'); /* the authority: no credentials, no wildcard */
    size_t an = slash ? (size_t)(slash - (s + 7)) : strlen(s + 7);
    check(an > 0 && memchr(s + 7, '@', an) == NULL && memchr(s + 7, '*', an) == NULL);
    /* taken apart: the same verdict (but for parts too long to hold), parts that rebuild the
     * authority */
    kvr_url_t u;
    char err2[256] = "";
    if (kvr_endpoint_parse_url(s, pol, &u, err2, sizeof err2) != KVR_OK) {
        check(strstr(err2, "longer than") != NULL);
        return;
    }
    bool v6 = s[7] == '[';
    size_t hl = strlen(u.host);
    check(hl > 0 && u.port >= 1 && strncmp(s + 7 + v6, u.host, hl) == 0);
    char hdr[320];
    snprintf(hdr, sizeof hdr, v6 ? "[%s]:%u" : "%s:%u", u.host, u.port);
    check(strcmp(hdr, u.host_hdr) == 0);
    size_t bl = strlen(u.base_path);
    check(bl == 0 || (u.base_path[0] == '/' && u.base_path[bl - 1] != '/'));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char s[512];
    size_t n = size - 1 < sizeof s - 1 ? size - 1 : sizeof s - 1;
    memcpy(s, data + 1, n);
    s[n] = '\0';
    static const kvr_endpoint_policy_t open_pol = {0};
    static const kvr_endpoint_policy_t strict = {.ipc_dirs = "/run/kvr,/tmp/e",
                                                 .hosts = "127.0.0.1,engine-1,[::1]"};
    char err[256] = "";
    switch (data[0] % 3) {
    case 0:
        check_zmq(s, &open_pol);
        check_zmq(s, &strict);
        break;
    case 1:
        check_url(s, &open_pol);
        check_url(s, &strict);
        break;
    default:
        if (kvr_endpoint_check_ipc_dirs(s, err, sizeof err) != KVR_OK)
            check(strncmp(err, "allowed_ipc_dirs: ", 18) == 0);
        else
            check(s[0] == '\0' || s[0] == '/');
        break;
    }
    return 0;
}
