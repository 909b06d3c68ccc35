/*
 * file.c: kvr_file_read (file.h). Reads by chunks into a doubling buffer, so pipes and files
 * whose size changes while read work too; the bound is checked as it grows.
 */
#include "base/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvrouter/status.h"

int kvr_file_read(const char *path, size_t max, char **buf, size_t *len)
{
    *buf = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return errno == ENOENT ? KVR_ENOTFOUND : KVR_EIO;
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    int rc = b != NULL ? KVR_OK : KVR_ENOMEM;
    while (rc == KVR_OK) {
        if (n + 1 >= cap) {
            char *nb = cap < max + 2 ? realloc(b, cap * 2) : NULL;
            if (nb == NULL) {
                rc = cap < max + 2 ? KVR_ENOMEM : KVR_ETOOBIG;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t got = fread(b + n, 1, cap - 1 - n, f);
        n += got;
        if (n > max)
            rc = KVR_ETOOBIG;
        else if (got == 0)
            break;
    }
    if (rc == KVR_OK && ferror(f))
        rc = KVR_EIO;
    fclose(f);
    if (rc != KVR_OK) {
        free(b);
        return rc;
    }
    b[n] = '\0';
    *buf = b;
    *len = n;
    return KVR_OK;
}
