/*
 * gnuplot.c: see gnuplot.h. The script goes to $TMPDIR (else /tmp) by mkstemp; gnuplot runs by
 * posix_spawnp with the caller's environment.
 */
#include "replay/gnuplot.h"

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvrouter.h"

extern char **environ;

bool kvr_gnuplot_available(void)
{
    const char *path = getenv("PATH");
    if (path == NULL || *path == '\0')
        path = "/usr/local/bin:/usr/bin:/bin";
    char dir[4096];
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof dir, "%.*s/gnuplot", (int)n, n ? path : ".");
        if (access(dir, X_OK) == 0)
            return true;
        path += n;
        if (*path == ':')
            path++;
    }
    return false;
}

void kvr_gnuplot_str(FILE *f, const char *s)
{
    fputc('\'', f);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('\'', f);
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcasecmp(s + n - k, suffix) == 0;
}

/* Writes the script: terminal, output, the caller's body, the output closed. */
static int write_script(const kvr_gnuplot_t *p, bool svg, char *script, size_t cap, char *err,
                        size_t err_len)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(script, cap, "%s/kvrouter-plot-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(script);
    FILE *f = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (f == NULL) {
        snprintf(err, err_len, "cannot write a gnuplot script in %s: %s",
                 tmp && *tmp ? tmp : "/tmp", strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(script);
        }
        return KVR_EIO;
    }
    if (svg)
        fprintf(f, "set terminal svg size %d,%d dynamic noenhanced font 'sans,12'\n", p->width,
                p->height);
    else
        fprintf(f, "set terminal pngcairo size %d,%d noenhanced font 'sans,10'\n", p->width,
                p->height);
    fputs("set output ", f);
    kvr_gnuplot_str(f, p->out);
    fputc('\n', f);
    p->body(f, p->arg);
    fputs("set output\n", f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        snprintf(err, err_len, "cannot write the gnuplot script %s", script);
        unlink(script);
        return KVR_EIO;
    }
    return KVR_OK;
}

int kvr_gnuplot_draw(const kvr_gnuplot_t *p, char *err, size_t err_len)
{
    bool svg = ends_with(p->out, ".svg");
    if (!svg && !ends_with(p->out, ".png")) {
        snprintf(err, err_len, "%s: the plot's name must end in .png or .svg", p->out);
        return KVR_EINVAL;
    }
    if (!kvr_gnuplot_available()) {
        snprintf(err, err_len,
                 "--plot needs gnuplot, which is not installed (Debian: apt-get "
                 "install gnuplot-nox; scripts/install-deps.sh installs it)");
        return KVR_ENOTFOUND;
    }
    char script[4096];
    int rc = write_script(p, svg, script, sizeof script, err, err_len);
    if (rc != KVR_OK)
        return rc;
    char *argv[] = {"gnuplot", script, NULL};
    pid_t pid;
    rc = posix_spawnp(&pid, "gnuplot", NULL, NULL, argv, environ);
    int status = 0;
    if (rc == 0) {
        while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
            ;
    }
    unlink(script);
    if (rc != 0) {
        snprintf(err, err_len, "cannot run gnuplot: %s", strerror(rc));
        return KVR_EIO;
    }
    struct stat sb;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || stat(p->out, &sb) != 0 ||
        sb.st_size == 0) {
        snprintf(err, err_len, "gnuplot failed to write %s (exit status %d)", p->out,
                 WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return KVR_EIO;
    }
    return KVR_OK;
}
