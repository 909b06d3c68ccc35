/*
 * access.h: who may call what. The router's HTTP endpoints fall in three classes:
 *   open   GET /health, GET /ready: probes; never need a token;
 *   client the OpenAI front end, /v1/route and the request lifecycle, /v1/query, /v1/loads,
 *          POST /router, the indexer API's POST /query and /query_by_hash (serve_indexer);
 *   read   GET /v1/workers, GET /metrics, GET /v1/routers, GET /v1/stats, GET /ui: client
 *          calls served on both listeners; besides a bearer token they take HTTP Basic
 *          credentials whose password is the key (any user name), which a browser sends for
 *          the page once challenged;
 *   admin  fleet changes: POST /v1/workers, DELETE /v1/workers/ID; index copies: GET /v1/dump,
 *          GET /dump; index writes: POST /record_routing_decision; run-time settings: POST
 *          /busy_threshold, POST /v1/log-level;
 *   peer   GET /v1/index/snapshot (a joining replica): an admin call that also takes the peer
 *          key (peer_key_file), so that replicas never need to hold or send the admin key.
 * With an admin listener (admin_port), admin calls are served there only and client calls on
 * the client port only (open and read calls on both): anything else is
 * 404 naming the right listener. Tokens (Authorization: Bearer): with api_key_file, client
 * and read calls need the api key or the admin key; with admin_key_file, admin calls need the admin
 * key; with only an api key, admin calls need it. Keys are compared in constant time.
 * Threads: the HTTP thread (read-only after init). Cost: O(key length) per request.
 */
#ifndef KVR_ACCESS_H
#define KVR_ACCESS_H

#include <stdbool.h>
#include <stddef.h>

#include "kvrouter/config.h"
#include "base/secret.h"

typedef enum kvr_access_class {
    KVR_ACCESS_OPEN,
    KVR_ACCESS_CLIENT,
    KVR_ACCESS_READ,
    KVR_ACCESS_ADMIN,
    KVR_ACCESS_PEER,
} kvr_access_class_t;

typedef struct kvr_access {
    char api_key[KVR_SECRET_MAX];
    char admin_key[KVR_SECRET_MAX];
    char peer_key[KVR_SECRET_MAX]; /* peer_key_file's; "" = peer calls are admin calls */
    bool admin_listener; /* admin_port is set */
} kvr_access_t;

/* The class of a call (method as GET/POST/DELETE flags, path without the query). */
kvr_access_class_t kvr_access_class(const char *path, bool get, bool post, bool del);

/* Reads the key files cfg names. KVR_OK, or the error of kvr_secret_read (field named). */
int kvr_access_init(kvr_access_t *a, const kvr_router_config_t *cfg, char *err, size_t err_len);

/* The verdict on one call: 0 = allowed; 404 (wrong listener) or 401 (token missing or wrong),
 * with msg saying why. authorization: the header's value or NULL. */
int kvr_access_check(const kvr_access_t *a, kvr_access_class_t cls, bool on_admin_listener,
                     const char *authorization, char *msg, size_t cap);

#endif
