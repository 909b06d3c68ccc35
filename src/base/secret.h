/*
 * secret.h: tokens read from files named by the configuration (worker_api_key_file, and the
 * API keys of the planes), so a secret never sits on a command line or in the environment,
 * where ps(1) and /proc/PID/environ show it. Read once at start; the caller keeps the copy.
 * Threads: any. Cost: one small file read.
 */
#ifndef KVR_SECRET_H
#define KVR_SECRET_H

#include <stdbool.h>
#include <stddef.h>

#define KVR_SECRET_MAX 512

/* Reads the token in path into out (NUL-terminated; surrounding whitespace dropped).
 * KVR_OK, or KVR_EINVAL / KVR_EIO with err naming field and the problem: unreadable, empty,
 * longer than KVR_SECRET_MAX - 1 bytes, or holding whitespace or control bytes inside. A file
 * readable by its group or by others is read, with a warning on the log. */
int kvr_secret_read(const char *field, const char *path, char out[KVR_SECRET_MAX], char *err,
                    size_t err_len);

/* a[0..alen) == b[0..blen), in time that depends on blen only (b: the secret). */
bool kvr_secret_equal(const char *a, size_t alen, const char *b, size_t blen);

#endif
