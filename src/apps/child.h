/*
 * child.h: the processes the demo and the benchmarks start and stop: this binary (a mocker, a
 * router: it prints "listening HOST:PORT" once it serves), or another program (nats-server).
 * Each child runs in its own process group (a terminal's Ctrl-C reaches the parent only,
 * which then stops them in order) with PR_SET_PDEATHSIG, so none outlives a parent killed
 * outright; stdout is read for the "listening" line, stderr goes to a log file.
 * Threads: the caller's (one). Cost: a fork and exec per child.
 */
#ifndef KVR_APPS_CHILD_H
#define KVR_APPS_CHILD_H

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct kvr_child {
    pid_t pid;
    int out_fd;
    char what[64];
    char log[PATH_MAX];
    char addr[128]; /* from "listening HOST:PORT" */
} kvr_child_t;

/* "This binary" below: the kvrouter binary. By default the running one (/proc/self/exe);
 * kvrouter-bench sets the kvrouter beside it. exe is copied. */
void kvr_child_set_self(const char *exe);
const char *kvr_child_self(void);
/* A flag (set by the caller's signal handler) that cuts the waits short. */
void kvr_child_stop_flag(volatile sig_atomic_t *flag);
/* Starts exe (NULL: this binary) with argv, stderr into log; for this binary, waits (30 s at
 * most) for its "listening HOST:PORT" line (addr). KVR_OK or KVR_EIO with err. */
int kvr_child_spawn(kvr_child_t *c, const char *exe, const char *what, char *const argv[],
                    const char *log, char *err, size_t err_len);
/* kvr_child_spawn of this binary. */
int kvr_child_start(kvr_child_t *c, const char *what, char *const argv[], const char *log,
                    char *err, size_t err_len);
/* SIGTERM, then SIGKILL after 10 s: the exit status as waitpid gives it (-1 when killed). */
int kvr_child_stop(kvr_child_t *c);
/* Polls the child's GET /ready (this binary's router) until 200: KVR_OK, or KVR_EIO after
 * timeout_s. */
int kvr_child_wait_ready(const kvr_child_t *c, double timeout_s);
/* The last lines of its log on stderr. */
void kvr_child_show_log(const kvr_child_t *c);
/* CLOCK_MONOTONIC seconds. */
double kvr_child_now_s(void);
/* A free loopback TCP port (bound then released), -1 on failure. */
int kvr_free_port(void);
/* A fresh directory $TMPDIR/kvrouter-<name>-XXXXXX (/tmp without TMPDIR) for the logs and
 * stores of a run: KVR_OK, or KVR_EIO with err. */
int kvr_child_workdir(char *dir, size_t cap, const char *name, char *err, size_t err_len);
/* Removes dir and everything under it (links not followed): 0, or -1. */
int kvr_child_rmtree(const char *dir);
/* GET path on the child (addr): the body (malloc'd, NUL-terminated; NULL when no answer) and
 * the status. */
char *kvr_child_get(const kvr_child_t *c, const char *path, int *status);
/* The value of the first /metrics line of the child that starts with sample (a name, or
 * name{labels}); NAN when absent. */
double kvr_child_metric(const kvr_child_t *c, const char *sample);
/* Debian's nats-server on a free loopback port, JetStream on, its store under dir; url set
 * (nats://127.0.0.1:PORT) once it accepts connections. KVR_ENOTFOUND when not installed. */
int kvr_nats_server_start(kvr_child_t *c, const char *dir, char *url, size_t cap, char *err,
                          size_t err_len);

#endif
