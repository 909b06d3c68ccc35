/*
 * replicas.c: see replicas.h.
 *
 * Invariants:
 *   - the table holds each peer id at most once (never this router's own); a slot is live
 *     (present) or free; a peer that went is removed, and comes back as new if it returns;
 *   - a peer is declared gone once per disappearance: DELETE_GRACE (2/3 of ttl_ms) after its
 *     entry's delete unless it is heard from meanwhile (anyone can publish a delete: a peer
 *     that still refreshes its entry, every third of ttl_ms, or publishes a batch is restored,
 *     counted), or by silence (no entry refresh and no sync batch for ttl_ms); both judged
 *     only while settled (connected without a break for at least ttl_ms), so a router cut
 *     off from NATS never frees the requests of peers it merely cannot hear;
 *   - the table is full only of peers that wrote a presence entry: a router known from sync
 *     batches alone (never an entry, as a forger's ids) gives its slot to a newcomer with an
 *     entry, the one heard from least recently first.
 */
#include "cluster/replicas.h"
#include "base/clock.h"

#include <event2/event.h>
#include <event2/http.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "kvrouter.h"
#include "base/log.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/prom.h"

#define CHECK_MS 250
#define URL_BYTES 256

typedef struct peer {
    uint64_t id;
    char url[URL_BYTES];
    bool used, replica_sync;
    uint64_t first_ms, last_entry_ms, last_sync_ms;
    uint64_t deleted_ms; /* its entry's delete was seen (0 = not): gone after the grace */
    uint64_t batches, lost_batches, lag_last_us, lag_max_us;
} peer_t;

struct kvr_replicas {
    kvr_replicas_config_t cfg;
    char ns[65], bucket[80], key[17], url[URL_BYTES], admin_url[URL_BYTES]; /* copies: the
                                          entry is written after the caller's strings are gone */
    uint64_t self, started_unix_ms;
    peer_t peers[KVR_MAX_PEERS];
    struct event *check;
    kvr_peer_gone_fn gone_fn;
    void *gone_arg;
    uint64_t connected_since_ms; /* 0 = not connected */
    bool caught_up;
    kvr_json_writer_t w;
    /* counters */
    uint64_t joined, gone_deleted, gone_silent, bad_entries, table_full, peer_urls_refused;
    uint64_t restored, evicted;
    kvr_ratelimit_t rl;
};

static const char *STATE_KEY = "nats";

static peer_t *find(kvr_replicas_t *r, uint64_t id)
{
    for (size_t i = 0; i < KVR_MAX_PEERS; i++)
        if (r->peers[i].used && r->peers[i].id == id)
            return &r->peers[i];
    return NULL;
}

/* The slot a router known from sync batches alone (no entry ever) holds, heard from least
 * recently; NULL when every peer wrote an entry. */
static peer_t *entryless_victim(kvr_replicas_t *r)
{
    peer_t *v = NULL;
    for (size_t i = 0; i < KVR_MAX_PEERS; i++) {
        peer_t *p = &r->peers[i];
        if (p->used && p->last_entry_ms == 0 && (v == NULL || p->last_sync_ms < v->last_sync_ms))
            v = p;
    }
    return v;
}

static void gone(kvr_replicas_t *r, peer_t *p, const char *why);

/* id's slot, added when new; with_entry: the newcomer wrote a presence entry, and may take
 * the slot of an entry-less one when the table is full. */
static peer_t *find_or_add(kvr_replicas_t *r, uint64_t id, uint64_t now, bool with_entry)
{
    peer_t *p = find(r, id);
    if (p != NULL)
        return p;
    for (size_t i = 0; p == NULL && i < KVR_MAX_PEERS; i++)
        if (!r->peers[i].used)
            p = &r->peers[i];
    if (p == NULL && with_entry && (p = entryless_victim(r)) != NULL) {
        r->evicted++;
        gone(r, p, "evicted: the peer table is full and it never wrote a presence entry");
    }
    if (p == NULL) {
        r->table_full++;
        kvr_log_limited(&r->rl, KVR_LOG_WARN, "replicas: more than %d peers; router %016llx "
                        "ignored", KVR_MAX_PEERS, (unsigned long long)id);
        return NULL;
    }
    *p = (peer_t){.id = id, .used = true, .first_ms = now};
    r->joined++;
    kvr_log(KVR_LOG_INFO, "replicas: router %016llx joined", (unsigned long long)id);
    return p;
}

/* A peer whose entry was deleted is heard from again: the delete was not its own. */
static void heard_after_delete(kvr_replicas_t *r, peer_t *p, const char *how)
{
    if (p->deleted_ms == 0)
        return;
    p->deleted_ms = 0;
    r->restored++;
    kvr_log_limited(&r->rl, KVR_LOG_WARN, "replicas: router %016llx's presence entry was "
                    "deleted, but it still %s: kept (a forged delete?)",
                    (unsigned long long)p->id, how);
}

static void gone(kvr_replicas_t *r, peer_t *p, const char *why)
{
    uint64_t id = p->id;
    kvr_log(KVR_LOG_INFO, "replicas: router %016llx is gone (%s)", (unsigned long long)id, why);
    *p = (peer_t){0};
    if (r->gone_fn != NULL)
        r->gone_fn(r->gone_arg, id, why);
}

/* ---- the bucket ---- */

/* "0123456789abcdef" -> id; false unless exactly 16 hex digits and not 0. */
static bool parse_id(const char *key, uint64_t *id)
{
    if (strlen(key) != 16)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < 16; i++) {
        char c = key[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *id = v;
    return v != 0;
}

/* A JSON string member's value copied into out (cap bytes): false when it is not a plain
 * string (escapes are not expected in a url) or does not fit. */
static bool copy_plain_string(const char *b, const kvr_json_member_t *m, char *out, size_t cap)
{
    size_t vl = m->val_end - m->val;
    if (b[m->val] != '"' || vl < 2 || vl - 2 >= cap || memchr(b + m->val + 1, '\\', vl - 2))
        return false;
    memcpy(out, b + m->val + 1, vl - 2);
    out[vl - 2] = '\0';
    return true;
}

bool kvr_replicas_read_entry(const void *val, size_t len, kvr_replica_entry_t *out)
{
    memset(out, 0, sizeof *out);
    const char *b = val;
    size_t i = b != NULL ? kvr_json_skip_ws(b, len, 0) : len;
    if (i >= len || b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int rc;
    kvr_json_object_begin(&it, b, len, i, KVR_JSON_STRICT);
    while ((rc = kvr_json_object_next(&it, &m)) == 1) {
        if (kvr_json_key_is(b, &m, "url"))
            (void)copy_plain_string(b, &m, out->url, sizeof out->url);
        else if (kvr_json_key_is(b, &m, "admin_url"))
            (void)copy_plain_string(b, &m, out->admin_url, sizeof out->admin_url);
        else if (kvr_json_key_is(b, &m, "replica_sync"))
            out->replica_sync = m.val_end - m.val == 4 && memcmp(b + m.val, "true", 4) == 0;
    }
    return rc == 0 && kvr_json_skip_ws(b, len, it.close + 1) == len && out->url[0] != '\0';
}

static void on_entry(void *arg, kvr_kv_op_t op, const char *key, const uint8_t *val, size_t len)
{
    kvr_replicas_t *r = arg;
    if (op == KVR_KV_CAUGHT_UP) {
        r->caught_up = true;
        return;
    }
    uint64_t id;
    if (!parse_id(key, &id)) {
        r->bad_entries++;
        kvr_log_limited(&r->rl, KVR_LOG_WARN, "replicas: %s entry '%.40s' is not a router id "
                        "(16 hex digits); ignored", r->bucket, key);
        return;
    }
    if (id == r->self)
        return;
    peer_t *p = find(r, id);
    if (op == KVR_KV_DELETE) {
        if (p != NULL && p->deleted_ms == 0)
            p->deleted_ms = kvr_now_ms(); /* gone after the grace, unless heard from */
        return;
    }
    kvr_replica_entry_t parsed;
    if (!kvr_replicas_read_entry(val, len, &parsed)) {
        r->bad_entries++;
        kvr_log_limited(&r->rl, KVR_LOG_WARN, "replicas: %s entry %s is not a JSON object "
                        "with a url; the router counts as present, without a url", r->bucket,
                        key);
    }
    if (p == NULL && (p = find_or_add(r, id, kvr_now_ms(), true)) == NULL)
        return;
    heard_after_delete(r, p, "refreshes it");
    memcpy(p->url, parsed.url, sizeof p->url);
    p->replica_sync = parsed.replica_sync;
    p->last_entry_ms = kvr_now_ms();
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_replicas_t *r = arg;
    if (!kvr_replicas_settled(r))
        return;
    uint64_t now = kvr_now_ms();
    for (size_t i = 0; i < KVR_MAX_PEERS; i++) {
        peer_t *p = &r->peers[i];
        if (!p->used)
            continue;
        uint64_t last = p->last_entry_ms > p->last_sync_ms ? p->last_entry_ms : p->last_sync_ms;
        last = last > r->connected_since_ms ? last : r->connected_since_ms;
        if (p->deleted_ms != 0 && now - p->deleted_ms >= r->cfg.ttl_ms * 2 / 3) {
            r->gone_deleted++;
            gone(r, p, "its presence entry was deleted");
        } else if (now - last >= r->cfg.ttl_ms) {
            r->gone_silent++;
            gone(r, p, "no presence refresh or sync batch within nats_presence_ttl_ms");
        }
    }
}

static void on_state(void *arg, kvr_nats_state_t st)
{
    kvr_replicas_t *r = arg;
    r->connected_since_ms = st == KVR_NATS_CONNECTED ? kvr_now_ms() : 0;
}

bool kvr_replicas_settled(const kvr_replicas_t *r)
{
    return r->connected_since_ms != 0 &&
           kvr_now_ms() - r->connected_since_ms >= r->cfg.ttl_ms;
}

uint64_t kvr_replicas_connected_since(const kvr_replicas_t *r) { return r->connected_since_ms; }

/* ---- what it shows ---- */

static bool ext_detail(void *arg, const char **key, const char **value)
{
    kvr_replicas_t *r = arg;
    *key = STATE_KEY;
    *value = kvr_nats_state_name(kvr_nats_state(r->cfg.nats));
    return true;
}

static void write_routers(kvr_replicas_t *r)
{
    kvr_json_writer_t *w = &r->w;
    uint64_t now = kvr_now_ms();
    char hex[17];
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "self");
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)r->self);
    kvr_json_string(w, hex);
    kvr_json_key(w, "namespace");
    kvr_json_string(w, r->ns);
    kvr_json_key(w, "nats");
    kvr_json_string(w, kvr_nats_state_name(kvr_nats_state(r->cfg.nats)));
    kvr_json_key(w, "routers");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < KVR_MAX_PEERS; i++) {
        const peer_t *p = &r->peers[i];
        if (!p->used)
            continue;
        kvr_json_begin_object(w);
        kvr_json_key(w, "router_id");
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)p->id);
        kvr_json_string(w, hex);
        kvr_json_key(w, "url");
        kvr_json_string(w, p->url);
        kvr_json_key(w, "replica_sync");
        kvr_json_bool(w, p->replica_sync);
        kvr_json_key(w, "last_seen_ms_ago");
        uint64_t last = p->last_entry_ms > p->last_sync_ms ? p->last_entry_ms : p->last_sync_ms;
        kvr_json_u64(w, now - last);
        kvr_json_key(w, "sync_batches");
        kvr_json_u64(w, p->batches);
        kvr_json_key(w, "sync_lost_batches");
        kvr_json_u64(w, p->lost_batches);
        kvr_json_key(w, "sync_lag_ms");
        kvr_json_double(w, (double)p->lag_last_us / 1000.0);
        kvr_json_key(w, "sync_lag_max_ms");
        kvr_json_double(w, (double)p->lag_max_us / 1000.0);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
}

static bool ext_handle(void *arg, struct evhttp_request *req, const char *path, bool get,
                       bool post)
{
    (void)post;
    kvr_replicas_t *r = arg;
    if (!get || strcmp(path, "/v1/routers") != 0)
        return false;
    write_routers(r);
    const char *body;
    size_t len;
    if (kvr_json_writer_finish(&r->w, &body, &len) != KVR_OK)
        kvr_reply_body(kvr_http_host_reply(r->cfg.host), req, 500, "text/plain", "out of memory\n", 14);
    else
        kvr_reply_body(kvr_http_host_reply(r->cfg.host), req, 200, "application/json", body, len);
    return true;
}

static void ext_metrics(void *arg, kvr_prom_t *p)
{
    kvr_replicas_t *r = arg;
    kvr_nats_stats_t st;
    kvr_nats_stats(r->cfg.nats, &st);
    kvr_prom_gauge(p, "kvr_nats_connected", "1 while the NATS connection is up",
                   st.state == KVR_NATS_CONNECTED);
    kvr_prom_counter(p, "kvr_nats_disconnects_total", "NATS connection losses",
                     (double)st.disconnects);
    kvr_prom_counter(p, "kvr_nats_reconnects_total", "NATS reconnections (nats.c's count)",
                     (double)st.reconnects);
    kvr_prom_counter(p, "kvr_nats_in_msgs_total", "messages received from NATS",
                     (double)st.in_msgs);
    kvr_prom_counter(p, "kvr_nats_in_bytes_total", "bytes received from NATS",
                     (double)st.in_bytes);
    kvr_prom_counter(p, "kvr_nats_out_msgs_total", "messages sent to NATS",
                     (double)st.out_msgs);
    kvr_prom_counter(p, "kvr_nats_out_bytes_total", "bytes sent to NATS", (double)st.out_bytes);
    kvr_prom_counter(p, "kvr_nats_publish_errors_total",
                     "publishes nats.c refused (its reconnect buffer full, or closed)",
                     (double)st.publish_errors);
    kvr_prom_counter(p, "kvr_nats_kv_puts_total", "presence and discovery entries written",
                     (double)st.kv_puts);
    kvr_prom_counter(p, "kvr_nats_kv_put_errors_total", "entry writes that failed (retried)",
                     (double)st.kv_put_errors);
    kvr_prom_counter(p, "kvr_nats_kv_entries_seen_total", "bucket entries seen by watches",
                     (double)st.kv_entries_seen);
    kvr_prom_counter(p, "kvr_nats_kv_watch_restarts_total",
                     "watches recreated after a reconnect", (double)st.kv_watch_restarts);
    kvr_prom_counter(p, "kvr_nats_inbox_dropped_total",
                     "NATS deliveries dropped because the event loop fell 65,536 behind",
                     (double)st.inbox_dropped);
    kvr_prom_gauge(p, "kvr_replicas_peers", "other router replicas seen live",
                   (double)kvr_replicas_live(r));
    kvr_prom_counter(p, "kvr_replicas_joined_total", "peers that appeared", (double)r->joined);
    const kvr_prom_by_t gone[] = {{"deleted", (double)r->gone_deleted},
                                  {"silent", (double)r->gone_silent}};
    kvr_prom_by_label(p, "kvr_replicas_gone_total", "counter",
                      "peers that went away, by how it was noticed", "how", gone,
                      KVR_PROM_N(gone));
    kvr_prom_counter(p, "kvr_replicas_deletes_disowned_total",
                     "peers whose presence entry was deleted while they kept refreshing it or "
                     "publishing (kept: a forged delete)", (double)r->restored);
    kvr_prom_counter(p, "kvr_replicas_evicted_total",
                     "routers known from sync batches alone dropped to make room for one with a "
                     "presence entry", (double)r->evicted);
    kvr_prom_counter(p, "kvr_replicas_bad_entries_total",
                     "presence entries refused (bad key or value)", (double)r->bad_entries);
    kvr_prom_counter(p, "kvr_replicas_peer_urls_refused_total",
                     "peer urls learnt from <namespace>_routers that name a host outside "
                     "allowed_peer_hosts (never asked, never sent a token)",
                     (double)r->peer_urls_refused);
}

void kvr_replicas_count_refused_url(kvr_replicas_t *r)
{
    if (r != NULL)
        r->peer_urls_refused++;
}

/* ---- lifecycle ---- */

static void presence_value(kvr_replicas_t *r, char *out, size_t cap)
{
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_json_begin_object(&w);
    kvr_json_key(&w, "router_id");
    kvr_json_string(&w, r->key);
    kvr_json_key(&w, "url");
    kvr_json_string(&w, r->url);
    if (r->admin_url[0] != '\0') {
        kvr_json_key(&w, "admin_url");
        kvr_json_string(&w, r->admin_url);
    }
    kvr_json_key(&w, "replica_sync");
    kvr_json_bool(&w, r->cfg.replica_sync);
    kvr_json_key(&w, "started_unix_ms");
    kvr_json_u64(&w, r->started_unix_ms);
    kvr_json_end_object(&w);
    const char *b;
    size_t len;
    if (kvr_json_writer_finish(&w, &b, &len) == KVR_OK && len < cap) {
        memcpy(out, b, len);
        out[len] = '\0';
    } else {
        out[0] = '\0';
    }
    kvr_json_writer_deinit(&w);
}

kvr_replicas_t *kvr_replicas_new(const kvr_replicas_config_t *cfg, int *status)
{
    kvr_replicas_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    r->cfg = *cfg;
    r->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    kvr_json_writer_init(&r->w);
    snprintf(r->ns, sizeof r->ns, "%s", cfg->ns);
    snprintf(r->bucket, sizeof r->bucket, "%s_routers", cfg->ns);
    snprintf(r->url, sizeof r->url, "%s", cfg->url ? cfg->url : "");
    snprintf(r->admin_url, sizeof r->admin_url, "%s", cfg->admin_url ? cfg->admin_url : "");
    r->cfg.ns = r->ns; /* the caller's strings need not outlive this call */
    r->cfg.url = r->url;
    r->cfg.admin_url = r->admin_url;
    while (r->self == 0)
        if (getrandom(&r->self, sizeof r->self, 0) != (ssize_t)sizeof r->self) {
            *status = KVR_EIO;
            kvr_replicas_free(r);
            return NULL;
        }
    snprintf(r->key, sizeof r->key, "%016llx", (unsigned long long)r->self);
    r->started_unix_ms = kvr_wall_ns() / 1000000u;
    if (kvr_nats_state(cfg->nats) == KVR_NATS_CONNECTED)
        r->connected_since_ms = kvr_now_ms();
    struct timeval tv = {0, CHECK_MS * 1000};
    kvr_http_service_t ext = {.handle = ext_handle, .metrics = ext_metrics,
                               .detail = ext_detail, .arg = r};
    int rc = KVR_OK;
    if ((r->check = event_new(cfg->base, -1, EV_PERSIST, on_check, r)) == NULL ||
        event_add(r->check, &tv) != 0)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK)
        rc = kvr_nats_on_state(cfg->nats, on_state, r);
    if (rc == KVR_OK)
        rc = kvr_nats_kv_watch(cfg->nats, r->bucket, cfg->ttl_ms, on_entry, r);
    if (rc == KVR_OK)
        rc = kvr_http_host_add_service(cfg->host, &ext);
    if (rc != KVR_OK) {
        *status = rc;
        kvr_replicas_free(r);
        return NULL;
    }
    kvr_log(KVR_LOG_INFO, "replicas: this router is %s in %s", r->key, r->bucket);
    *status = KVR_OK;
    return r;
}

int kvr_replicas_announce(kvr_replicas_t *r)
{
    char val[512];
    presence_value(r, val, sizeof val);
    return kvr_nats_kv_keep(r->cfg.nats, r->bucket, r->cfg.ttl_ms, r->key, val, strlen(val),
                            r->cfg.ttl_ms / 3);
}

void kvr_replicas_free(kvr_replicas_t *r)
{
    if (r == NULL)
        return;
    kvr_http_host_remove_service(r->cfg.host, r);
    (void)kvr_nats_kv_drop(r->cfg.nats, r->bucket, r->key);
    if (r->check != NULL)
        event_free(r->check);
    kvr_json_writer_deinit(&r->w);
    free(r);
}

uint64_t kvr_replicas_self(const kvr_replicas_t *r) { return r->self; }

void kvr_replicas_on_gone(kvr_replicas_t *r, kvr_peer_gone_fn fn, void *arg)
{
    r->gone_fn = fn;
    r->gone_arg = arg;
}

void kvr_replicas_seen(kvr_replicas_t *r, uint64_t router_id, uint64_t lag_us,
                       uint64_t lost_batches)
{
    if (router_id == r->self)
        return;
    uint64_t now = kvr_now_ms();
    peer_t *p = find_or_add(r, router_id, now, false);
    if (p == NULL)
        return;
    if (p->deleted_ms != 0 && now > p->deleted_ms)
        heard_after_delete(r, p, "publishes sync batches");
    p->last_sync_ms = now;
    p->batches++;
    p->lost_batches += lost_batches;
    p->lag_last_us = lag_us;
    p->lag_max_us = lag_us > p->lag_max_us ? lag_us : p->lag_max_us;
}

size_t kvr_replicas_live(const kvr_replicas_t *r) { return kvr_replicas_live_for(r, 0); }

size_t kvr_replicas_live_for(const kvr_replicas_t *r, uint64_t ms)
{
    uint64_t now = kvr_now_ms();
    size_t n = 0;
    for (size_t i = 0; i < KVR_MAX_PEERS; i++)
        n += r->peers[i].used && now - r->peers[i].first_ms >= ms;
    return n;
}
