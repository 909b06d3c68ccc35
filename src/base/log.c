/*
 * log.c: see log.h. Writes whole lines with one fputs under a mutex, so lines from the ingest
 * and HTTP threads never interleave.
 */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
/* changed at run time (POST /v1/log-level) while other threads log: relaxed is enough, a line
 * logged or dropped around the change is either way right */
static atomic_int min_level = KVR_LOG_INFO;
static const char *const LEVEL_NAMES[] = {"debug", "info", "warn", "error"};

void kvr_log_set_level(kvr_log_level_t level)
{
    atomic_store_explicit(&min_level, (int)level, memory_order_relaxed);
}

kvr_log_level_t kvr_log_get_level(void)
{
    return (kvr_log_level_t)atomic_load_explicit(&min_level, memory_order_relaxed);
}

bool kvr_log_enabled(kvr_log_level_t level) { return (int)level >= (int)kvr_log_get_level(); }

const char *kvr_log_level_name(kvr_log_level_t level)
{
    return (unsigned)level < 4 ? LEVEL_NAMES[level] : "?";
}

int kvr_log_level_parse(const char *name, kvr_log_level_t *out)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(name, LEVEL_NAMES[i]) == 0) {
            *out = (kvr_log_level_t)i;
            return 0;
        }
    return -1;
}

static void vlog(kvr_log_level_t level, const char *suffix, const char *fmt, va_list ap)
{
    const char *const *names = LEVEL_NAMES;
    char line[1024];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, names[level]);
    if (n < 0)
        return;
    int m = vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    size_t len = (size_t)n + (m > 0 ? (size_t)m : 0);
    if (len >= sizeof line - 80)
        len = sizeof line - 80;
    snprintf(line + len, sizeof line - len, "%s\n", suffix);
    pthread_mutex_lock(&log_mu);
    fputs(line, stderr);
    pthread_mutex_unlock(&log_mu);
}

void kvr_log(kvr_log_level_t level, const char *fmt, ...)
{
    if (!kvr_log_enabled(level))
        return;
    va_list ap;
    va_start(ap, fmt);
    vlog(level, "", fmt, ap);
    va_end(ap);
}

void kvr_log_limited(kvr_ratelimit_t *rl, kvr_log_level_t level, const char *fmt, ...)
{
    if (!kvr_log_enabled(level))
        return;
    uint64_t now = kvr_now_ms();
    if (now - rl->window_start_ms >= rl->interval_ms || rl->window_start_ms == 0) {
        rl->window_start_ms = now;
        rl->in_window = 0;
    }
    if (rl->in_window >= rl->burst) {
        rl->suppressed++;
        return;
    }
    rl->in_window++;
    char suffix[64] = "";
    if (rl->suppressed > 0) {
        snprintf(suffix, sizeof suffix, " (%llu similar suppressed)",
                 (unsigned long long)rl->suppressed);
        rl->suppressed = 0;
    }
    va_list ap;
    va_start(ap, fmt);
    vlog(level, suffix, fmt, ap);
    va_end(ap);
}
