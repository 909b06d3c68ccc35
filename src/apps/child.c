/*
 * child.c: see child.h.
 * Invariants: a started child is in its own process group and is reaped by kvr_child_stop
 * (SIGTERM, then SIGKILL); its pid is <= 0 once it is not running. Waits poll with a
 * deadline and the stop flag, never block without one: nats-server's port by TCP connect
 * (http/client.h's kvr_http_probe), a router's /ready by http/http_fetch.h.
 * Ownership: the caller's kvr_child_t; the bodies kvr_child_get returns are the caller's.
 * Threads: the caller's (one). Cost: a fork and exec per child; a wait polls every 10-20 ms.
 */
#define _XOPEN_SOURCE 700
#include "apps/child.h"
#include "base/clock.h"

#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvrouter.h"
#include "http/http.h"

#define START_TIMEOUT_S 30.0
#define STOP_TIMEOUT_S 10.0

static volatile sig_atomic_t *g_stop;

void kvr_child_stop_flag(volatile sig_atomic_t *flag) { g_stop = flag; }


double kvr_child_now_s(void)
{
    return kvr_now_s();
}

/* The last lines of a child's log on stderr. */
void kvr_child_show_log(const kvr_child_t *c)
{
    FILE *f = fopen(c->log, "r");
    if (f == NULL)
        return;
    char buf[4096];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof buf - 1 ? size - (long)sizeof buf + 1 : 0, SEEK_SET);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    if (n > 0)
        fprintf(stderr, "--- %s (%s):\n%s%s", c->what, c->log, buf,
                buf[n - 1] == '\n' ? "" : "\n");
}

static char self_exe[PATH_MAX] = "/proc/self/exe";

void kvr_child_set_self(const char *exe)
{
    snprintf(self_exe, sizeof self_exe, "%s", exe);
}

const char *kvr_child_self(void)
{
    return self_exe;
}

/* Starts exe (NULL: this binary) with argv; for this binary, waits for its "listening
 * HOST:PORT" line. */
int kvr_child_spawn(kvr_child_t *c, const char *exe, const char *what, char *const argv[],
                       const char *log, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    c->pid = -1;
    c->out_fd = -1;
    snprintf(c->what, sizeof c->what, "%s", what);
    snprintf(c->log, sizeof c->log, "%s", log);
    int p[2];
    if (pipe(p) != 0) {
        snprintf(err, err_len, "%s: pipe: %s", what, strerror(errno));
        return KVR_EIO;
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        snprintf(err, err_len, "%s: fork: %s", what, strerror(errno));
        return KVR_EIO;
    }
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        int in = open("/dev/null", O_RDONLY);
        int lf = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (in < 0 || lf < 0)
            _exit(127);
        dup2(in, STDIN_FILENO);
        dup2(p[1], STDOUT_FILENO);
        dup2(lf, STDERR_FILENO);
        close(p[0]);
        execv(exe ? exe : kvr_child_self(), argv);
        dprintf(STDERR_FILENO, "exec %s: %s\n", exe ? exe : kvr_child_self(), strerror(errno));
        _exit(127);
    }
    close(p[1]);
    c->pid = pid;
    c->out_fd = p[0];
    if (exe != NULL)
        return KVR_OK; /* not ours: the caller checks that it serves */
    char line[256];
    size_t len = 0;
    double deadline = kvr_child_now_s() + START_TIMEOUT_S;
    while (len < sizeof line - 1 && !(g_stop != NULL && *g_stop)) {
        double left = deadline - kvr_child_now_s();
        if (left <= 0)
            break;
        struct pollfd pf = {c->out_fd, POLLIN, 0};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        ssize_t got = read(c->out_fd, line + len, 1);
        if (got <= 0)
            break;
        if (line[len] == '\n')
            break;
        len++;
    }
    line[len] = '\0';
    if (strncmp(line, "listening ", 10) != 0) {
        snprintf(err, err_len, "%s did not start%s", what,
                 (g_stop != NULL && *g_stop) ? " (interrupted)" : len ? "" : " (no 'listening' line)");
        return KVR_EIO;
    }
    snprintf(c->addr, sizeof c->addr, "%.120s", line + 10);
    return KVR_OK;
}

int kvr_child_start(kvr_child_t *c, const char *what, char *const argv[], const char *log,
                       char *err, size_t err_len)
{
    return kvr_child_spawn(c, NULL, what, argv, log, err, err_len);
}

/* SIGTERM, then SIGKILL after STOP_TIMEOUT_S. Returns the exit status as waitpid gives it
 * (-1 when it had to be killed). */
int kvr_child_stop(kvr_child_t *c)
{
    if (c->pid <= 0)
        return 0;
    kill(c->pid, SIGTERM);
    int status = 0;
    double deadline = kvr_child_now_s() + STOP_TIMEOUT_S;
    for (;;) {
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == c->pid)
            break;
        if (r < 0 && errno != EINTR) {
            status = 0;
            break;
        }
        if (kvr_child_now_s() > deadline) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &status, 0);
            status = -1;
            break;
        }
        usleep(10000);
    }
    if (c->out_fd >= 0)
        close(c->out_fd);
    c->out_fd = -1;
    c->pid = -1;
    return status;
}

/* A free loopback TCP port (bound then released: another process may take it first, which
 * a failed start then reports). */
int kvr_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof sa;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
        getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
        port = ntohs(sa.sin_port);
    close(fd);
    return port;
}


/* ---- nats-server, for router replicas ---------------------------------------------------- */

/* Debian's nats-server (scripts/install-deps.sh installs it) on a free port, JetStream on,
 * its store in dir; *url set once it accepts connections. */
int kvr_nats_server_start(kvr_child_t *c, const char *dir, char *url, size_t cap, char *err,
                      size_t err_len)
{
    static const char *const where[] = {"/usr/sbin/nats-server", "/usr/bin/nats-server",
                                        "/usr/local/bin/nats-server"};
    const char *exe = NULL;
    for (size_t i = 0; i < 3 && exe == NULL; i++)
        if (access(where[i], X_OK) == 0)
            exe = where[i];
    if (exe == NULL) {
        snprintf(err, err_len, "--routers needs nats-server (Debian: apt-get install "
                 "nats-server; make demo installs it)");
        return KVR_ENOTFOUND;
    }
    int port = kvr_free_port();
    char p[16], store[PATH_MAX], log[PATH_MAX];
    snprintf(p, sizeof p, "%d", port);
    snprintf(store, sizeof store, "%.2000s/nats", dir);
    snprintf(log, sizeof log, "%.2000s/nats-server.log", dir);
    char *argv[] = {"nats-server", "-a", "127.0.0.1", "-p", p, "-js", "-sd", store, NULL};
    int rc = kvr_child_spawn(c, exe, "nats-server", argv, log, err, err_len);
    if (rc != KVR_OK)
        return rc;
    snprintf(url, cap, "http://127.0.0.1:%d", port);
    kvr_http_target_t t;
    char why[300];
    double deadline = kvr_child_now_s() + START_TIMEOUT_S;
    rc = kvr_http_target_parse(url, &t, why, sizeof why);
    while (rc == KVR_OK && kvr_http_probe(&t, 1000, why, sizeof why) != KVR_OK) {
        if (kvr_child_now_s() > deadline || (g_stop != NULL && *g_stop)) {
            kvr_child_show_log(c);
            snprintf(err, err_len, "nats-server did not start: %s", why);
            return KVR_EIO;
        }
        usleep(20000);
    }
    snprintf(url, cap, "nats://127.0.0.1:%d", port);
    return rc;
}


int kvr_child_wait_ready(const kvr_child_t *c, double timeout_s)
{
    char url[160];
    snprintf(url, sizeof url, "http://%s", c->addr);
    double deadline = kvr_child_now_s() + timeout_s;
    int status = 0;
    while (status != 200 && kvr_child_now_s() < deadline && !(g_stop != NULL && *g_stop)) {
        kvr_http_fetch_t q = {.url = url, .path = "/ready", .timeout_ms = 2000,
                              .max_bytes = 4096};
        uint8_t *body = NULL;
        size_t len;
        char why[300];
        if (kvr_http_fetch(&q, &body, &len, &status, why, sizeof why) != KVR_OK)
            status = 0;
        free(body);
        if (status != 200)
            usleep(20000);
    }
    return status == 200 ? KVR_OK : KVR_EIO;
}

char *kvr_child_get(const kvr_child_t *c, const char *path, int *status)
{
    char url[160], err[300];
    snprintf(url, sizeof url, "http://%s", c->addr);
    kvr_http_fetch_t q = {
        .url = url, .path = path, .timeout_ms = 10000, .max_bytes = (size_t)64 << 20};
    uint8_t *body = NULL;
    size_t len = 0;
    *status = 0;
    if (kvr_http_fetch(&q, &body, &len, status, err, sizeof err) != KVR_OK)
        return NULL;
    char *s = realloc(body, len + 1);
    if (s == NULL) {
        free(body);
        return NULL;
    }
    s[len] = '\0';
    return s;
}

/* The value of the first /metrics line that starts with sample (a name, or name{labels}). */
double kvr_child_metric(const kvr_child_t *c, const char *sample)
{
    int st;
    char *m = kvr_child_get(c, "/metrics", &st);
    double v = NAN;
    size_t n = strlen(sample);
    for (char *line = m; line != NULL && *line;) {
        char *end = strchr(line, '\n');
        if (strncmp(line, sample, n) == 0 && line[n] == ' ') {
            v = strtod(line + n + 1, NULL);
            break;
        }
        line = end ? end + 1 : NULL;
    }
    free(m);
    return v;
}

int kvr_child_workdir(char *dir, size_t cap, const char *name, char *err, size_t err_len)
{
    const char *tmp = getenv("TMPDIR");
    int n = snprintf(dir, cap, "%s/kvrouter-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", name);
    if (n < 0 || (size_t)n >= cap || mkdtemp(dir) == NULL) {
        snprintf(err, err_len, "cannot make a temporary directory: %s",
                 n < 0 || (size_t)n >= cap ? "path too long" : strerror(errno));
        return KVR_EIO;
    }
    return KVR_OK;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

int kvr_child_rmtree(const char *dir) { return nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
