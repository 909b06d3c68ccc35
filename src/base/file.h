/*
 * file.h: a whole file read into memory (config files, tokenizer files), the one reader of
 * the tree. Ownership: *buf is malloc'd for the caller, NUL-terminated after *len bytes.
 * Threads: any. Cost: O(file); a file over max bytes is refused without reading it all.
 */
#ifndef KVR_BASE_FILE_H
#define KVR_BASE_FILE_H

#include <stddef.h>

/* KVR_OK; KVR_ENOTFOUND (no such file), KVR_ETOOBIG (over max bytes), KVR_EIO, KVR_ENOMEM. */
int kvr_file_read(const char *path, size_t max, char **buf, size_t *len);

#endif /* KVR_BASE_FILE_H */
