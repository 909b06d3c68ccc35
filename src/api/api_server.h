/*
 * api_server.h: the router's HTTP API on libevent (evhttp), served from one event-loop thread
 * (the "HTTP thread"), which owns the router (load tracker, selector, registry) and reads the
 * prefix index. Endpoints (JSON; errors in the OpenAI shape):
 *   POST /v1/route, POST /v1/requests/{id}/first_token, POST /v1/requests/{id}/output_block,
 *   DELETE /v1/requests/{id}, POST /v1/query, POST /v1/loads, GET|POST /v1/workers,
 *   DELETE /v1/workers/{id}, GET /v1/dump, GET /health, GET /ready, GET /metrics,
 *   POST /router (the reference's tagged requests).
 * It also probes workers' /health, fences the failing ones (dropping their index state) and
 * readmits them, queues requests while every eligible worker is busy, and answers 429 past the
 * queue's limits and 503 when no worker can serve. Other paths go to an extension (the OpenAI
 * front end, frontend/frontend.h), which shares the router, the queue and the fencing.
 */
#ifndef KVR_API_SERVER_H
#define KVR_API_SERVER_H

#include <stdbool.h>
#include <stdint.h>

#include "kvrouter/config.h"
#include "kvrouter/router.h"
#include "kvrouter/sched.h"
#include "events/ingest.h"

struct event_base;
typedef struct kvr_api_server kvr_api_server_t;

/* base: the HTTP thread's loop; sched: the scheduler over the router (borrowed; both outlive
 * the server); g: the ingest thread (NULL without KV events).
 * Listens on cfg->bind:cfg->http_port (port 0 picks a free one: see kvr_api_server_port), and
 * on admin_bind:admin_port when set; connection limits: http/http_guard.h; who may call what:
 * http/access.h. */
kvr_api_server_t *kvr_api_server_new(struct event_base *base, kvr_sched_t *sched,
                                     kvr_ingest_t *g, const kvr_router_config_t *cfg,
                                     int *status, char *err, size_t err_len);
void kvr_api_server_free(kvr_api_server_t *s);
uint16_t kvr_api_server_port(const kvr_api_server_t *s);
/* The admin listener's port; 0 when admin_port is unset (fleet changes on the client port). */
uint16_t kvr_api_server_admin_port(const kvr_api_server_t *s);
/* Graceful shutdown: both listeners close, idle connections too, busy ones once answered. */
void kvr_api_server_drain(kvr_api_server_t *s);
/* Client connections with a request being answered (streams included). */
uint64_t kvr_api_server_busy(const kvr_api_server_t *s);
/* Where the index came from at start ("cold", "state_file ...", "peer URL ..."): shown as
 * index_origin in GET /v1/workers and a line of /health. Copied. */
void kvr_api_server_set_index_origin(kvr_api_server_t *s, const char *origin);
/* The router it serves. */
kvr_router_t *kvr_api_server_router(const kvr_api_server_t *s);
/* Removes a worker everywhere (router, its bookings, event subscription, probe); the
 * extensions are told. KVR_OK or KVR_ENOWORKER. */
int kvr_api_server_remove_worker(kvr_api_server_t *s, uint64_t worker_id);
/* Registers a worker everywhere (router, event subscription, health probe). */
int kvr_api_server_add_worker(kvr_api_server_t *s, const kvr_worker_spec_t *w, char *err,
                              size_t err_len);

/* ---------------------------------------------------------------------------------------- */
/* What the OpenAI front end (frontend/frontend.h) plugs into: the same loop and fencing (it
 * places requests through the same scheduler). Everything here runs on the HTTP thread. */

struct evhttp_request;
struct kvr_prom;

/* An extension answers the paths the API does not serve itself (handle returns false to let
 * the API answer 404) and appends its families to GET /metrics. */
typedef struct kvr_api_extension {
    bool (*handle)(void *arg, struct evhttp_request *req, const char *path, bool get, bool post);
    void (*metrics)(void *arg, struct kvr_prom *p);
    /* a worker was removed (its bookings went with it); may be NULL */
    void (*worker_removed)(void *arg, uint64_t worker_id);
    /* a state worth showing (e.g. "nats" = "disconnected"): a line of /health's body and a
     * member of GET /v1/workers; may be NULL, or return false for none */
    bool (*detail)(void *arg, const char **key, const char **value);
    /* false while the extension keeps /ready at 503 (why says for what); may be NULL */
    bool (*ready)(void *arg, const char **why);
    void *arg;
} kvr_api_extension_t;
/* Answers req (an extension's) with the API's headers and counters. */
void kvr_api_server_reply(kvr_api_server_t *s, struct evhttp_request *req, int code,
                          const char *ctype, const char *data, size_t len);

#define KVR_API_MAX_EXTENSIONS 8
/* Adds one (KVR_EFULL past KVR_API_MAX_EXTENSIONS); asked in the order added. */
int kvr_api_server_add_extension(kvr_api_server_t *s, const kvr_api_extension_t *ext);
/* Removes the one added with this arg. */
void kvr_api_server_remove_extension(kvr_api_server_t *s, void *arg);

/* Fences a worker as failed health checks do (never picked, index state dropped); the
 * health probe readmits it once its /health answers 200. why is logged. */
void kvr_api_server_fence(kvr_api_server_t *s, uint64_t worker_id, const char *why);
/* Evidence that a worker may be gone (a request could not connect, or its events connection
 * was lost): its /health is probed at once, and if that fails too it is fenced without
 * waiting for health_failures periodic probes. why is logged with the fence. */
void kvr_api_server_suspect(kvr_api_server_t *s, uint64_t worker_id, const char *why);
/* A queued placement that ran out of time (kvr_sched_done_fn with res NULL): the HTTP status
 * and a message naming the setting (429 for router_queue_timeout_ms; 503 for
 * min_initial_workers_wait_ms, with the ready count). Both front doors answer with these. */
int kvr_api_wait_failed(const kvr_router_t *r, int rc, char *msg, size_t msg_len);

#endif
