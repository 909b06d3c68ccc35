/*
 * cluster.c: this router among its peers (see cluster.h): the NATS link and what runs over it
 * (replicas.c: presence and the peer table; discovery.c: workers from the workers bucket;
 * replica_sync.c: shared active load), and a joining replica's index from a peer.
 * Invariants: the parts exist only with nats_url set, made in the order link, replicas,
 * discovery, sync and freed in the reverse; a peer is asked for the index only when it is in
 * `peers` or its host is allowed (allowed_peer_hosts, else the hosts of `peers` and of this
 * router's listeners), with peer_key_file's token and never another.
 * Threads: the HTTP thread; a joining replica's snapshot is fetched on a thread of its own
 * (http/offloop.h) while this one serves, cold, and applied back here.
 * Cost: one NATS bucket listing (blocking, at most 3 s, before the loop runs) and one
 * snapshot fetch at start.
 */
#include "cluster/cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/secret.h"
#include "cluster/discovery.h"
#include "cluster/replica_sync.h"
#include "cluster/replicas.h"
#include "core/endpoint.h"
#include "http/http.h"
#include "wire/index_snapshot.h"

struct kvr_cluster {
    struct event_base *base;
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    kvr_router_config_t cfg;
    kvr_nats_t *nats; /* NULL without nats_url, and then the three below too */
    kvr_replicas_t *replicas;
    kvr_discovery_t *disc;
    kvr_replica_sync_t *sync;
    /* a joining replica's index, being fetched (kvr_cluster_load_index) */
    kvr_offloop_t *fetch;
    kvr_ingest_t *load_g;
    kvr_cluster_index_fn load_done;
    void *load_arg;
    uint64_t load_t0;
};

/* ---- a new replica's index, from a peer -------------------------------------------------- */

#define MAX_PEER_URLS 16
#define PEER_SNAPSHOT_TIMEOUT_MS 30000
#define PEER_SNAPSHOT_MAX_BYTES ((size_t)8 << 30)

typedef struct peer_urls {
    char url[MAX_PEER_URLS][256];
    size_t n;
    const char *self_key; /* this router's own presence key: skipped */
    uint64_t ttl_ms;
    char allowed[2048];   /* hosts a url learnt from NATS may name */
    size_t refused;       /* urls learnt from NATS on other hosts */
    kvr_replicas_t *replicas;
} peer_urls_t;

static void add_peer_url(void *arg, const char *url, size_t len)
{
    peer_urls_t *p = arg;
    if (len == 0 || len >= sizeof p->url[0] || p->n == MAX_PEER_URLS)
        return;
    memcpy(p->url[p->n], url, len);
    p->url[p->n++][len] = '\0';
}

/* Calls fn on each entry of a comma-separated list (empty entries included). */
static void each_listed(const char *list, void (*fn)(void *, const char *, size_t), void *arg)
{
    for (const char *q = list; *q != '\0';) {
        const char *comma = strchr(q, ',');
        size_t n = comma ? (size_t)(comma - q) : strlen(q);
        fn(arg, q, n);
        q += n + (comma ? 1 : 0);
    }
}

typedef struct host_list {
    char *out;
    size_t cap;
} host_list_t;

/* The host of url appended to the comma-separated list (nothing when it does not parse). */
static void add_host_of(void *arg, const char *url, size_t len)
{
    host_list_t *h = arg;
    char *out = h->out;
    size_t cap = h->cap;
    char u[256];
    kvr_url_t parsed;
    if (len == 0 || len >= sizeof u)
        return;
    memcpy(u, url, len);
    u[len] = '\0';
    size_t n = strlen(out);
    if (kvr_endpoint_parse_url(u, NULL, &parsed, NULL, 0) == KVR_OK && n + 1 < cap)
        snprintf(out + n, cap - n, "%s%s", n > 0 ? "," : "", parsed.host);
}

/* allowed_peer_hosts, else the hosts of `peers` and the router's own listeners. */
static void allowed_peer_hosts(const kvr_router_config_t *c, char *out, size_t cap)
{
    if (c->allowed_peer_hosts[0] != '\0') {
        snprintf(out, cap, "%s", c->allowed_peer_hosts);
        return;
    }
    out[0] = '\0';
    host_list_t h = {out, cap};
    each_listed(c->peers, add_host_of, &h);
    size_t n = strlen(out);
    snprintf(out + n, cap - n, "%s%s,%s", n > 0 ? "," : "", c->bind, c->admin_bind);
}

static void on_router_entry(void *arg, const char *key, const void *val, size_t len,
                            uint64_t age_ms)
{
    peer_urls_t *p = arg;
    kvr_replica_entry_t e;
    if (strcmp(key, p->self_key) == 0 || age_ms >= p->ttl_ms ||
        !kvr_replicas_read_entry(val, len, &e))
        return; /* ours, stale (a router that died), or unreadable */
    const char *u = e.admin_url[0] ? e.admin_url : e.url;
    kvr_url_t parsed;
    if (kvr_endpoint_parse_url(u, NULL, &parsed, NULL, 0) != KVR_OK ||
        !kvr_endpoint_host_listed(p->allowed, parsed.host)) {
        /* anyone who can write to the bucket can name any host: never ask it (the token, the
         * index it would send) unless the operator allowed the host */
        p->refused++;
        kvr_replicas_count_refused_url(p->replicas);
        kvr_log(KVR_LOG_WARN, "index: router entry %s names %s, whose host is not in "
                "allowed_peer_hosts (%s): not asked", key, u, p->allowed);
        return;
    }
    add_peer_url(p, u, strlen(u));
}

/* The peers to ask: the `peers` setting, else the live routers of <ns>_routers whose host is
 * allowed. */
static void find_peers(kvr_cluster_t *d, const kvr_router_config_t *c, peer_urls_t *p)
{
    each_listed(c->peers, add_peer_url, p);
    if (p->n > 0 || d->nats == NULL)
        return;
    char bucket[80], self[17];
    snprintf(bucket, sizeof bucket, "%s_routers", c->nats_namespace);
    snprintf(self, sizeof self, "%016llx", (unsigned long long)kvr_replicas_self(d->replicas));
    p->self_key = self;
    p->ttl_ms = c->nats_presence_ttl_ms;
    p->replicas = d->replicas;
    allowed_peer_hosts(c, p->allowed, sizeof p->allowed);
    if (kvr_nats_kv_list(d->nats, bucket, c->nats_presence_ttl_ms, 3000, on_router_entry, p) !=
        KVR_OK)
        kvr_log(KVR_LOG_WARN, "index: could not list %s (NATS not reachable in 3 s); no peer "
                "to load the index from", bucket);
    p->self_key = NULL;
}

/* A joining replica's snapshot, fetched off the loop (http/offloop.h). The job's thread reads
 * the urls and the token and writes body, len and from; the loop reads them after it. */
typedef struct peer_fetch {
    kvr_cluster_t *d; /* read on the loop only */
    peer_urls_t p;
    char bearer[KVR_SECRET_MAX];
    uint8_t *body;
    size_t len, from;
} peer_fetch_t;

/* On the job's thread: the peers in order until one gives a snapshot. */
static void fetch_work(void *arg)
{
    peer_fetch_t *f = arg;
    for (size_t i = 0; i < f->p.n && f->body == NULL; i++) {
        kvr_http_fetch_t q = {.url = f->p.url[i], .path = "/v1/index/snapshot",
                              .bearer = f->bearer, .timeout_ms = PEER_SNAPSHOT_TIMEOUT_MS,
                              .max_bytes = PEER_SNAPSHOT_MAX_BYTES, .magic = KVR_SNAP_MAGIC,
                              .magic_len = KVR_SNAP_MAGIC_LEN};
        uint8_t *body = NULL;
        size_t len = 0;
        int status = 0;
        char err[400] = "";
        int rc = kvr_http_fetch(&q, &body, &len, &status, err, sizeof err);
        if (rc == KVR_OK && status == 200) {
            f->body = body;
            f->len = len;
            f->from = i;
            break;
        }
        if (rc == KVR_OK)
            snprintf(err, sizeof err, "GET %s/v1/index/snapshot answered %d%s", f->p.url[i],
                     status,
                     status == 401   ? " (the peers need the same peer_key_file)"
                     : status == 503 ? " (it is loading its own index)"
                                     : "");
        free(body);
        kvr_log(KVR_LOG_WARN, "index: peer %s: %s", f->p.url[i], err);
    }
}

static void fetch_drop(void *arg)
{
    peer_fetch_t *f = arg;
    free(f->body);
    free(f);
}

/* On the loop: the snapshot that arrived (if one did) applied (the ingest thread is not
 * started yet, so on this thread), said, and the caller told. */
static void fetch_done(void *arg)
{
    peer_fetch_t *f = arg;
    kvr_cluster_t *d = f->d;
    d->fetch = NULL;
    bool loaded = false;
    if (f->body != NULL) {
        const char *url = f->p.url[f->from];
        uint64_t t1 = kvr_now_ms();
        char err[400] = "";
        kvr_ingest_snap_report_t rep;
        int rc = kvr_ingest_load_mem(d->load_g, f->body, f->len, &rep, err, sizeof err);
        if (rc != KVR_OK) {
            kvr_log(KVR_LOG_WARN, "index: peer %s: %s", url, err);
        } else {
            char origin[512];
            snprintf(origin, sizeof origin, "peer %s: %u ranks, %llu events", url, rep.ranks,
                     (unsigned long long)rep.events);
            kvr_fleet_set_index_origin(d->fleet, origin);
            kvr_log(KVR_LOG_INFO, "index: loaded from peer %s: %u ranks resumed (%u skipped), "
                    "%llu events (%llu refused), %zu bytes; applied in %llu ms, %llu ms after "
                    "the start; each resumed rank catches up from its engine's replay buffer",
                    url, rep.ranks, rep.ranks_skipped, (unsigned long long)rep.events,
                    (unsigned long long)rep.events_failed, f->len,
                    (unsigned long long)(kvr_now_ms() - t1),
                    (unsigned long long)(kvr_now_ms() - d->load_t0));
            loaded = true;
        }
    }
    fetch_drop(f);
    d->load_done(d->load_arg, loaded);
}

int kvr_cluster_load_index(kvr_cluster_t *d, kvr_ingest_t *g, kvr_cluster_index_fn done,
                           void *arg)
{
    const kvr_router_config_t *c = &d->cfg;
    if (c->peers[0] == '\0' && d->nats == NULL)
        return KVR_ENOTFOUND;
    peer_fetch_t *f = calloc(1, sizeof *f);
    if (f == NULL)
        return KVR_ENOTFOUND;
    f->d = d;
    find_peers(d, c, &f->p);
    if (f->p.n == 0) {
        free(f);
        return KVR_ENOTFOUND;
    }
    char err[400] = "";
    if (c->peer_key_file[0] != '\0' && kvr_secret_read("peer_key_file", c->peer_key_file,
                                                       f->bearer, err, sizeof err) != KVR_OK)
        kvr_log(KVR_LOG_WARN, "index: %s; asking peers without a token", err);
    d->load_g = g;
    d->load_done = done;
    d->load_arg = arg;
    d->load_t0 = kvr_now_ms();
    kvr_offloop_job_t job = {.work = fetch_work, .done = fetch_done, .drop = fetch_drop,
                             .arg = f};
    int st;
    if ((d->fetch = kvr_offloop_start(d->base, &job, &st)) == NULL) {
        kvr_log(KVR_LOG_WARN, "index: asking the peers could not start (%s); starting cold",
                kvr_strerror(st));
        free(f);
        return KVR_ENOTFOUND;
    }
    kvr_log(KVR_LOG_INFO, "index: asking %zu peer%s for a snapshot (first %s); serving cold "
            "meanwhile", f->p.n, f->p.n > 1 ? "s" : "", f->p.url[0]);
    return KVR_OK;
}

/* The NATS side (nats_url set): the link, this router among its peers, replica sync. */
static int build_nats(kvr_cluster_t *d, const kvr_router_config_t *c, char *err, size_t err_len)
{
    char name[96], url[160];
    int st;
    snprintf(name, sizeof name, "kvrouter %s", c->nats_namespace);
    kvr_nats_config_t nc = {.url = c->nats_url, .name = name, .base = d->base,
                            .auth = {.creds_file = c->nats_creds_file,
                                     .nkey_file = c->nats_nkey_file,
                                     .token_file = c->nats_token_file,
                                     .tls_ca = c->nats_tls_ca,
                                     .tls_cert = c->nats_tls_cert,
                                     .tls_key = c->nats_tls_key}};
    if ((d->nats = kvr_nats_new(&nc, &st, err, err_len)) == NULL) {
        if (err[0] == '\0')
            snprintf(err, err_len, "%s", kvr_strerror(st));
        return st;
    }
    char admin_url[160] = "";
    snprintf(url, sizeof url, "http://%s:%u", c->bind, kvr_http_host_port(d->host));
    if (c->admin_port.set)
        snprintf(admin_url, sizeof admin_url, "http://%s:%u", c->admin_bind,
                 kvr_http_host_admin_port(d->host));
    kvr_replicas_config_t rc = {.base = d->base, .nats = d->nats, .host = d->host,
                                .ns = c->nats_namespace, .ttl_ms = c->nats_presence_ttl_ms,
                                .url = url, .admin_url = admin_url,
                                .replica_sync = c->router_replica_sync};
    if ((d->replicas = kvr_replicas_new(&rc, &st)) == NULL) {
        snprintf(err, err_len, "replicas: %s", kvr_strerror(st));
        return st;
    }
    if (c->discovery == KVR_DISCOVERY_NATS) {
        kvr_discovery_config_t dc = {.base = d->base, .nats = d->nats, .host = d->host,
                                     .fleet = d->fleet,
                                     .replicas = d->replicas, .ns = c->nats_namespace,
                                     .ttl_ms = c->nats_presence_ttl_ms};
        if ((d->disc = kvr_discovery_new(&dc, &st)) == NULL) {
            snprintf(err, err_len, "discovery: %s", kvr_strerror(st));
            return st;
        }
    }
    if (!c->router_replica_sync)
        return KVR_OK;
    kvr_replica_sync_config_t sc = {.base = d->base, .nats = d->nats,
                                    .sched = kvr_fleet_sched(d->fleet),
                                    .replicas = d->replicas, .host = d->host,
                                    .ns = c->nats_namespace};
    if ((d->sync = kvr_replica_sync_new(&sc, &st)) == NULL) {
        snprintf(err, err_len, "replica sync: %s", kvr_strerror(st));
        return st;
    }
    return KVR_OK;
}

kvr_cluster_t *kvr_cluster_new(const kvr_cluster_config_t *cc, int *status, char *err,
                               size_t err_len)
{
    kvr_cluster_t *d = calloc(1, sizeof *d);
    if (d == NULL) {
        snprintf(err, err_len, "out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    d->base = cc->base;
    d->host = cc->host;
    d->fleet = cc->fleet;
    d->cfg = *cc->cfg;
    err[0] = '\0';
    int st = d->cfg.nats_url[0] != '\0' ? build_nats(d, &d->cfg, err, err_len) : KVR_OK;
    if (st != KVR_OK) {
        kvr_cluster_free(d);
        *status = st;
        return NULL;
    }
    *status = KVR_OK;
    return d;
}

void kvr_cluster_free(kvr_cluster_t *d)
{
    if (d == NULL)
        return;
    kvr_offloop_abandon(d->fetch); /* a shutdown while it runs: it ends on its own */
    kvr_discovery_free(d->disc);
    kvr_replica_sync_free(d->sync); /* publishes its last batch */
    kvr_replicas_free(d->replicas);
    kvr_nats_free(d->nats); /* deletes this router's presence entry, then closes */
    free(d);
}

kvr_nats_t *kvr_cluster_nats(const kvr_cluster_t *d) { return d->nats; }

int kvr_cluster_announce(kvr_cluster_t *d)
{
    return d->replicas != NULL ? kvr_replicas_announce(d->replicas) : KVR_OK;
}
