/*
 * secret.c: see secret.h.
 */
#include "base/secret.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "base/log.h"
#include "kvrouter/status.h"

/* A key others can read is a key others may have: said once per read, not refused (a
 * container's mounted secret is often 0644 and only the router can reach it). */
static void warn_if_shared(FILE *f, const char *field, const char *path)
{
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && (st.st_mode & 077) != 0)
        kvr_log(KVR_LOG_WARN, "%s: '%s' is readable by %s (mode %03o): chmod 600 it", field,
                path, (st.st_mode & 007) != 0 ? "every user" : "its group",
                (unsigned)(st.st_mode & 0777));
}

int kvr_secret_read(const char *field, const char *path, char out[KVR_SECRET_MAX], char *err,
                    size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_len, "%s: cannot read '%s': %s", field, path, strerror(errno));
        return KVR_EIO;
    }
    warn_if_shared(f, field, path);
    char buf[KVR_SECRET_MAX + 1];
    size_t n = fread(buf, 1, sizeof buf, f);
    int eof = feof(f);
    fclose(f);
    if (n == sizeof buf || !eof) {
        snprintf(err, err_len, "%s: '%s' is longer than %d bytes", field, path,
                 KVR_SECRET_MAX - 1);
        return KVR_EINVAL;
    }
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)buf[a]))
        a++;
    while (b > a && isspace((unsigned char)buf[b - 1]))
        b--;
    if (a == b) {
        snprintf(err, err_len, "%s: '%s' is empty", field, path);
        return KVR_EINVAL;
    }
    for (size_t i = a; i < b; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c <= 0x20 || c == 0x7f) {
            snprintf(err, err_len, "%s: '%s' holds whitespace or control bytes inside the token",
                     field, path);
            return KVR_EINVAL;
        }
    }
    memcpy(out, buf + a, b - a);
    out[b - a] = '\0';
    return KVR_OK;
}

bool kvr_secret_equal(const char *a, size_t alen, const char *b, size_t blen)
{
    volatile unsigned char diff = (unsigned char)(alen != blen);
    for (size_t i = 0; i < blen; i++) {
        unsigned char x = i < alen ? (unsigned char)a[i] : 0;
        diff |= (unsigned char)(x ^ (unsigned char)b[i]);
    }
    return diff == 0;
}
