/*
 * nats_auth.c: see nats_auth.h. nats.c reads the creds and seed files itself; what is checked
 * here first is what its errors would not name: which setting, and what is wrong with it.
 */
#define _GNU_SOURCE /* memmem */
#include "nats/nats_auth.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "kvrouter.h"
#include "base/log.h"
#include "base/secret.h"

#define NKEY_LEN 56      /* a user's public key, base32 ("U...") */
#define NKEY_SEED_LEN 58 /* its seed ("SU...") */

static bool set(const char *s) { return s != NULL && s[0] != '\0'; }

bool kvr_nats_url_has_credentials(const char *url)
{
    for (const char *p = url; p != NULL && *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *scheme = memmem(p, n, "://", 3);
        const char *host = scheme ? scheme + 3 : p;
        const char *slash = memchr(host, '/', n - (size_t)(host - p));
        size_t hn = slash ? (size_t)(slash - host) : n - (size_t)(host - p);
        if (memchr(host, '@', hn) != NULL)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

static int fail(char *err, size_t err_len, int rc, const char *field, const char *path,
                const char *why)
{
    snprintf(err, err_len, "%s: %s: %s", field, path, why);
    return rc;
}

static int readable(const char *field, const char *path, char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fail(err, err_len, KVR_EIO, field, path, "cannot be read");
    fclose(f);
    return KVR_OK;
}

/* The public key line ("U" + 55 base32 characters) of an nkey file, and that it holds a seed. */
static int nkey_public(const char *path, char pub[NKEY_LEN + 1], char *err, size_t err_len)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return fail(err, err_len, KVR_EIO, "nats_nkey_file", path, "cannot be read");
    char line[256];
    bool seed = false;
    pub[0] = '\0';
    while (fgets(line, sizeof line, f) != NULL) {
        size_t n = strcspn(line, "\r\n \t");
        line[n] = '\0';
        if (n == NKEY_SEED_LEN && line[0] == 'S' && line[1] == 'U')
            seed = true;
        else if (n == NKEY_LEN && line[0] == 'U')
            memcpy(pub, line, NKEY_LEN + 1);
    }
    fclose(f);
    if (!seed)
        return fail(err, err_len, KVR_EINVAL, "nats_nkey_file", path,
                    "holds no user seed (a line SU...)");
    if (pub[0] == '\0')
        return fail(err, err_len, KVR_EINVAL, "nats_nkey_file", path,
                    "holds no public key (a line U...): write both, as `nk -gen user -pubout` "
                    "prints them");
    return KVR_OK;
}

static int nats_failed(natsStatus s, const char *field, const char *path, char *err,
                       size_t err_len)
{
    snprintf(err, err_len, "%s: %s: %s (%s)", field, path, natsStatus_GetText(s),
             nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "no detail");
    return KVR_EINVAL;
}

static int apply_identity(natsOptions *opts, const kvr_nats_auth_t *a, char *err,
                          size_t err_len)
{
    natsStatus s;
    if (set(a->creds_file)) {
        int rc = readable("nats_creds_file", a->creds_file, err, err_len);
        if (rc != KVR_OK)
            return rc;
        if ((s = natsOptions_SetUserCredentialsFromFiles(opts, a->creds_file, NULL)) != NATS_OK)
            return nats_failed(s, "nats_creds_file", a->creds_file, err, err_len);
    } else if (set(a->nkey_file)) {
        char pub[NKEY_LEN + 1];
        int rc = nkey_public(a->nkey_file, pub, err, err_len);
        if (rc != KVR_OK)
            return rc;
        if ((s = natsOptions_SetNKeyFromSeed(opts, pub, a->nkey_file)) != NATS_OK)
            return nats_failed(s, "nats_nkey_file", a->nkey_file, err, err_len);
    } else if (set(a->token_file)) {
        char tok[KVR_SECRET_MAX];
        int rc = kvr_secret_read("nats_token_file", a->token_file, tok, err, err_len);
        if (rc != KVR_OK)
            return rc;
        s = natsOptions_SetToken(opts, tok);
        memset(tok, 0, sizeof tok);
        if (s != NATS_OK)
            return nats_failed(s, "nats_token_file", a->token_file, err, err_len);
    }
    return KVR_OK;
}

static int apply_tls(natsOptions *opts, const kvr_nats_auth_t *a, char *err, size_t err_len)
{
    if (!set(a->tls_ca) && !set(a->tls_cert) && !set(a->tls_key))
        return KVR_OK;
    if (set(a->tls_cert) != set(a->tls_key)) {
        snprintf(err, err_len, "%s: set with %s (a client certificate needs its key, and a key "
                 "its certificate)", set(a->tls_cert) ? "nats_tls_cert" : "nats_tls_key",
                 set(a->tls_cert) ? "nats_tls_key" : "nats_tls_cert");
        return KVR_EINVAL;
    }
    natsStatus s = natsOptions_SetSecure(opts, true);
    if (s != NATS_OK)
        return nats_failed(s, "nats_tls_ca", set(a->tls_ca) ? a->tls_ca : "-", err, err_len);
    if (set(a->tls_ca) &&
        (s = natsOptions_LoadCATrustedCertificates(opts, a->tls_ca)) != NATS_OK)
        return nats_failed(s, "nats_tls_ca", a->tls_ca, err, err_len);
    if (set(a->tls_cert) &&
        (s = natsOptions_LoadCertificatesChain(opts, a->tls_cert, a->tls_key)) != NATS_OK)
        return nats_failed(s, "nats_tls_cert", a->tls_cert, err, err_len);
    return KVR_OK;
}

int kvr_nats_auth_apply(natsOptions *opts, const kvr_nats_auth_t *a, const char *url, char *err,
                        size_t err_len)
{
    static const kvr_nats_auth_t none = {0};
    a = a != NULL ? a : &none;
    int n = set(a->creds_file) + set(a->nkey_file) + set(a->token_file);
    if (n > 1) {
        snprintf(err, err_len, "nats_creds_file, nats_nkey_file, nats_token_file: give one "
                 "(each is a whole identity)");
        return KVR_EINVAL;
    }
    if (url != NULL && kvr_nats_url_has_credentials(url)) {
        if (n > 0) {
            snprintf(err, err_len, "nats_url: carries credentials and a credentials file is "
                     "set too; keep the file and drop them from the url");
            return KVR_EINVAL;
        }
        kvr_log(KVR_LOG_WARN, "nats_url carries credentials: they show in `ps` and in logs; "
                "use nats_token_file, nats_nkey_file or nats_creds_file instead");
    }
    int rc = apply_identity(opts, a, err, err_len);
    return rc == KVR_OK ? apply_tls(opts, a, err, err_len) : rc;
}
