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
 * queue's limits and 503 when no worker can serve.
 */
#ifndef KVR_API_SERVER_H
#define KVR_API_SERVER_H

#include <stdint.h>

#include "core/config.h"
#include "core/router.h"
#include "net/ingest.h"

struct event_base;
typedef struct kvr_api_server kvr_api_server_t;

/* base: the HTTP thread's loop; r: the router; g: the ingest thread (NULL without KV events).
 * Binds cfg->bind:cfg->http_port (port 0 picks a free one: see kvr_api_server_port). */
kvr_api_server_t *kvr_api_server_new(struct event_base *base, kvr_router_t *r, kvr_ingest_t *g,
                                     const kvr_router_config_t *cfg, int *status, char *err,
                                     size_t err_len);
void kvr_api_server_free(kvr_api_server_t *s);
uint16_t kvr_api_server_port(const kvr_api_server_t *s);
/* Registers a worker everywhere (router, event subscription, health probe). */
int kvr_api_server_add_worker(kvr_api_server_t *s, const kvr_worker_spec_t *w, char *err,
                              size_t err_len);

#endif
