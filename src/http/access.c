/*
 * access.c: see access.h.
 */
#include "http/access.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kvrouter.h"

kvr_access_class_t kvr_access_class(const char *path, bool get, bool post, bool del)
{
    if (get && (strcmp(path, "/health") == 0 || strcmp(path, "/ready") == 0))
        return KVR_ACCESS_OPEN;
    if ((post && strcmp(path, "/v1/workers") == 0) ||
        (post && strcmp(path, "/busy_threshold") == 0) ||
        (post && strcmp(path, "/v1/log-level") == 0) ||
        (post && strcmp(path, "/record_routing_decision") == 0) ||
        (del && strncmp(path, "/v1/workers/", 12) == 0) ||
        (get && (strcmp(path, "/v1/dump") == 0 || strcmp(path, "/dump") == 0)))
        return KVR_ACCESS_ADMIN;
    if (get && strcmp(path, "/v1/index/snapshot") == 0)
        return KVR_ACCESS_PEER;
    if (get && (strcmp(path, "/v1/workers") == 0 || strcmp(path, "/metrics") == 0 ||
                strcmp(path, "/v1/routers") == 0 || strcmp(path, "/v1/stats") == 0 ||
                strcmp(path, "/ui") == 0))
        return KVR_ACCESS_READ;
    return KVR_ACCESS_CLIENT;
}

int kvr_access_init(kvr_access_t *a, const kvr_router_config_t *cfg, char *err, size_t err_len)
{
    memset(a, 0, sizeof *a);
    a->admin_listener = cfg->admin_port.set;
    int rc = KVR_OK;
    if (cfg->api_key_file[0] != '\0')
        rc = kvr_secret_read("api_key_file", cfg->api_key_file, a->api_key, err, err_len);
    if (rc == KVR_OK && cfg->admin_key_file[0] != '\0')
        rc = kvr_secret_read("admin_key_file", cfg->admin_key_file, a->admin_key, err, err_len);
    if (rc == KVR_OK && cfg->peer_key_file[0] != '\0')
        rc = kvr_secret_read("peer_key_file", cfg->peer_key_file, a->peer_key, err, err_len);
    if (rc == KVR_OK && a->api_key[0] != '\0' && strcmp(a->api_key, a->admin_key) == 0) {
        snprintf(err, err_len, "admin_key_file: holds the same token as api_key_file");
        rc = KVR_EINVAL;
    }
    if (rc == KVR_OK && a->peer_key[0] != '\0' &&
        (strcmp(a->peer_key, a->api_key) == 0 || strcmp(a->peer_key, a->admin_key) == 0)) {
        snprintf(err, err_len, "peer_key_file: holds the same token as %s",
                 strcmp(a->peer_key, a->api_key) == 0 ? "api_key_file" : "admin_key_file");
        rc = KVR_EINVAL;
    }
    return rc;
}

/* The token of "Bearer <token>" (scheme case-insensitive), or NULL. */
static const char *bearer(const char *authorization)
{
    if (authorization == NULL || strncasecmp(authorization, "Bearer ", 7) != 0)
        return NULL;
    const char *t = authorization + 7;
    while (*t == ' ')
        t++;
    return t;
}

/* The password of "Basic base64(user:password)" (scheme case-insensitive) decoded into buf, or
 * NULL: malformed, or longer than buf. A browser sends it for a page it was challenged for
 * (RFC 7617); libcrypto's decoder (already linked for NATS's TLS) does the base64. */
static const char *basic_password(const char *authorization, char *buf, size_t cap)
{
    if (authorization == NULL || strncasecmp(authorization, "Basic ", 6) != 0)
        return NULL;
    const char *b = authorization + 6;
    while (*b == ' ')
        b++;
    size_t n = strlen(b);
    while (n > 0 && b[n - 1] == ' ')
        n--;
    unsigned char dec[3 * (KVR_SECRET_MAX + 64) / 4 + 3];
    if (n == 0 || n % 4 != 0 || n / 4 * 3 > sizeof dec - 1)
        return NULL;
    int len = EVP_DecodeBlock(dec, (const unsigned char *)b, (int)n);
    if (len < 0)
        return NULL;
    len -= (b[n - 1] == '=') + (b[n - 2] == '='); /* the decoder counts padding as bytes */
    if (len <= 0)
        return NULL;
    const unsigned char *colon = memchr(dec, ':', (size_t)len);
    if (colon == NULL)
        return NULL;
    size_t plen = (size_t)len - (size_t)(colon + 1 - dec);
    if (plen >= cap || memchr(colon + 1, '\0', plen) != NULL)
        return NULL;
    memcpy(buf, colon + 1, plen);
    buf[plen] = '\0';
    return buf;
}

static bool token_is(const char *given, const char *key)
{
    return key[0] != '\0' && given != NULL &&
           kvr_secret_equal(given, strlen(given), key, strlen(key));
}

int kvr_access_check(const kvr_access_t *a, kvr_access_class_t cls, bool on_admin_listener,
                     const char *authorization, char *msg, size_t cap)
{
    bool peer = cls == KVR_ACCESS_PEER;
    if (peer) /* served and guarded as an admin call, the peer key accepted besides */
        cls = KVR_ACCESS_ADMIN;
    if (a->admin_listener && cls == KVR_ACCESS_ADMIN && !on_admin_listener) {
        snprintf(msg, cap, "fleet changes are served on the admin listener (admin_port), "
                           "not on this port");
        return 404;
    }
    if (a->admin_listener && cls == KVR_ACCESS_CLIENT && on_admin_listener) {
        snprintf(msg, cap, "the admin listener serves fleet changes only; send this to the "
                           "client port (http_port)");
        return 404;
    }
    if (cls == KVR_ACCESS_OPEN)
        return 0;
    const char *given = bearer(authorization);
    char basic[KVR_SECRET_MAX + 64];
    if (given == NULL && cls == KVR_ACCESS_READ) /* a browser on the page and its fetches */
        given = basic_password(authorization, basic, sizeof basic);
    bool ok;
    if (peer && a->peer_key[0] != '\0' && token_is(given, a->peer_key))
        ok = true;
    else if (peer && a->peer_key[0] != '\0' && a->admin_key[0] == '\0' && a->api_key[0] == '\0')
        ok = false; /* a peer key alone guards the snapshot */
    else if (cls == KVR_ACCESS_ADMIN && a->admin_key[0] != '\0')
        ok = token_is(given, a->admin_key);
    else if (a->api_key[0] != '\0')
        ok = token_is(given, a->api_key) || token_is(given, a->admin_key);
    else
        ok = true;
    if (ok)
        return 0;
    snprintf(msg, cap, "%s", given == NULL && cls == KVR_ACCESS_READ
                                 ? "missing API key: send `Authorization: Bearer <key>`, or "
                                   "from a browser the key as the Basic password"
                             : given == NULL ? "missing API key: send `Authorization: Bearer <key>`"
                             : peer ? "incorrect API key: this call needs the peer key (peer_key_file) "
                                      "or the admin key"
                             : cls == KVR_ACCESS_ADMIN && a->admin_key[0] != '\0'
                                 ? "incorrect API key: this call needs the admin key"
                                 : "incorrect API key provided");
    return 401;
}
