/*
 * discovery.c: see discovery.h.
 *
 * Invariants:
 *   - the table holds one slot per worker id seen in the bucket (registered or refused);
 *     registered slots are exactly the workers this module added to the router and has not
 *     removed, so a worker given by --worker or POST /v1/workers is never removed here;
 *   - a refused slot remembers its value's hash: the same value is not tried (nor logged)
 *     again; a new value is;
 *   - expiry is judged only while settled (replicas.h): connected without a break for the TTL;
 *   - a registered worker's value never changes here: a put with another value (anyone on NATS
 *     can write one) is refused and counted while the registered value lives; it can take over
 *     once that one is deleted or expires (only the registered value's puts refresh it).
 */
#include "cluster/discovery.h"

#include <event2/event.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "kvrouter/router.h"
#include "base/log.h"
#include "wire/api_json.h"
#include "wire/prom.h"

#define CHECK_MS 250

typedef struct found {
    uint64_t id, value_hash, last_put_ms;
    bool used, registered;
} found_t;

struct kvr_discovery {
    kvr_discovery_config_t cfg;
    char bucket[80];
    kvr_api_decoder_t *dec;
    found_t *t;
    size_t n, cap;
    struct event *check;
    uint64_t added, changed, deleted, expired, refused, conflicts;
    kvr_ratelimit_t rl;
};

static found_t *find(kvr_discovery_t *d, uint64_t id)
{
    for (size_t i = 0; i < d->n; i++)
        if (d->t[i].used && d->t[i].id == id)
            return &d->t[i];
    return NULL;
}

static found_t *slot_for(kvr_discovery_t *d, uint64_t id)
{
    found_t *f = find(d, id);
    for (size_t i = 0; f == NULL && i < d->n; i++)
        if (!d->t[i].used)
            f = &d->t[i];
    if (f == NULL) {
        if (kvr_grow((void **)&d->t, &d->cap, d->n + 1, SIZE_MAX / sizeof *d->t, sizeof *d->t) !=
            KVR_OK)
            return NULL;
        f = &d->t[d->n++];
        memset(f, 0, sizeof *f);
    }
    if (!f->used)
        *f = (found_t){.id = id, .used = true};
    return f;
}

static void unregister(kvr_discovery_t *d, found_t *f, const char *why)
{
    if (f->registered && kvr_fleet_remove_worker(d->cfg.fleet, f->id) == KVR_OK)
        kvr_log(KVR_LOG_INFO, "discovery: worker %llu removed (%s)", (unsigned long long)f->id,
                why);
    *f = (found_t){0};
}

static void refuse(kvr_discovery_t *d, found_t *f, const char *key, const char *why)
{
    d->refused++;
    kvr_log_limited(&d->rl, KVR_LOG_WARN, "discovery: %s entry %s refused: %s", d->bucket, key,
                    why);
    if (f != NULL)
        f->registered = false;
}

/* "123" -> 123; false unless a plain decimal (no sign, no spaces). */
static bool parse_key(const char *key, uint64_t *id)
{
    if (*key == '\0' || strlen(key) > 20)
        return false;
    uint64_t v = 0;
    for (const char *p = key; *p; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
            return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *id = v;
    return true;
}

static void on_put(kvr_discovery_t *d, uint64_t id, const char *key, const uint8_t *val,
                   size_t len)
{
    uint64_t now = kvr_now_ms(), h = XXH3_64bits(val, len);
    found_t *f = find(d, id);
    if (f != NULL && f->value_hash == h) {
        f->last_put_ms = now; /* a heartbeat */
        return;
    }
    if (f == NULL && kvr_router_worker(kvr_fleet_router(d->cfg.fleet), id) != NULL) {
        d->conflicts++;
        refuse(d, NULL, key, "the worker is registered by --worker or POST /v1/workers");
        return;
    }
    if (f != NULL && f->registered) { /* changed while registered: refused, not replaced */
        d->changed++;
        kvr_log_limited(&d->rl, KVR_LOG_WARN, "discovery: %s entry %s changed while worker %s "
                        "is registered: refused (a worker re-registers with a new value after "
                        "its entry is deleted or expires; anyone on NATS can write an entry)",
                        d->bucket, key, key);
        return;
    }
    if ((f = slot_for(d, id)) == NULL) {
        refuse(d, NULL, key, "out of memory");
        return;
    }
    f->value_hash = h;
    f->last_put_ms = now;
    kvr_api_worker_t a;
    kvr_worker_spec_t sp;
    char err[300] = "";
    int rc = kvr_api_decode_worker(d->dec, (const char *)val, len, &a);
    if (rc != KVR_OK) {
        refuse(d, f, key, kvr_api_decoder_error(d->dec));
        return;
    }
    if (a.worker_id != id) {
        snprintf(err, sizeof err, "worker_id %llu differs from the key",
                 (unsigned long long)a.worker_id);
        refuse(d, f, key, err);
        return;
    }
    rc = kvr_api_worker_to_spec(&sp, &a, err, sizeof err);
    if (rc == KVR_OK)
        rc = kvr_fleet_add_worker(d->cfg.fleet, &sp, err, sizeof err);
    if (rc != KVR_OK) {
        refuse(d, f, key, err[0] ? err : kvr_strerror(rc));
        return;
    }
    f->registered = true;
    d->added++;
    kvr_log(KVR_LOG_INFO, "discovery: worker %llu registered (url %s, events %s)",
            (unsigned long long)id, sp.url[0] ? sp.url : "-", sp.events[0] ? sp.events : "-");
}

static void on_entry(void *arg, kvr_kv_op_t op, const char *key, const uint8_t *val, size_t len)
{
    kvr_discovery_t *d = arg;
    if (op == KVR_KV_CAUGHT_UP)
        return;
    uint64_t id;
    if (!parse_key(key, &id)) {
        refuse(d, NULL, key, "the key is not a worker id (a decimal integer)");
        return;
    }
    if (op == KVR_KV_PUT) {
        on_put(d, id, key, val, len);
        return;
    }
    found_t *f = find(d, id);
    if (f != NULL) {
        d->deleted += f->registered;
        unregister(d, f, "its entry was deleted");
    }
}

static void on_check(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_discovery_t *d = arg;
    if (!kvr_replicas_settled(d->cfg.replicas))
        return;
    uint64_t now = kvr_now_ms(), since = kvr_replicas_connected_since(d->cfg.replicas);
    for (size_t i = 0; i < d->n; i++) {
        found_t *f = &d->t[i];
        uint64_t last = f->last_put_ms > since ? f->last_put_ms : since;
        if (f->used && now - last >= d->cfg.ttl_ms) {
            d->expired += f->registered;
            unregister(d, f, "its entry was not refreshed within nats_presence_ttl_ms");
        }
    }
}

static void ext_metrics(void *arg, kvr_prom_t *p)
{
    kvr_discovery_t *d = arg;
    size_t live = 0;
    for (size_t i = 0; i < d->n; i++)
        live += d->t[i].used && d->t[i].registered;
    kvr_prom_gauge(p, "kvr_discovery_workers", "workers registered through discovery",
                   (double)live);
    const kvr_prom_by_t kinds[] = {{"added", (double)d->added},
                                   {"deleted", (double)d->deleted},
                                   {"expired", (double)d->expired}};
    kvr_prom_by_label(p, "kvr_discovery_events_total", "counter",
                      "discovery changes applied, by kind", "kind", kinds, KVR_PROM_N(kinds));
    kvr_prom_counter(p, "kvr_discovery_refused_total",
                     "entries refused (undecodable, id mismatch, registration refused)",
                     (double)d->refused);
    kvr_prom_counter(p, "kvr_discovery_changes_refused_total",
                     "entries with another value for a registered worker (kept as registered "
                     "until its entry is deleted or expires)",
                     (double)d->changed);
    kvr_prom_counter(p, "kvr_discovery_conflicts_total",
                     "entries naming a worker registered otherwise (ignored)",
                     (double)d->conflicts);
}

kvr_discovery_t *kvr_discovery_new(const kvr_discovery_config_t *cfg, int *status)
{
    kvr_discovery_t *d = calloc(1, sizeof *d);
    if (d == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    d->cfg = *cfg;
    d->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    snprintf(d->bucket, sizeof d->bucket, "%s_workers", cfg->ns);
    struct timeval tv = {0, CHECK_MS * 1000};
    kvr_http_service_t ext = {.metrics = ext_metrics, .arg = d};
    int rc = KVR_OK;
    if ((d->dec = kvr_api_decoder_new(NULL)) == NULL ||
        (d->check = event_new(cfg->base, -1, EV_PERSIST, on_check, d)) == NULL ||
        event_add(d->check, &tv) != 0)
        rc = KVR_ENOMEM;
    if (rc == KVR_OK)
        rc = kvr_nats_kv_watch(cfg->nats, d->bucket, cfg->ttl_ms, on_entry, d);
    if (rc == KVR_OK)
        rc = kvr_http_host_add_service(cfg->host, &ext);
    if (rc != KVR_OK) {
        *status = rc;
        kvr_discovery_free(d);
        return NULL;
    }
    kvr_log(KVR_LOG_INFO, "discovery: watching %s", d->bucket);
    *status = KVR_OK;
    return d;
}

void kvr_discovery_free(kvr_discovery_t *d)
{
    if (d == NULL)
        return;
    kvr_http_host_remove_service(d->cfg.host, d);
    if (d->check != NULL)
        event_free(d->check);
    kvr_api_decoder_free(d->dec);
    free(d->t);
    free(d);
}

int kvr_discovery_register(kvr_nats_t *n, const char *ns, uint64_t ttl_ms,
                           const kvr_worker_spec_t *sp)
{
    char bucket[80], key[24];
    snprintf(bucket, sizeof bucket, "%s_workers", ns);
    snprintf(key, sizeof key, "%llu", (unsigned long long)sp->worker_id);
    kvr_json_writer_t w;
    kvr_json_writer_init(&w);
    kvr_api_encode_worker_spec(&w, sp);
    const char *body;
    size_t len;
    int rc = kvr_json_writer_finish(&w, &body, &len);
    if (rc == KVR_OK)
        rc = kvr_nats_kv_keep(n, bucket, ttl_ms, key, body, len, ttl_ms / 3 ? ttl_ms / 3 : 1);
    kvr_json_writer_deinit(&w);
    return rc;
}
