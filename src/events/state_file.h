/*
 * state_file.h: the file-system side of `kvrouter serve --state-file PATH` (the bytes are
 * wire/index_snapshot.h's; what goes into them is events/ingest.c's). PATH may sit in a directory
 * other users can write to, and two routers may be pointed at it by mistake; what this module
 * guarantees:
 *
 *   - One user per path. kvr_state_file_claim takes an exclusive flock on PATH.lock (created
 *     0600, never followed if it is a symbolic link, never unlinked: unlinking a lock file
 *     races with the next locker). The lock lives as long as the claim's descriptor, so the
 *     kernel drops it when the process ends, crash or SIGKILL included; the holder's pid is
 *     written in the file, and a second claimant is refused with a message naming the path
 *     and that pid.
 *   - Only regular files are read. PATH is lstat'ed, then opened O_NOFOLLOW | O_NONBLOCK (a
 *     FIFO cannot block the open) and fstat'ed again: a symbolic link, FIFO, socket, device or
 *     directory is refused with a message naming the path and what it is.
 *   - Writes go to a new file, never through an existing one. The temporary file is
 *     PATH.tmp.<12 random characters>, created O_CREAT | O_EXCL | O_NOFOLLOW, 0600 (a name
 *     that exists, a planted symbolic link included, is skipped for another), written, fsync'ed,
 *     renamed over PATH, and the directory fsync'ed: PATH is replaced whole or not at all.
 *     rename() replaces a symbolic link at PATH itself, never its target. A temporary file
 *     left by a crash mid-write is removed by the next claim (only regular files of this
 *     exact name pattern, owned by this user).
 *
 * Ownership: a claim owns its lock descriptor; the caller owns the read descriptor it is
 * given. Threads: a claim is used by one thread at a time; the functions without a claim are
 * reentrant. Cost: a few system calls, plus one directory scan per claim and two fsyncs per
 * write.
 */
#ifndef KVR_STATE_FILE_H
#define KVR_STATE_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvrouter.h"

typedef struct kvr_state_file kvr_state_file_t;

/* Checks PATH (absent, or a regular file: before the lock file is created, and again under
 * the lock) and locks PATH.lock for this process. KVR_OK with *out; KVR_EEXIST (another
 * process holds the lock: err names it and its pid), KVR_EINVAL (PATH or PATH.lock is not a
 * regular file, PATH.lock has other hard links, the path is too long) or KVR_EIO (the lock
 * file cannot be created), with err naming state_file, the path and the problem.
 * *removed_tmp (may be NULL) counts the temporary files of an interrupted write removed. */
int kvr_state_file_claim(const char *path, kvr_state_file_t **out, unsigned *removed_tmp, char *err,
                         size_t err_len);
/* Releases the lock (the lock file stays). NULL is a no-op. */
void kvr_state_file_release(kvr_state_file_t *sf);

/* Checks that path is absent (KVR_ENOTFOUND) or a regular file (KVR_OK); KVR_EINVAL with err
 * naming what it is otherwise, KVR_EIO when it cannot be examined. Opens nothing. */
int kvr_state_file_check(const char *path, char *err, size_t err_len);

/* Opens path to read it: KVR_OK with *fd (O_CLOEXEC, blocking) and *size; KVR_ENOTFOUND when
 * there is no file; KVR_EINVAL when it is not a regular file (never blocks on a FIFO, never
 * follows a symbolic link); KVR_EIO otherwise. err names state_file, the path and why. */
int kvr_state_file_open_read(const char *path, int *fd, uint64_t *size, char *err, size_t err_len);

/* Writes a file's content; KVR_OK or the status that stops the write. */
typedef int (*kvr_state_file_write_fn)(void *ud, FILE *f);

/* Replaces path whole with what fn writes (see above). KVR_OK; else path is untouched, the
 * temporary file removed, and err names state_file, the file and the problem. */
int kvr_state_file_replace(const char *path, kvr_state_file_write_fn fn, void *ud, char *err,
                           size_t err_len);

#endif
