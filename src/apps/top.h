/*
 * top.h: the parts of `kvrouter top` (docs/operations.md), one job a file:
 *   cmd_top.c     the command line, the terminal (alternate screen, keys, signals), the loops;
 *   top_model.c   one refresh: GET /v1/workers, /v1/stats?since=T and /v1/routers with the
 *                 blocking client (http/client.h), answers decoded with yajl's tree into the
 *                 model below (the fleet's ranks, the last TOP_HIST points, the replicas);
 *   top_render.c  the model drawn as one frame of text, clipped to the terminal.
 * Invariants: every string the model holds came through sanitize() (printable ASCII: a router
 * cannot send escapes to the operator's terminal); history points are in increasing `t`.
 * Ownership: a top_t owns its ranks and its response buffer (top_model_free). Threads: the
 * command's only.
 */
#ifndef KVR_APPS_TOP_H
#define KVR_APPS_TOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "http/http.h"

#define TOP_HIST 60                    /* points kept: the sparklines' span */
#define TOP_MAX_BODY ((size_t)8 << 20) /* of one answer (600 points, a large fleet) */
#define TOP_MAX_RANKS ((size_t)1 << 20)
#define TOP_STR 64 /* a state word, a role, a model name, a worker id (clipped) */
#define TOP_WHY 200

typedef struct top_args {
    const char *url;
    const char *key_file; /* NULL: no key */
    uint32_t interval_ms;
    bool once;
} top_args_t;

/* ---- the model: what the router answered ---- */

/* One point of /v1/stats: its figures by index, NAN for null or absent. */
enum {
    P_T,
    P_DECISIONS,
    P_REFUSALS,
    P_IN_FLIGHT,
    P_QUEUE,
    P_HIT_PRED,
    P_HIT_REP,
    P_TTFT50,
    P_TTFT99,
    P_ITL50,
    P_ITL99,
    P_ERRORS,
    P_KV_EVENTS,
    P_GAPS,
    P_PEERS,
    P_LAG50,
    P_LAG99,
    P_N
};
typedef struct top_point {
    double v[P_N];
} top_point_t;

typedef struct top_rank {
    char worker[TOP_STR], state[TOP_STR], role[TOP_STR], model[TOP_STR], why[TOP_WHY];
    double dp_rank, active, prefill_tokens, blocks, capacity, indexed, prompt_tokens, predicted,
        reported, step_ms;
} top_rank_t;

typedef struct top_fleet {
    char mode[TOP_STR], policy[TOP_STR];
    size_t n_workers;
    top_rank_t *ranks;
    size_t n_ranks, cap_ranks;
} top_fleet_t;

typedef struct top_history {
    bool served; /* /v1/stats answered 200 at least once */
    char version[TOP_STR];
    double now_ms, started_ms;
    top_point_t pts[TOP_HIST]; /* oldest first */
    size_t n;
} top_history_t;

typedef enum top_routers_state { ROUTERS_ASK, ROUTERS_YES, ROUTERS_NO } top_routers_state_t;

typedef struct top_replicas {
    top_routers_state_t asked;
    char self[TOP_STR], nats[TOP_STR];
    size_t peers;
    double lag_max_ms; /* the largest sync_lag_ms of the peers; NAN: none */
} top_replicas_t;

/* Why the last refresh failed (the figures shown are then the last good ones). */
typedef struct top_problem {
    bool failed;
    int status; /* the HTTP status; 0: no answer */
    char path[32];
    char why[300];
} top_problem_t;

typedef struct top_link {
    kvr_http_target_t target; /* its bearer: --key-file's key, or "" */
    int timeout_ms;
    kvr_http_resp_t resp;
} top_link_t;

typedef struct top {
    top_args_t args;
    top_link_t link;
    top_fleet_t fleet;
    top_history_t hist;
    top_replicas_t reps;
    top_problem_t problem;
    time_t last_ok; /* wall time of the last good refresh; 0: none yet */
} top_t;

/* A frame being drawn: text clipped to width columns and rows lines. */
typedef struct top_out {
    char *buf;
    size_t len, cap;
    bool ansi, nomem;
    int width; /* columns a line may fill (0: no limit) */
    int rows;  /* lines the frame may hold (0: no limit) */
    int col;   /* columns used on the current line */
    int lines; /* lines begun */
    bool full; /* the frame holds `rows` lines: nothing more is shown */
} top_out_t;

/* ---- top_model.c ---- */
/* One refresh: workers, stats since the newest point held, routers when they answer. False
 * (t->problem says why) when the router could not be read. */
bool top_refresh(top_t *t);
/* Frees what the model holds (t itself is the caller's). */
void top_model_free(top_t *t);

/* ---- top_render.c ---- */
/* The whole frame of t into o (o->buf grows; the caller frees it). */
void top_render(top_out_t *o, const top_t *t);
/* "router unreachable ...", "router answered 401 ..." for the status line and --once. */
void top_problem_text(const top_t *t, char *out, size_t cap);

#endif
