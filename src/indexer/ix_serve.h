/*
 * ix_serve.h: `serve --serve-indexer`: the router's own index behind the indexer API
 * (indexer/ix_api.h) on the router's HTTP port, as an API-server extension: POST /query and POST
 * /query_by_hash (client class), GET /dump (admin class).
 *
 * Partitions: a router has one index for all its workers, so a partition is a model: a query
 * naming model_name M counts the workers of M and those that declare no model; when no worker
 * declares a model, any model_name is the router's one partition. routing_group must be
 * "default" (a router has no routing groups). The block size and Eagle setting are the
 * model's workers' (else the router's). The dump has one entry per model ("<model>:default",
 * "default:default" for workers without one).
 * Approximate mode (use_kv_events false): the index holds the router's own decisions, and
 * POST /record_routing_decision adds other routers' (those with remote_indexer), with the
 * same TTL and size bound; a router fed by KV events refuses them (409).
 * Threads: the HTTP thread. Ownership: borrows the API server, router, index and ingest.
 */
#ifndef KVR_NET_IX_SERVE_H
#define KVR_NET_IX_SERVE_H

#include "kvrouter.h"
#include "fleet/fleet.h"
#include "http/http.h"
#include "events/ingest.h"

typedef struct kvr_ix_serve kvr_ix_serve_t;

/* Adds itself to the API server's extensions; NULL with *status on failure. */
kvr_ix_serve_t *kvr_ix_serve_new(kvr_http_host_t *host, kvr_fleet_t *fleet, kvr_index_t *ix, kvr_ingest_t *g,
                                 int *status);
void kvr_ix_serve_free(kvr_ix_serve_t *s);
/* Also answers on NATS: requests on <ns>.indexer.query (a /query or, with a "block_hashes"
 * member, a /query_by_hash JSON body) answered on their reply subject with the same JSON
 * (`serve --remote-indexer nats` asks so); in approximate mode also messages on
 * <ns>.indexer.record (a routing decision's JSON body, no reply). Free the link after the
 * server. */
struct kvr_nats;
int kvr_ix_serve_attach_nats(kvr_ix_serve_t *s, struct kvr_nats *nats, const char *ns);

#endif
