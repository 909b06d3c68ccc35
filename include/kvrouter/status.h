/*
 * kvrouter/status.h: the status codes every libkvrouter call returns. 0 is success, errors
 * are negative; one table (KVR_STATUS_TABLE) gives each its name and text.
 * Threads: any. Cost: O(1). Nothing allocated.
 */
#ifndef KVR_PUBLIC_STATUS_H
#define KVR_PUBLIC_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_STATUS_TABLE(X)                                                          \
    X(KVR_OK, 0, "ok")                                                               \
    X(KVR_EINVAL, -1, "invalid argument")                                            \
    X(KVR_ENOMEM, -2, "out of memory")                                               \
    X(KVR_EPARENT, -3, "parent block not found")                                     \
    X(KVR_EBLOCKSEQ, -4, "invalid block sequence (repeated hash or self-reference)") \
    X(KVR_ENOBLOCK, -5, "block not found")                                           \
    X(KVR_EFULL, -6, "capacity exhausted")                                           \
    X(KVR_EPARSE, -7, "parse error")                                                 \
    X(KVR_ERANGE, -8, "value out of range")                                          \
    X(KVR_ENOWORKER, -9, "unknown worker")                                           \
    X(KVR_EIO, -10, "input/output error")                                            \
    X(KVR_ETOOBIG, -11, "input too large")                                           \
    X(KVR_EEXIST, -12, "already exists")                                             \
    X(KVR_ENOTFOUND, -13, "not found")                                               \
    X(KVR_EBUSY, -14, "every eligible worker is busy")                               \
    X(KVR_ENOTALLOWED, -15, "worker not allowed by the request's filters")           \
    X(KVR_EQUEUEFULL, -16, "queue limit reached")                                    \
    X(KVR_EMISMATCH, -17, "block size mismatch")                                     \
    X(KVR_ENOMODEL, -18, "no worker serves the request's model or adapter")

enum kvr_status {
#define KVR_STATUS_ENUM(name, value, text) name = value,
    KVR_STATUS_TABLE(KVR_STATUS_ENUM)
#undef KVR_STATUS_ENUM
};

/* A static string for a status code ("unknown status" for codes not in the table). */
const char *kvr_strerror(int status);
/* The symbolic name of a status code, e.g. "KVR_EPARENT". */
const char *kvr_status_name(int status);

#ifdef __cplusplus
}
#endif
#endif /* KVR_PUBLIC_STATUS_H */
