/*
 * host.h: the HTTP side of `kvrouter serve`: its listeners (the client port, and the admin
 * port when set), each under a connection guard (http_guard.h), who may call what (access.h),
 * and the services that answer. A request is checked for access (401 / 404 here), then offered
 * to the services in the order they were added; the first whose handle returns true answered
 * it; none did: 404 naming the method and path.
 * The host also keeps the reply context its services share (reply.h: the router API's error
 * shape; every reply through it is counted in kvr_http_errors_total) and gathers what the
 * services add to GET /metrics, /health and /ready.
 * Ownership: the host owns its listeners and guards; services are borrowed (removed before
 * they go). Threads: the loop's thread only. Cost: a dispatch is an access check and one
 * handle call per service until one answers.
 */
#ifndef KVR_HTTP_HOST_H
#define KVR_HTTP_HOST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/config.h"
#include "http/reply.h"

struct event_base;
struct evhttp_request;
struct kvr_prom;
typedef struct kvr_http_host kvr_http_host_t;

typedef struct kvr_http_service {
    /* answers req (true), or leaves it to the next service (false); get / post: its method
     * (DELETE: neither; evhttp_request_get_command tells); may be NULL */
    bool (*handle)(void *arg, struct evhttp_request *req, const char *path, bool get, bool post);
    /* appends its families to GET /metrics; may be NULL */
    void (*metrics)(void *arg, struct kvr_prom *p);
    /* a state worth showing (e.g. "nats" = "disconnected"): a line of /health and a member of
     * GET /v1/workers; may be NULL, or return false for none */
    bool (*detail)(void *arg, const char **key, const char **value);
    /* false while the service keeps /ready at 503 (why says for what); may be NULL */
    bool (*ready)(void *arg, const char **why);
    void *arg;
} kvr_http_service_t;

/* Listens on cfg->bind:http_port (0: a free port, see kvr_http_host_port) and on
 * admin_bind:admin_port when set. NULL with *status (KVR_EIO: a port could not be bound,
 * err naming the setting) on failure. */
kvr_http_host_t *kvr_http_host_new(struct event_base *base, const kvr_router_config_t *cfg,
                                   int *status, char *err, size_t err_len);
void kvr_http_host_free(kvr_http_host_t *h);
uint16_t kvr_http_host_port(const kvr_http_host_t *h);
/* 0 when admin_port is unset. */
uint16_t kvr_http_host_admin_port(const kvr_http_host_t *h);
/* Graceful shutdown: both listeners close, idle connections too, busy ones once answered. */
void kvr_http_host_drain(kvr_http_host_t *h);
/* Client connections with a request being answered (streams included). */
uint64_t kvr_http_host_busy(const kvr_http_host_t *h);

#define KVR_HTTP_MAX_SERVICES 12
/* Adds one (KVR_EFULL past KVR_HTTP_MAX_SERVICES); asked in the order added. */
int kvr_http_host_add_service(kvr_http_host_t *h, const kvr_http_service_t *svc);
/* Removes the one added with this arg. */
void kvr_http_host_remove_service(kvr_http_host_t *h, void *arg);

/* Checks host.c's invariants (at most two listeners, services within bounds and distinct by
 * arg, each guard's own): KVR_OK, or KVR_EINVAL with msg. Asserted in debug builds. */
int kvr_http_host_verify(const kvr_http_host_t *h, char *msg, size_t msg_len);

/* The shared reply context (its writer is free between replies on this thread). */
kvr_reply_t *kvr_http_host_reply(kvr_http_host_t *h);
/* The host's families (errors, 401s, the guards'), then each service's. */
void kvr_http_host_metrics(kvr_http_host_t *h, struct kvr_prom *p);
void kvr_http_host_services_metrics(kvr_http_host_t *h, struct kvr_prom *p);
/* The whole exposition: the host's families, then each service's (GET /metrics). */
void kvr_http_host_exposition(kvr_http_host_t *h, struct kvr_prom *p);
/* Calls fn for each service's detail. */
void kvr_http_host_details(const kvr_http_host_t *h,
                           void (*fn)(void *arg, const char *key, const char *value), void *arg);
/* false (with why) while a service keeps /ready at 503. */
bool kvr_http_host_ready(const kvr_http_host_t *h, const char **why);

#endif
