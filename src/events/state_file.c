/*
 * state_file.c: see state_file.h.
 *
 * Invariants: a claim's fd holds the flock on its lock_path from claim to release; a file this
 * module creates is always new (O_EXCL) and 0600; nothing is ever opened through a symbolic
 * link at the last path component (O_NOFOLLOW, and lstat before any open of PATH).
 */
#include "events/state_file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"

#define TMP_TAG ".tmp."
#define TMP_RAND 12

static const char TMP_ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";

struct kvr_state_file {
    int fd;
    char lock_path[PATH_MAX];
};

/* "a FIFO", "a directory", ...: what a path is when it is not a regular file. */
static const char *kind_of(mode_t m)
{
    if (S_ISLNK(m))
        return "a symbolic link";
    if (S_ISFIFO(m))
        return "a FIFO";
    if (S_ISSOCK(m))
        return "a socket";
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISDIR(m))
        return "a directory";
    return "not a regular file";
}

static int not_regular(const char *path, mode_t m, char *err, size_t err_len)
{
    snprintf(err, err_len,
             "state_file: %s is %s, not a regular file: refusing to read, write or replace it "
             "(remove it, or point state_file at another path)",
             path, kind_of(m));
    return KVR_EINVAL;
}

/* The directory of path ("." when it has none) and its last component. */
static int split_path(const char *path, char *dir, size_t cap, const char **base)
{
    const char *slash = strrchr(path, '/');
    *base = slash != NULL ? slash + 1 : path;
    size_t n = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (n >= cap)
        return KVR_ETOOBIG;
    memcpy(dir, slash == NULL ? "." : path, n);
    dir[n] = '\0';
    return KVR_OK;
}

int kvr_state_file_check(const char *path, char *err, size_t err_len)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        if (errno == ENOENT)
            return KVR_ENOTFOUND;
        snprintf(err, err_len, "state_file: cannot examine %s: %s", path, strerror(errno));
        return KVR_EIO;
    }
    return S_ISREG(st.st_mode) ? KVR_OK : not_regular(path, st.st_mode, err, err_len);
}

int kvr_state_file_open_read(const char *path, int *fd, uint64_t *size, char *err, size_t err_len)
{
    int rc = kvr_state_file_check(path, err, err_len);
    if (rc != KVR_OK)
        return rc;
    /* O_NONBLOCK: a FIFO swapped in after the lstat cannot block the open */
    int f = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (f < 0) {
        if (errno == ENOENT)
            return KVR_ENOTFOUND;
        if (errno == ELOOP)
            return not_regular(path, S_IFLNK, err, err_len);
        snprintf(err, err_len, "state_file: cannot read %s: %s", path, strerror(errno));
        return KVR_EIO;
    }
    struct stat st;
    if (fstat(f, &st) != 0) {
        snprintf(err, err_len, "state_file: cannot examine %s: %s", path, strerror(errno));
        close(f);
        return KVR_EIO;
    }
    if (!S_ISREG(st.st_mode)) {
        close(f);
        return not_regular(path, st.st_mode, err, err_len);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl >= 0)
        (void)fcntl(f, F_SETFL, fl & ~O_NONBLOCK);
    *fd = f;
    *size = (uint64_t)st.st_size;
    return KVR_OK;
}

/* Removes the temporary files an interrupted write of base left in dir: regular files named
 * base.tmp.<TMP_RAND characters of TMP_ALPHABET>, owned by this user. */
static unsigned remove_leftovers(const char *dir, const char *base)
{
    DIR *d = opendir(dir);
    if (d == NULL)
        return 0;
    unsigned removed = 0;
    size_t bl = strlen(base), tl = strlen(TMP_TAG);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *n = e->d_name;
        if (strncmp(n, base, bl) != 0 || strncmp(n + bl, TMP_TAG, tl) != 0)
            continue;
        const char *r = n + bl + tl;
        if (strlen(r) != TMP_RAND || strspn(r, TMP_ALPHABET) != TMP_RAND)
            continue;
        struct stat st;
        if (fstatat(dirfd(d), n, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode) ||
            st.st_uid != geteuid())
            continue;
        if (unlinkat(dirfd(d), n, 0) == 0)
            removed++;
    }
    closedir(d);
    return removed;
}

int kvr_state_file_claim(const char *path, kvr_state_file_t **out, unsigned *removed_tmp, char *err,
                         size_t err_len)
{
    unsigned dummy;
    if (removed_tmp == NULL)
        removed_tmp = &dummy;
    *removed_tmp = 0;
    *out = NULL;
    char dir[PATH_MAX];
    const char *base = "";
    if (path == NULL || path[0] == '\0' || split_path(path, dir, sizeof dir, &base) != KVR_OK ||
        base[0] == '\0') {
        snprintf(err, err_len, "state_file: '%s' does not name a file", path ? path : "");
        return KVR_EINVAL;
    }
    kvr_state_file_t *sf = calloc(1, sizeof *sf);
    if (sf == NULL)
        return KVR_ENOMEM;
    sf->fd = -1;
    if (snprintf(sf->lock_path, sizeof sf->lock_path, "%s.lock", path) >=
        (int)sizeof sf->lock_path) {
        snprintf(err, err_len, "state_file: path too long");
        free(sf);
        return KVR_EINVAL;
    }
    /* the path first: a refused one leaves no lock file behind; and no device, FIFO or link
     * at the lock file's name is ever opened */
    int rc = kvr_state_file_check(path, err, err_len);
    if (rc == KVR_OK || rc == KVR_ENOTFOUND)
        rc = kvr_state_file_check(sf->lock_path, err, err_len);
    if (rc != KVR_OK && rc != KVR_ENOTFOUND) {
        free(sf);
        return rc;
    }
    rc = KVR_OK;
    struct stat st;
    sf->fd = open(sf->lock_path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (sf->fd < 0) {
        if (errno == ELOOP)
            rc = not_regular(sf->lock_path, S_IFLNK, err, err_len);
        else
            snprintf(err, err_len, "state_file: cannot open its lock file %s: %s", sf->lock_path,
                     strerror(errno));
        rc = rc != KVR_OK ? rc : KVR_EIO;
    } else if (fstat(sf->fd, &st) != 0) {
        snprintf(err, err_len, "state_file: cannot examine %s: %s", sf->lock_path, strerror(errno));
        rc = KVR_EIO;
    } else if (!S_ISREG(st.st_mode)) {
        rc = not_regular(sf->lock_path, st.st_mode, err, err_len);
    } else if (st.st_nlink != 1) {
        snprintf(err, err_len,
                 "state_file: lock file %s has %lu hard links: refusing to write through it "
                 "(remove it)",
                 sf->lock_path, (unsigned long)st.st_nlink);
        rc = KVR_EINVAL;
    } else if (flock(sf->fd, LOCK_EX | LOCK_NB) != 0) {
        if (errno == EWOULDBLOCK) {
            char pid[24] = "";
            ssize_t n = pread(sf->fd, pid, sizeof pid - 1, 0);
            pid[n > 0 ? n : 0] = '\0';
            pid[strspn(pid, "0123456789")] = '\0';
            snprintf(err, err_len,
                     "state_file %s is in use by another process (pid %s holds its lock %s): "
                     "two routers must not share a state file; give each its own path",
                     path, pid[0] ? pid : "unknown", sf->lock_path);
            rc = KVR_EEXIST;
        } else {
            snprintf(err, err_len, "state_file: cannot lock %s: %s", sf->lock_path,
                     strerror(errno));
            rc = KVR_EIO;
        }
    }
    if (rc == KVR_OK) {
        char pid[24];
        int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
        /* only for the message of a refused claimant: the lock is the flock, not the pid */
        if (ftruncate(sf->fd, 0) != 0 || pwrite(sf->fd, pid, (size_t)n, 0) != n)
            kvr_log(KVR_LOG_WARN, "state_file: could not write this pid into %s: %s", sf->lock_path,
                    strerror(errno));
        rc = kvr_state_file_check(path, err, err_len); /* again, under the lock */
        rc = rc == KVR_ENOTFOUND ? KVR_OK : rc;
    }
    if (rc != KVR_OK) {
        kvr_state_file_release(sf);
        return rc;
    }
    *removed_tmp = remove_leftovers(dir, base);
    *out = sf;
    return KVR_OK;
}

void kvr_state_file_release(kvr_state_file_t *sf)
{
    if (sf == NULL)
        return;
    if (sf->fd >= 0)
        close(sf->fd); /* drops the flock */
    free(sf);
}

/* A new file path.tmp.<random> (its name in tmp), never an existing one. -1 with errno. */
static int open_tmp(const char *path, char *tmp, size_t cap)
{
    for (int attempt = 0; attempt < 64; attempt++) {
        uint8_t rnd[TMP_RAND];
        if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
            return -1;
        char suffix[TMP_RAND + 1];
        for (size_t i = 0; i < TMP_RAND; i++)
            suffix[i] = TMP_ALPHABET[rnd[i] % (sizeof TMP_ALPHABET - 1)];
        suffix[TMP_RAND] = '\0';
        if (snprintf(tmp, cap, "%s%s%s", path, TMP_TAG, suffix) >= (int)cap) {
            errno = ENAMETOOLONG;
            return -1;
        }
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

int kvr_state_file_replace(const char *path, kvr_state_file_write_fn fn, void *ud, char *err,
                           size_t err_len)
{
    char dir[PATH_MAX], tmp[PATH_MAX + 32];
    const char *base;
    if (split_path(path, dir, sizeof dir, &base) != KVR_OK || base[0] == '\0') {
        snprintf(err, err_len, "state_file: '%s' does not name a file", path);
        return KVR_EINVAL;
    }
    int fd = open_tmp(path, tmp, sizeof tmp);
    FILE *f = NULL;
    if (fd < 0 || (f = fdopen(fd, "wb")) == NULL) {
        int e = errno;
        snprintf(err, err_len,
                 "state_file: cannot create a temporary file next to %s: %s (%s "
                 "unchanged)",
                 path, strerror(e), path);
        if (fd >= 0) {
            close(fd);
            (void)unlink(tmp);
        }
        return KVR_EIO;
    }
    const char *what = "writing";
    int e = 0;
    int rc = fn(ud, f);
    if (rc == KVR_EIO)
        e = errno;
    if (rc == KVR_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
        rc = KVR_EIO;
        e = errno;
        what = "syncing";
    }
    if (fclose(f) != 0 && rc == KVR_OK) {
        rc = KVR_EIO;
        e = errno;
        what = "closing";
    }
    struct stat st;
    if (rc == KVR_OK && lstat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        kvr_log(KVR_LOG_WARN,
                "state_file: %s had become %s: it is replaced by the saved file (a link's "
                "target is never written)",
                path, kind_of(st.st_mode));
    if (rc == KVR_OK && rename(tmp, path) != 0) {
        rc = KVR_EIO;
        e = errno;
        what = "renaming it over the state file";
    }
    if (rc != KVR_OK) {
        snprintf(err, err_len, "state_file: %s %s failed: %s (%s unchanged)", what, tmp,
                 rc == KVR_EIO && e != 0 ? strerror(e) : kvr_strerror(rc), path);
        (void)unlink(tmp);
        return rc;
    }
    /* the rename is durable once the directory is */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || (fsync(dfd) != 0 && errno != EINVAL))
        kvr_log(KVR_LOG_WARN,
                "state_file: %s is written, but its directory %s could not be synced: %s (a "
                "power loss now could undo the rename)",
                path, dir, strerror(errno));
    if (dfd >= 0)
        close(dfd);
    return KVR_OK;
}
