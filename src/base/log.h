/*
 * log.h: one-line logs on stderr with a timestamp and level, and a rate limiter so a storm of
 * the same problem (a worker sending bad batches at 1 kHz) costs one line per interval plus a
 * count of what was suppressed. Thread-safe (one mutex around the write).
 */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/clock.h"

typedef enum kvr_log_level { KVR_LOG_DEBUG = 0, KVR_LOG_INFO, KVR_LOG_WARN, KVR_LOG_ERROR } kvr_log_level_t;

/* The level below which lines are dropped; it may change while other threads log. */
void kvr_log_set_level(kvr_log_level_t level);
kvr_log_level_t kvr_log_get_level(void);
bool kvr_log_enabled(kvr_log_level_t level);
/* "debug", "info", "warn", "error"; parse: 0, or -1 for another name. */
const char *kvr_log_level_name(kvr_log_level_t level);
int kvr_log_level_parse(const char *name, kvr_log_level_t *out);
void kvr_log(kvr_log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* A limiter: at most `burst` lines per `interval_ms`; the next line allowed after a quiet
 * spell says how many were suppressed. One per kind of problem, owned by its caller. */
typedef struct kvr_ratelimit {
    uint64_t interval_ms;
    uint32_t burst;
    uint64_t window_start_ms;
    uint32_t in_window;
    uint64_t suppressed;
} kvr_ratelimit_t;

#define KVR_RATELIMIT_INIT(ms, n) {(ms), (n), 0, 0, 0}

void kvr_log_limited(kvr_ratelimit_t *rl, kvr_log_level_t level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* kvr_now_ms lives in base/clock.h (included here for the callers that found it here). */

#endif
