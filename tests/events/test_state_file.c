/*
 * test_state_file.c: the file-system rules of `serve --state-file` (events/state_file.h), in a
 * fresh temporary directory: one claimant per path (the second is refused naming the holder's
 * pid; released, the path can be claimed again), only regular files are read (a FIFO is
 * refused without blocking; a directory, a symbolic link too), a write never goes through a
 * planted link (at PATH.tmp or at PATH), a failed write leaves PATH and the directory as they
 * were, and a claim removes only the temporary files of an interrupted write.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "events/state_file.h"

static char dir[256];

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void assert_text(const char *path, const char *text)
{
    char buf[256] = "";
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    assert_string_equal(buf, text);
}

/* The names in dir that start with prefix. */
static int count_prefixed(const char *prefix)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    closedir(d);
    return n;
}

static int write_hello(void *ud, FILE *f)
{
    return fputs((const char *)ud, f) >= 0 ? KVR_OK : KVR_EIO;
}

static int write_fails(void *ud, FILE *f)
{
    (void)ud;
    fputs("half", f);
    return KVR_ENOMEM;
}

static void test_one_claimant(void **s)
{
    (void)s;
    char p[300], lock[320], err[600];
    path_in(p, sizeof p, "a.state");
    kvr_state_file_t *a = NULL, *b = NULL;
    assert_int_equal(kvr_state_file_claim(p, &a, NULL, err, sizeof err), KVR_OK);
    snprintf(lock, sizeof lock, "%s.lock", p);
    char want[40];
    snprintf(want, sizeof want, "%ld\n", (long)getpid());
    assert_text(lock, want);
    /* another open file description: what a second router has */
    assert_int_equal(kvr_state_file_claim(p, &b, NULL, err, sizeof err), KVR_EEXIST);
    assert_null(b);
    snprintf(want, sizeof want, "pid %ld", (long)getpid());
    assert_non_null(strstr(err, want));
    assert_non_null(strstr(err, "state_file"));
    assert_non_null(strstr(err, p));
    kvr_state_file_release(a);
    assert_int_equal(kvr_state_file_claim(p, &b, NULL, err, sizeof err), KVR_OK);
    kvr_state_file_release(b);
    /* a lock file with another name for its inode is not written through */
    char other[300];
    path_in(other, sizeof other, "other");
    assert_int_equal(link(lock, other), 0);
    assert_int_equal(kvr_state_file_claim(p, &b, NULL, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "hard links"));
    unlink(other);
    kvr_state_file_release(NULL);
}

static void test_only_regular_files(void **s)
{
    (void)s;
    char p[300], err[600];
    int fd = -1;
    uint64_t size = 0;
    path_in(p, sizeof p, "none.state");
    assert_int_equal(kvr_state_file_open_read(p, &fd, &size, err, sizeof err), KVR_ENOTFOUND);
    path_in(p, sizeof p, "fifo.state");
    assert_int_equal(mkfifo(p, 0600), 0);
    /* returns at once (an open of a FIFO without a writer would block) */
    assert_int_equal(kvr_state_file_open_read(p, &fd, &size, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "a FIFO"));
    kvr_state_file_t *c = NULL;
    assert_int_equal(kvr_state_file_claim(p, &c, NULL, err, sizeof err), KVR_EINVAL);
    assert_null(c);
    char lock[320];
    snprintf(lock, sizeof lock, "%s.lock", p);
    assert_int_equal(access(lock, F_OK), -1); /* refused before any lock file was made */
    path_in(p, sizeof p, "dir.state");
    assert_int_equal(mkdir(p, 0700), 0);
    assert_int_equal(kvr_state_file_open_read(p, &fd, &size, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "a directory"));
    char target[300];
    path_in(target, sizeof target, "target");
    write_text(target, "precious");
    path_in(p, sizeof p, "link.state");
    assert_int_equal(symlink(target, p), 0);
    assert_int_equal(kvr_state_file_open_read(p, &fd, &size, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "a symbolic link"));
    assert_int_equal(kvr_state_file_check(p, err, sizeof err), KVR_EINVAL);
    path_in(p, sizeof p, "regular.state");
    write_text(p, "12345");
    assert_int_equal(kvr_state_file_open_read(p, &fd, &size, err, sizeof err), KVR_OK);
    assert_true(fd >= 0);
    assert_int_equal(size, 5);
    assert_int_equal(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    close(fd);
}

static void test_replace_never_follows(void **s)
{
    (void)s;
    char p[300], tmp[320], t1[300], t2[300], err[600];
    path_in(p, sizeof p, "r.state");
    path_in(t1, sizeof t1, "victim1");
    path_in(t2, sizeof t2, "victim2");
    write_text(t1, "precious1");
    write_text(t2, "precious2");
    snprintf(tmp, sizeof tmp, "%s.tmp", p);
    assert_int_equal(symlink(t1, tmp), 0); /* where the temporary file used to go */
    assert_int_equal(symlink(t2, p), 0);   /* the path itself */
    assert_int_equal(kvr_state_file_replace(p, write_hello, "hello", err, sizeof err), KVR_OK);
    assert_text(t1, "precious1");
    assert_text(t2, "precious2");
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_text(p, "hello");
    assert_int_equal(lstat(tmp, &st), 0);
    assert_true(S_ISLNK(st.st_mode)); /* left alone */
    assert_int_equal(count_prefixed("r.state.tmp."), 0);
    /* a write that fails: the old file stays, the temporary one goes */
    assert_int_equal(kvr_state_file_replace(p, write_fails, NULL, err, sizeof err), KVR_ENOMEM);
    assert_non_null(strstr(err, "unchanged"));
    assert_text(p, "hello");
    assert_int_equal(count_prefixed("r.state.tmp."), 0);
    /* a directory that does not exist: an error naming state_file, nothing created */
    char q[320];
    snprintf(q, sizeof q, "%s/missing/x.state", dir);
    assert_int_equal(kvr_state_file_replace(q, write_hello, "x", err, sizeof err), KVR_EIO);
    assert_non_null(strstr(err, "state_file"));
}

static void test_claim_removes_leftovers(void **s)
{
    (void)s;
    char p[300], f[340], target[300], err[600];
    path_in(p, sizeof p, "l.state");
    snprintf(f, sizeof f, "%s.tmp.Abc123Def456", p);
    write_text(f, "half a save"); /* an interrupted save's */
    snprintf(f, sizeof f, "%s.tmp.short", p);
    write_text(f, "not ours"); /* not the pattern */
    path_in(target, sizeof target, "ltarget");
    write_text(target, "precious");
    snprintf(f, sizeof f, "%s.tmp.Zzzzzzzzzzzz", p);
    assert_int_equal(symlink(target, f), 0); /* the pattern, but a link: not ours */
    kvr_state_file_t *c = NULL;
    unsigned removed = 99;
    assert_int_equal(kvr_state_file_claim(p, &c, &removed, err, sizeof err), KVR_OK);
    assert_int_equal(removed, 1);
    assert_int_equal(count_prefixed("l.state.tmp."), 2);
    assert_text(target, "precious");
    kvr_state_file_release(c);
}

static int make_dir(void **s)
{
    (void)s;
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvr-test-state-XXXXXX", t && *t ? t : "/tmp");
    return mkdtemp(dir) == NULL ? -1 : 0;
}

static int remove_dir(void **s)
{
    (void)s;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_claimant),
        cmocka_unit_test(test_only_regular_files),
        cmocka_unit_test(test_replace_never_follows),
        cmocka_unit_test(test_claim_removes_leftovers),
    };
    return cmocka_run_group_tests(tests, make_dir, remove_dir);
}
