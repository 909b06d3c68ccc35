/*
 * fleet.c: membership, observers, the index state shown per rank, and the serving loop's
 * tick (see fleet.h); the probes and fencing are health.c.
 * Invariants: a worker is in the router iff add_worker succeeded and remove_worker has not
 * run; its event subscription and probe exist only while it is (an add that fails half way
 * undoes the router's part). Observers are told after the removal, in the order added.
 * Threads: the HTTP thread. Cost: add / remove are O(workers) at worst (the probe table);
 * the tick is O(workers).
 */
#include "fleet/fleet.h"
#include "fleet/fleet_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include <assert.h>

#include "base/log.h"
#include "base/verify.h"

#ifdef NDEBUG
#define FLEET_CHECK(f) ((void)(f))
#else
#define FLEET_CHECK(f) assert(kvr_fleet_verify((f), NULL, 0) == KVR_OK)
#endif

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_fleet_t *f = arg;
    uint64_t now = kvr_now_ms();
    kvr_fleet_sync(f);
    fleet_warn_silent_ranks(f, now);
    kvr_sched_tick(f->sched, now); /* expiry, then the queue */
    if (now - f->last_probe_ms >= f->cfg.health_interval_ms) {
        f->last_probe_ms = now;
        fleet_probe_all(f);
    }
}

kvr_fleet_t *kvr_fleet_new(struct event_base *base, kvr_sched_t *sched, kvr_ingest_t *g,
                           const kvr_router_config_t *cfg, int *status, char *err,
                           size_t err_len)
{
    kvr_fleet_t *f = calloc(1, sizeof *f);
    if (f == NULL) {
        snprintf(err, err_len, "out of memory");
        *status = KVR_ENOMEM;
        return NULL;
    }
    f->base = base;
    f->sched = sched;
    f->r = kvr_sched_router(sched);
    f->g = g;
    f->cfg = *cfg;
    f->rl_silent = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(60000, 8);
    f->rl_cap = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(60000, 8);
    f->probes = calloc(KVR_FLEET_MAX_PROBES, sizeof *f->probes);
    f->tick = event_new(base, -1, EV_PERSIST, on_tick, f);
    struct timeval tv = {0, 100000};
    if (f->probes == NULL || f->tick == NULL || event_add(f->tick, &tv) != 0 ||
        fleet_drift_init(f) != KVR_OK) {
        snprintf(err, err_len, "out of memory");
        kvr_fleet_free(f);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return f;
}

void kvr_fleet_free(kvr_fleet_t *f)
{
    if (f == NULL)
        return;
    if (f->tick != NULL)
        event_free(f->tick);
    fleet_free_probes(f);
    fleet_drift_free(f);
    free(f);
}

kvr_router_t *kvr_fleet_router(const kvr_fleet_t *f) { return f->r; }
kvr_sched_t *kvr_fleet_sched(const kvr_fleet_t *f) { return f->sched; }
kvr_ingest_t *kvr_fleet_ingest(const kvr_fleet_t *f) { return f->g; }

int kvr_fleet_add_worker(kvr_fleet_t *f, const kvr_worker_spec_t *w, char *err, size_t err_len)
{
    int rc = kvr_router_add_worker(f->r, w, err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (f->g != NULL && w->events[0] != '\0' && f->cfg.use_kv_events &&
        f->cfg.router_mode == KVR_MODE_KV) {
        rc = kvr_ingest_subscribe(f->g, w, err, err_len);
        if (rc != KVR_OK) {
            (void)kvr_router_remove_worker(f->r, w->worker_id);
            return rc;
        }
    }
    if (w->url[0] != '\0')
        fleet_add_probe(f, w->worker_id);
    FLEET_CHECK(f);
    const kvr_worker_spec_t *sp = kvr_router_worker(f->r, w->worker_id);
    for (size_t i = 0; i < f->n_obs; i++)
        if (f->obs[i].added != NULL)
            f->obs[i].added(f->obs[i].arg, sp);
    kvr_log(KVR_LOG_INFO, "worker %llu registered (ranks %u..%u%s%s%s%s)",
            (unsigned long long)w->worker_id, w->dp_start, w->dp_start + w->dp_size - 1,
            w->events[0] ? ", events " : "", w->events, w->url[0] ? ", url " : "", w->url);
    kvr_sched_dispatch(f->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT);
    return KVR_OK;
}

int kvr_fleet_remove_worker(kvr_fleet_t *f, uint64_t id)
{
    if (kvr_router_remove_worker(f->r, id) != KVR_OK)
        return KVR_ENOWORKER;
    if (f->g != NULL)
        (void)kvr_ingest_remove_worker(f->g, id);
    fleet_remove_probe(f, id);
    if (f->drift != NULL)
        kvr_drift_remove_worker(f->drift, id);
    FLEET_CHECK(f);
    for (size_t i = 0; i < f->n_obs; i++)
        if (f->obs[i].removed != NULL)
            f->obs[i].removed(f->obs[i].arg, id);
    kvr_log(KVR_LOG_INFO, "worker %llu removed", (unsigned long long)id);
    kvr_sched_dispatch(f->sched, kvr_now_ms(), KVR_SCHED_BY_EVENT);
    return KVR_OK;
}

int kvr_fleet_observe(kvr_fleet_t *f, const kvr_fleet_observer_t *o)
{
    if (f->n_obs == KVR_FLEET_MAX_OBSERVERS)
        return KVR_EFULL;
    f->obs[f->n_obs++] = *o;
    return KVR_OK;
}

void kvr_fleet_unobserve(kvr_fleet_t *f, void *arg)
{
    for (size_t i = 0; i < f->n_obs; i++)
        if (f->obs[i].arg == arg) {
            memmove(&f->obs[i], &f->obs[i + 1], (f->n_obs - i - 1) * sizeof f->obs[0]);
            f->n_obs--;
            return;
        }
}

const char *kvr_fleet_index_state(const kvr_fleet_t *f, const kvr_worker_spec_t *sp,
                                  const kvr_rank_status_t *st)
{
    if (f->g == NULL) {
        const kvr_router_config_t *c = kvr_router_config(f->r);
        if (c->router_mode == KVR_MODE_APPROX)
            return "approximate";
        if (c->remote_indexer[0] != '\0')
            return "remote";
        if (!kvr_config_uses_index(c))
            return "not_indexed";
    }
    return sp->events[0] ? kvr_rank_state_name(st->state) : "no_events";
}

uint32_t kvr_fleet_probe_failures(const kvr_fleet_t *f, uint64_t worker_id)
{
    const probe_t *pr = fleet_probe(f, worker_id);
    return pr != NULL ? pr->failures : 0;
}

/* Why a rank is in an index state, for the hover of the live page. */
static const char *index_state_why(const char *state)
{
    static const char *const whys[][2] = {
        {"exact", ""},
        {"recovering", "a gap in its KV-event sequence is being replayed from its engine"},
        {"degraded", "events were lost and could not be replayed: its index may miss blocks "
                     "until the engine's cache turns over"},
        {"error", "its events could not be applied (see the router's log)"},
        {"unreachable", "the connection to its KV-event publisher is down"},
        {"no_events", "no KV events: registered without events=, or none received yet"},
        {"approximate", "approximate mode: the router's own decisions stand in for events"},
        {"remote", "its index is kept by a remote indexer"},
        {"not_indexed", "this mode keeps no index"},
    };
    for (size_t i = 0; i < sizeof whys / sizeof whys[0]; i++)
        if (strcmp(whys[i][0], state) == 0)
            return whys[i][1];
    return "";
}

const char *kvr_fleet_rank_state(const kvr_fleet_t *f, const kvr_worker_spec_t *sp,
                                 kvr_worker_t w, const kvr_rank_status_t *st, char *why,
                                 size_t cap)
{
    const probe_t *pr = fleet_probe(f, sp->worker_id);
    if (kvr_router_fenced(f->r, sp->worker_id)) {
        bool failing = pr != NULL && pr->failures > 0;
        snprintf(why, cap, "never picked, index state dropped: %s",
                 pr != NULL && pr->fence_why[0] ? pr->fence_why : "fenced");
        return failing ? "unreachable" : "fenced";
    }
    kvr_drift_view_t v;
    if (f->drift != NULL && kvr_drift_view(f->drift, w, &v) && v.drifting) {
        snprintf(why, cap,
                 "%u of its last %u answers agreed with the cached tokens its engine reported "
                 "(mean error %.0f tokens)",
                 v.window_agreeing, v.window_samples, v.mean_error);
        return "drifting";
    }
    const char *state = kvr_fleet_index_state(f, sp, st);
    snprintf(why, cap, "%s", index_state_why(state));
    return state;
}

void kvr_fleet_set_index_origin(kvr_fleet_t *f, const char *origin)
{
    snprintf(f->index_origin, sizeof f->index_origin, "%s", origin ? origin : "");
}

const char *kvr_fleet_index_origin(const kvr_fleet_t *f) { return f->index_origin; }

void kvr_fleet_set_index_loading(kvr_fleet_t *f, bool loading) { f->index_loading = loading; }
bool kvr_fleet_index_loading(const kvr_fleet_t *f) { return f->index_loading; }

void kvr_fleet_capacity_fetches(const kvr_fleet_t *f, uint64_t out[3])
{
    memcpy(out, f->cap_fetches, sizeof f->cap_fetches);
}

int kvr_fleet_verify(const kvr_fleet_t *f, char *msg, size_t msg_len)
{
    if (f->n_probes > f->n_all || f->n_all > KVR_FLEET_MAX_PROBES)
        KVR_VERIFY_FAIL("probes: %zu live of %zu (at most %d)", f->n_probes, f->n_all,
                        KVR_FLEET_MAX_PROBES);
    if (f->n_obs > KVR_FLEET_MAX_OBSERVERS)
        KVR_VERIFY_FAIL("%zu observers", f->n_obs);
    if (f->drift != NULL && kvr_drift_verify(f->drift, msg, msg_len) != KVR_OK)
        return KVR_EINVAL;
    for (size_t i = 0; i < f->n_all; i++) {
        const probe_t *pr = f->probes[i];
        if (pr == NULL || pr->f != f)
            KVR_VERIFY_FAIL("probe %zu: missing or another fleet's", i);
        if (pr->dead != (i >= f->n_probes))
            KVR_VERIFY_FAIL("probe %zu (worker %llu): %s among the %s ones", i,
                            (unsigned long long)pr->worker_id, pr->dead ? "dead" : "live",
                            pr->dead ? "live" : "dead");
        if (pr->dead)
            continue;
        const kvr_worker_spec_t *sp = kvr_router_worker(f->r, pr->worker_id);
        if (sp == NULL || sp->url[0] == '\0')
            KVR_VERIFY_FAIL("probe of worker %llu, which is %s", (unsigned long long)pr->worker_id,
                            sp == NULL ? "not registered" : "without a url");
        for (size_t j = 0; j < i; j++)
            if (f->probes[j]->worker_id == pr->worker_id)
                KVR_VERIFY_FAIL("two live probes of worker %llu",
                                (unsigned long long)pr->worker_id);
    }
    return KVR_OK;
}

void kvr_fleet_why_none(const kvr_fleet_t *f, char *buf, size_t len)
{
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(f->r, ids, 4096), fenced = 0;
    for (size_t i = 0; i < n && i < 4096; i++)
        fenced += kvr_router_fenced(f->r, ids[i]);
    if (n == 0)
        snprintf(buf, len, "no worker is registered (--worker, POST /v1/workers or discovery)");
    else if (fenced == n)
        snprintf(buf, len, "all %zu registered workers are fenced after failing (each returns "
                 "once its /health answers)", n);
    else if (len > 0)
        buf[0] = '\0';
}

int kvr_fleet_wait_failed(const kvr_router_t *r, int rc, char *msg, size_t msg_len)
{
    const kvr_router_config_t *c = kvr_router_config(r);
    if (rc == KVR_ENOWORKER) {
        snprintf(msg, msg_len,
                 "no worker ready: waited min_initial_workers_wait_ms (%llu ms) for "
                 "min_initial_workers (%u; %zu ready)",
                 (unsigned long long)c->min_initial_workers_wait_ms, c->min_initial_workers,
                 kvr_router_n_ready(r));
        return 503;
    }
    snprintf(msg, msg_len, "queued longer than router_queue_timeout_ms (%llu ms)",
             (unsigned long long)c->router_queue_timeout_ms);
    return 429;
}
