/*
 * api.h: the router's JSON API, a service of the HTTP host (http/host.h) over the fleet
 * (fleet/fleet.h) and its scheduler. Endpoints (JSON; errors in the OpenAI shape):
 *   POST /v1/route, POST /v1/requests/{id}/first_token, POST /v1/requests/{id}/output_block,
 *   DELETE /v1/requests/{id}, POST /v1/query, POST /v1/loads, GET|POST /v1/workers,
 *   DELETE /v1/workers/{id}, GET /v1/dump, GET /v1/index/snapshot, GET /health, GET /ready,
 *   GET /metrics, POST /router (the reference's tagged requests).
 * A placement that has to wait is queued in the scheduler and answered when it leaves (429
 * past the queue's limits, 503 when no worker can serve). GET /metrics carries the router's,
 * the ingest thread's, the workers' and the host's families, then every other service's.
 * Ownership: borrows the host and the fleet (both outlive it). Threads: the HTTP thread.
 */
#ifndef KVR_API_API_H
#define KVR_API_API_H

#include <stddef.h>

#include "kvrouter/config.h"
#include "fleet/fleet.h"
#include "http/http.h"

typedef struct kvr_api kvr_api_t;

/* Adds itself to the host as its first service (add it before the others). NULL with *status
 * and err on failure. */
kvr_api_t *kvr_api_new(kvr_http_host_t *host, kvr_fleet_t *fleet,
                       const kvr_router_config_t *cfg, int *status, char *err, size_t err_len);
/* Removes itself from the host; queued requests are cancelled unanswered (free it before the
 * host, whose connections it still watches). */
void kvr_api_free(kvr_api_t *a);

#endif
