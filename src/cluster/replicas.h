/*
 * replicas.h: this router among its peers. Each router keeps a presence entry in the NATS
 * bucket <ns>_routers (key = its router id as 16 hex digits, value = a small JSON object with
 * its url), refreshed every third of nats_presence_ttl_ms, and watches the bucket. A peer is
 * live while its entry (or its sync traffic) was seen within the TTL; it is gone when its entry
 * is deleted (a clean stop) or not refreshed for the TTL while this router is connected (a
 * crash). Listeners are told when a peer goes, so its requests can be freed.
 *
 * It also serves what the NATS side shows: GET /v1/routers (self and peers, their state and
 * sync lag), the nats_* families of /metrics, and the "nats" detail of /health and
 * /v1/workers.
 *
 * A router is listed once it serves (kvr_replicas_announce, after its index is loaded), so a
 * joining replica only ever asks routers that can answer.
 *
 * Ownership: borrows the link and the API server (both outlive it); owns the peer table.
 * Threads: the event loop only (the link delivers there). Cost: a bucket entry or a sync
 * report is O(peers) (a table of at most KVR_MAX_PEERS, scanned); the check runs every 250 ms.
 */
#ifndef KVR_NET_REPLICAS_H
#define KVR_NET_REPLICAS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fleet/fleet.h"
#include "http/http.h"
#include "nats/nats_link.h"

#define KVR_MAX_PEERS 256

typedef struct kvr_replicas kvr_replicas_t;

typedef struct kvr_replicas_config {
    struct event_base *base;
    kvr_nats_t *nats;
    kvr_http_host_t *host; /* its service: metrics, ... */
    const char *ns;      /* namespace */
    uint64_t ttl_ms;     /* nats_presence_ttl_ms */
    const char *url;     /* this router's HTTP url, published in its entry */
    const char *admin_url; /* its admin listener's, when it has one (else NULL) */
    bool replica_sync;   /* published too (peers show it) */
} kvr_replicas_config_t;

/* NULL with *status (KVR_ENOMEM; KVR_EIO when the system's random source fails). */
kvr_replicas_t *kvr_replicas_new(const kvr_replicas_config_t *cfg, int *status);
/* Writes this router's presence entry (and keeps it refreshed): called once the router serves,
 * so that a replica starting at the same time never asks it for an index it cannot send yet.
 * KVR_OK or the link's status. */
int kvr_replicas_announce(kvr_replicas_t *r);
/* Deletes this router's entry (the link does it before closing). */
void kvr_replicas_free(kvr_replicas_t *r);
/* This router's id: random, never 0. */
uint64_t kvr_replicas_self(const kvr_replicas_t *r);

/* A peer went away (entry deleted, or silent for the TTL): its requests can be freed. */
typedef void (*kvr_peer_gone_fn)(void *arg, uint64_t router_id, const char *why);
void kvr_replicas_on_gone(kvr_replicas_t *r, kvr_peer_gone_fn fn, void *arg);
/* Replica sync saw a batch from a peer: it is alive; lag_us = publish to apply. */
void kvr_replicas_seen(kvr_replicas_t *r, uint64_t router_id, uint64_t lag_us,
                       uint64_t lost_batches);
/* Live peers (not counting this router). */
size_t kvr_replicas_live(const kvr_replicas_t *r);
/* Live peers seen for at least ms (a peer that appeared more recently may be joining too). */
size_t kvr_replicas_live_for(const kvr_replicas_t *r, uint64_t ms);
/* Whether the link has been connected without a break for at least the TTL (a peer's
 * silence then means it is gone, not that this router is cut off). */
bool kvr_replicas_settled(const kvr_replicas_t *r);
/* When the link last connected (kvr_now_ms), 0 while it is not. */
uint64_t kvr_replicas_connected_since(const kvr_replicas_t *r);

/* A peer url read from the bucket was not asked (its host is not allowed): counted. */
void kvr_replicas_count_refused_url(kvr_replicas_t *r);

/* A presence entry as routers write it. */
typedef struct kvr_replica_entry {
    char url[256], admin_url[256]; /* admin_url "" when the router has no admin listener */
    bool replica_sync;
} kvr_replica_entry_t;
/* Reads an entry's value (a JSON object; other members ignored): false unless it scans and
 * has a url. */
bool kvr_replicas_read_entry(const void *val, size_t len, kvr_replica_entry_t *out);

#endif
