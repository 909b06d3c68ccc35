/*
 * sched.c: see sched.h.
 *
 * A queued request is one allocation: the entry, then the prompt's block and sequence hashes
 * (computed once at enqueue, so a dispatch pass routes with route_req_t.hashed and never
 * hashes again), then, for a copied request, its allowed and excluded ids, taints and strings. Its queue
 * item's user pointer is the entry; the ticket is the queue's own handle (slot + generation).
 *
 * Invariants (kvr_sched_verify, and asserted in debug builds):
 *   - the queue's invariants hold (kvr_queue_verify);
 *   - dispatched[event] + dispatched[tick] = the queue's dispatched count: every request that
 *     left the queue by dispatch was counted under one trigger;
 *   - a queued request with update_state (only those are queued) has its done callback;
 *   - at most one dispatch pass runs. A re-entrant call (a callback that frees a booking)
 *     returns at once: the running pass peeks at the queue again after every callback and
 *     stops only at a request that cannot be placed after everything the callbacks did;
 *   - once warm, always warm; a request queued by the start-up wait times out no later than
 *     the window's end (born_ms + initial_wait_ms), the scheduler reading no clock of its own:
 *     born_ms is the first time a call gave it.
 * Threads: the owner thread only. Cost: see sched.h.
 */
#include "kvrouter/sched.h"

#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/load.h"
#include "core/queue.h"

typedef struct observer {
    kvr_sched_observer_fn fn;
    void *arg;
    bool named; /* wants the id of events by handle */
} observer_t;

typedef struct entry {
    kvr_route_req_t q; /* hashed; pointers into this block when copied */
    kvr_select_override_t ovr;
    kvr_sched_done_fn done;
    void *arg;
    bool warmup; /* queued by the start-up wait (expiry answers KVR_ENOWORKER) */
    /* waiting for its overlaps (on the awaiting list until the source answers) */
    struct entry *prev, *next;
    kvr_ticket_t ticket;
    uint32_t strict_priority;
    bool cancelled; /* its client went away: freed when the source answers */
    struct kvr_sched *sched;
    kvr_match_t *matches; /* the source's answer (owned) */
} entry_t;

struct kvr_sched {
    kvr_router_t *r;
    kvr_sched_config_t cfg;
    kvr_queue_t *queue; /* NULL: the queue is off and the start-up wait over */
    bool warm;          /* min_initial_workers were ready once, or the start-up window
                           (initial_wait_ms from the first call) is over: no wait any more */
    uint64_t born_ms;   /* the first call's time (0: none yet): the start-up window's start */
    uint64_t now_ms;    /* the latest time a call gave */
    observer_t obs[KVR_SCHED_MAX_OBSERVERS];
    size_t n_obs, n_named; /* n_named: observers that want ids */
    bool dispatching;        /* a pass is running (callbacks may re-enter) */
    kvr_sched_trigger_t why; /* of the running pass */
    uint64_t dispatched[KVR_SCHED_N_TRIGGERS];
    uint64_t applied[2];
    kvr_overlap_source_t src; /* src.lookup NULL: the router's own index */
    entry_t *awaiting;        /* placements waiting for their overlaps */
    size_t n_awaiting;
    uint64_t next_ticket; /* awaiting tickets: top bit set (the queue's never have it) */
};

#define AWAIT_TICKET_BIT ((kvr_ticket_t)1 << 63)

static void entry_free(entry_t *e)
{
    free(e->matches);
    free(e);
}

void kvr_sched_config_from(kvr_sched_config_t *out, const kvr_router_config_t *cfg)
{
    *out = (kvr_sched_config_t){
        .queue = cfg->router_queue_threshold.set,
        .queue_cfg = {.capacity = cfg->router_queue_max_requests,
                      .max_pending_isl_tokens = cfg->router_queue_max_isl_tokens,
                      .order = cfg->router_queue_policy},
        .queue_timeout_ms = cfg->router_queue_timeout_ms,
        .min_initial_workers = cfg->min_initial_workers,
        .initial_wait_ms = cfg->min_initial_workers_wait_ms,
    };
}

kvr_sched_t *kvr_sched_new(kvr_router_t *r, const kvr_sched_config_t *cfg, int *status,
                           const char **field)
{
    int st_dummy;
    const char *f_dummy;
    status = status ? status : &st_dummy;
    field = field ? field : &f_dummy;
    *field = NULL;
    if (r == NULL || cfg == NULL) {
        *status = KVR_EINVAL;
        return NULL;
    }
    if (cfg->queue && kvr_queue_config_validate(&cfg->queue_cfg, field) != KVR_OK) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_sched_t *s = calloc(1, sizeof *s);
    if (s == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    s->r = r;
    s->cfg = *cfg;
    s->warm = cfg->min_initial_workers == 0;
    if ((cfg->queue || !s->warm) && (s->queue = kvr_queue_new(&cfg->queue_cfg, status)) == NULL) {
        free(s);
        return NULL;
    }
    *status = KVR_OK;
    return s;
}

void kvr_sched_free(kvr_sched_t *s)
{
    if (s == NULL)
        return;
    if (s->queue != NULL) {
        kvr_queue_entry_t e;
        while (kvr_queue_pop(s->queue, &e) == KVR_OK)
            entry_free(e.item.user);
        kvr_queue_free(s->queue);
    }
    while (s->awaiting != NULL) { /* the source was freed first: it calls back no more */
        entry_t *e = s->awaiting;
        s->awaiting = e->next;
        entry_free(e);
    }
    free(s);
}

kvr_router_t *kvr_sched_router(const kvr_sched_t *s) { return s->r; }

static void notify(kvr_sched_t *s, const kvr_sched_event_t *ev)
{
    for (size_t i = 0; i < s->n_obs; i++)
        s->obs[i].fn(s->obs[i].arg, ev);
}

static void notify_routed(kvr_sched_t *s, const kvr_route_res_t *res)
{
    if (s->n_obs == 0)
        return;
    kvr_sched_event_t ev = {.kind = KVR_SCHED_ROUTED,
                            .handle = res->handle,
                            .id = res->request_id,
                            .id_len = strlen(res->request_id),
                            .decay_fraction = NAN,
                            .res = res,
                            .booking = kvr_router_last_booking(s->r)};
    notify(s, &ev);
}

/* ---------------------------------------------------------------------------------------- */
/* Queued entries */

/* Bytes a copy of q's variable parts needs after the hashes (8-byte aligned parts first). */
static size_t copy_bytes(const kvr_route_req_t *q)
{
    size_t n = (q->n_allowed + q->n_exclude) * sizeof(uint64_t) +
               q->n_preferred * sizeof(kvr_taint_weight_t) +
               q->n_required * sizeof(char *);
    n += q->request_id_len + q->lora_name_len + q->cache_namespace_len + q->session_id_len + 4;
    for (size_t i = 0; i < q->n_required; i++)
        n += strlen(q->required_taints[i]) + 1;
    for (size_t i = 0; i < q->n_preferred; i++)
        n += strlen(q->preferred_taints[i].taint) + 1;
    return n;
}

static const char *copy_str(char **cursor, const char *src, size_t len)
{
    if (src == NULL)
        return NULL;
    char *dst = *cursor;
    memcpy(dst, src, len);
    dst[len] = '\0';
    *cursor += len + 1;
    return dst;
}

/* Points e->q's borrowed parts at copies in the bytes at c. */
static void copy_parts(entry_t *e, unsigned char *c)
{
    kvr_route_req_t *q = &e->q;
    uint64_t *allowed = (uint64_t *)(void *)c;
    if (q->n_allowed > 0)
        memcpy(allowed, q->allowed_ids, q->n_allowed * sizeof *allowed);
    q->allowed_ids = allowed;
    uint64_t *excl = allowed + q->n_allowed;
    if (q->n_exclude > 0)
        memcpy(excl, q->exclude_ids, q->n_exclude * sizeof *excl);
    q->exclude_ids = excl;
    kvr_taint_weight_t *pref = (kvr_taint_weight_t *)(void *)(excl + q->n_exclude);
    const char **req = (const char **)(void *)(pref + q->n_preferred);
    char *str = (char *)(req + q->n_required);
    q->request_id = copy_str(&str, q->request_id, q->request_id_len);
    q->lora_name = copy_str(&str, q->lora_name, q->lora_name_len);
    q->cache_namespace = copy_str(&str, q->cache_namespace, q->cache_namespace_len);
    q->session_id = copy_str(&str, q->session_id, q->session_id_len);
    for (size_t i = 0; i < q->n_required; i++)
        req[i] = copy_str(&str, q->required_taints[i], strlen(q->required_taints[i]));
    q->required_taints = req;
    for (size_t i = 0; i < q->n_preferred; i++) {
        pref[i].weight = q->preferred_taints[i].weight;
        pref[i].taint =
            copy_str(&str, q->preferred_taints[i].taint, strlen(q->preferred_taints[i].taint));
    }
    q->preferred_taints = pref;
    if (q->ovr != NULL) {
        e->ovr = *q->ovr;
        q->ovr = &e->ovr;
    }
    q->tokens = NULL; /* the hashes stand for them (and for the multimodal objects) */
    q->mm = NULL;
    q->n_mm = 0;
}

/* A queue entry for p: its hashes (computed here, or the request's own: copied with the rest
 * when asked, else borrowed), its parts copied when asked. */
static int entry_new(kvr_sched_t *s, const kvr_place_t *p, entry_t **out)
{
    const kvr_route_req_t *q = p->q;
    bool own_hashes = !q->hashed || p->copy;
    size_t n = q->hashed ? q->n_hashed : kvr_router_n_blocks(s->r, q);
    if (q->hashed && n > 0 && (q->block_hashes == NULL || q->seq_hashes == NULL))
        return KVR_EINVAL;
    size_t bytes = sizeof(entry_t) + (own_hashes ? 2 * n * sizeof(uint64_t) : 0) +
                   (p->copy ? copy_bytes(q) : 0);
    entry_t *e = malloc(bytes);
    if (e == NULL)
        return KVR_ENOMEM;
    *e = (entry_t){.q = *q, .done = p->done, .arg = p->arg, .strict_priority = p->strict_priority};
    uint64_t *lbh = (uint64_t *)(void *)(e + 1), *seq = lbh + (own_hashes ? n : 0);
    if (!q->hashed) {
        long m = kvr_router_hash(s->r, q, lbh, seq, n);
        if (m < 0 || (size_t)m != n) {
            free(e);
            return m < 0 ? (int)m : KVR_EINVAL;
        }
    } else if (p->copy && n > 0) {
        memcpy(lbh, q->block_hashes, n * sizeof *lbh);
        memcpy(seq, q->seq_hashes, n * sizeof *seq);
    }
    if (own_hashes) {
        e->q.hashed = true;
        e->q.block_hashes = lbh;
        e->q.seq_hashes = seq;
        e->q.n_hashed = n;
    }
    if (p->copy)
        copy_parts(e, (unsigned char *)(seq + (own_hashes ? n : 0)));
    *out = e;
    return KVR_OK;
}

/* The time of the call being served (the scheduler reads no clock: callers give it). */
static void saw_time(kvr_sched_t *s, uint64_t now_ms)
{
    if (s->born_ms == 0)
        s->born_ms = now_ms != 0 ? now_ms : 1;
    if (now_ms > s->now_ms)
        s->now_ms = now_ms;
}

/* Whether the start-up wait is over: it ends for good once min_initial_workers are ready, or
 * once initial_wait_ms have passed since the first call (a request arriving later is told at
 * once that no worker is ready, rather than waiting again). */
static bool warm(kvr_sched_t *s)
{
    if (!s->warm && (kvr_router_n_ready(s->r) >= s->cfg.min_initial_workers ||
                     (s->born_ms != 0 && s->cfg.initial_wait_ms != 0 &&
                      s->now_ms - s->born_ms >= s->cfg.initial_wait_ms)))
        s->warm = true;
    return s->warm;
}

bool kvr_sched_warm(kvr_sched_t *s) { return warm(s); }

/* Queues an entry (taken: freed on failure). */
static int enqueue_entry(kvr_sched_t *s, entry_t *e, uint64_t now_ms, kvr_ticket_t *ticket)
{
    e->warmup = !s->warm;
    uint64_t window_end = s->born_ms + s->cfg.initial_wait_ms;
    uint64_t left = s->cfg.initial_wait_ms == 0 ? 0 /* forever */
                    : window_end > now_ms         ? window_end - now_ms /* what is left */
                                                  : 1;
    kvr_queue_item_t it = {.isl_tokens = e->q.n_tokens,
                           .cost_tokens = e->q.n_tokens,
                           .priority_jump = e->q.priority_jump,
                           .strict_priority = e->strict_priority,
                           .timeout_ms = e->warmup ? left : s->cfg.queue_timeout_ms,
                           .user = e};
    int rc = kvr_queue_push(s->queue, &it, now_ms, ticket);
    if (rc != KVR_OK)
        entry_free(e);
    return rc;
}

static int enqueue(kvr_sched_t *s, const kvr_place_t *p, uint64_t now_ms, kvr_ticket_t *ticket)
{
    entry_t *e = NULL;
    int rc = entry_new(s, p, &e);
    if (rc != KVR_OK)
        return rc;
    return enqueue_entry(s, e, now_ms, ticket);
}

/* ---------------------------------------------------------------------------------------- */
/* Placing */

/* ---- overlaps from a source ---- */

void kvr_sched_set_overlap_source(kvr_sched_t *s, const kvr_overlap_source_t *src)
{
    s->src = src != NULL ? *src : (kvr_overlap_source_t){0};
}

size_t kvr_sched_awaiting(const kvr_sched_t *s) { return s->n_awaiting; }

bool kvr_sched_has_overlap_source(const kvr_sched_t *s) { return s->src.lookup != NULL; }

static void await_unlink(kvr_sched_t *s, entry_t *e)
{
    if (e->prev != NULL)
        e->prev->next = e->next;
    else
        s->awaiting = e->next;
    if (e->next != NULL)
        e->next->prev = e->prev;
    e->prev = e->next = NULL;
    s->n_awaiting--;
}

/* An entry with its overlaps: routed now, queued while busy (or during the start-up wait), or
 * its client told the outcome. */
static void place_entry(kvr_sched_t *s, entry_t *e, uint64_t now_ms)
{
    kvr_sched_done_fn done = e->done;
    void *arg = e->arg;
    kvr_route_res_t res;
    memset(&res, 0, sizeof res);
    kvr_ticket_t t;
    bool may_wait = e->q.update_state;
    bool may_queue = s->cfg.queue && may_wait;
    int rc;
    if ((may_wait && !warm(s)) || (may_queue && kvr_queue_len(s->queue) > 0)) {
        rc = enqueue_entry(s, e, now_ms, &t); /* the wait, or a backlog not to overtake */
        if (rc == KVR_OK)
            return;
        done(arg, rc, &res);
        return;
    }
    rc = kvr_router_route(s->r, &e->q, now_ms, &res);
    if (rc == KVR_EBUSY && may_queue) {
        rc = enqueue_entry(s, e, now_ms, &t);
        if (rc == KVR_OK)
            return;
        done(arg, rc, &res);
        return;
    }
    if (rc == KVR_OK)
        notify_routed(s, &res);
    entry_free(e);
    done(arg, rc, &res);
}

/* The source's answer for entry ctx. */
static void on_overlaps(void *ctx, int status, const kvr_match_t *m, size_t n, uint64_t now_ms)
{
    entry_t *e = ctx;
    kvr_sched_t *s = e->sched;
    await_unlink(s, e);
    if (e->cancelled) {
        entry_free(e);
        return;
    }
    e->q.has_matches = true;
    e->q.matches = NULL;
    e->q.n_matches = 0;
    if (status == KVR_OK && n > 0) {
        e->matches = malloc(n * sizeof *m);
        if (e->matches != NULL) { /* out of memory: zero overlap, as a failed lookup */
            memcpy(e->matches, m, n * sizeof *m);
            e->q.matches = e->matches;
            e->q.n_matches = n;
        }
    }
    place_entry(s, e, now_ms);
}

/* Starts the source's lookup for p: KVR_OK with *ticket, or an error (nothing started). */
static int await_overlaps(kvr_sched_t *s, const kvr_place_t *p, kvr_ticket_t *ticket)
{
    entry_t *e = NULL;
    int rc = entry_new(s, p, &e);
    if (rc != KVR_OK)
        return rc;
    e->sched = s;
    e->ticket = AWAIT_TICKET_BIT | ++s->next_ticket;
    e->next = s->awaiting;
    if (s->awaiting != NULL)
        s->awaiting->prev = e;
    s->awaiting = e;
    s->n_awaiting++;
    rc = s->src.lookup(s->src.arg, &e->q, on_overlaps, e);
    if (rc != KVR_OK) {
        await_unlink(s, e);
        entry_free(e);
        return rc;
    }
    *ticket = e->ticket;
    return KVR_OK;
}

int kvr_sched_place(kvr_sched_t *s, const kvr_place_t *p, uint64_t now_ms, kvr_route_res_t *res,
                    kvr_ticket_t *ticket)
{
    *ticket = 0;
    saw_time(s, now_ms);
    if (s->src.lookup != NULL && p->done != NULL && !p->q->has_matches &&
        await_overlaps(s, p, ticket) == KVR_OK)
        return KVR_OK;
    bool may_wait = p->q->update_state && p->done != NULL;
    if (may_wait && !warm(s))
        return enqueue(s, p, now_ms, ticket); /* the start-up wait */
    if (!s->cfg.queue && s->queue != NULL && kvr_queue_len(s->queue) > 0)
        kvr_sched_dispatch(s, now_ms, KVR_SCHED_BY_EVENT); /* the wait's requests go first */
    bool may_queue = s->cfg.queue && may_wait;
    int rc;
    if (may_queue && kvr_queue_len(s->queue) > 0) { /* arrivals do not overtake a backlog */
        memset(res, 0, sizeof *res);
        rc = KVR_EBUSY;
    } else {
        rc = kvr_router_route(s->r, p->q, now_ms, res);
    }
    if (rc == KVR_OK) {
        notify_routed(s, res);
        return KVR_OK;
    }
    if (rc == KVR_EBUSY && may_queue)
        rc = enqueue(s, p, now_ms, ticket);
    return rc;
}

bool kvr_sched_cancel(kvr_sched_t *s, kvr_ticket_t t)
{
    if (t & AWAIT_TICKET_BIT) {
        for (entry_t *a = s->awaiting; a != NULL; a = a->next)
            if (a->ticket == t && !a->cancelled) {
                a->cancelled = true; /* freed when the source answers */
                return true;
            }
        return false;
    }
    kvr_queue_entry_t e;
    if (s->queue == NULL || t == 0 || kvr_queue_remove(s->queue, t, &e) != KVR_OK)
        return false;
    entry_free(e.item.user);
    return true;
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch */

/* One pass: places queued requests, best first, until the best one is still busy. */
static void dispatch_pass(kvr_sched_t *s, uint64_t now_ms)
{
    kvr_queue_entry_t qe;
    while (kvr_queue_peek(s->queue, &qe) == KVR_OK) {
        entry_t *e = qe.item.user;
        assert(e->done != NULL && e->q.hashed);
        kvr_route_res_t res;
        int rc = kvr_router_route(s->r, &e->q, now_ms, &res);
        if (rc == KVR_EBUSY && s->cfg.queue)
            break; /* still busy: wait for the next change (without the queue, the start-up
                      wait's requests get their answer) */
        (void)kvr_queue_pop(s->queue, &qe);
        s->dispatched[s->why]++;
        if (rc == KVR_OK)
            notify_routed(s, &res);
        kvr_sched_done_fn done = e->done;
        void *arg = e->arg;
        entry_free(e);
        done(arg, rc, &res); /* may re-enter (returns at once); the loop peeks again */
    }
}

void kvr_sched_dispatch(kvr_sched_t *s, uint64_t now_ms, kvr_sched_trigger_t why)
{
    saw_time(s, now_ms);
    if (s->queue == NULL || !warm(s))
        return;
    if (s->dispatching)
        return; /* re-entered from a callback: the running pass peeks again after it */
    s->dispatching = true;
    s->why = why;
    dispatch_pass(s, now_ms);
    s->dispatching = false;
}

static void expire_queue(kvr_sched_t *s, uint64_t now_ms)
{
    kvr_queue_entry_t qe;
    while (kvr_queue_expire(s->queue, now_ms, &qe) == KVR_OK) {
        entry_t *e = qe.item.user;
        kvr_sched_done_fn done = e->done;
        void *arg = e->arg;
        int rc = e->warmup ? KVR_ENOWORKER : KVR_EBUSY;
        entry_free(e);
        done(arg, rc, NULL);
    }
}

void kvr_sched_tick(kvr_sched_t *s, uint64_t now_ms)
{
    saw_time(s, now_ms);
    kvr_router_tick(s->r, now_ms);
    if (s->queue == NULL)
        return;
    expire_queue(s, now_ms);
    kvr_sched_dispatch(s, now_ms, KVR_SCHED_BY_TICK);
}

/* ---------------------------------------------------------------------------------------- */
/* Lifecycle */

static int apply_to_router(kvr_sched_t *s, const kvr_sched_event_t *ev, uint64_t now_ms)
{
    bool h = ev->handle != KVR_REQ_HANDLE_NONE;
    switch (ev->kind) {
    case KVR_SCHED_FIRST_TOKEN:
        return h ? kvr_router_first_token_h(s->r, ev->handle, now_ms)
                 : kvr_router_first_token(s->r, ev->id, ev->id_len, now_ms);
    case KVR_SCHED_OUTPUT_BLOCK:
        return h ? kvr_router_output_block_h(s->r, ev->handle, ev->decay_fraction, now_ms)
                 : kvr_router_output_block(s->r, ev->id, ev->id_len, ev->decay_fraction, now_ms);
    case KVR_SCHED_FREE:
        return h ? kvr_router_free_h(s->r, ev->handle, now_ms)
                 : kvr_router_free_request(s->r, ev->id, ev->id_len, now_ms);
    default:
        return KVR_EINVAL; /* ROUTED is told, never applied */
    }
}

int kvr_sched_apply(kvr_sched_t *s, const kvr_sched_event_t *ev, uint64_t now_ms)
{
    if (ev == NULL || (ev->origin != KVR_SCHED_ORIGIN_LOCAL && ev->origin != KVR_SCHED_ORIGIN_PEER))
        return KVR_EINVAL;
    /* observers get the id of an event by handle (replica sync publishes ids): copied first,
     * since a free takes it with the request */
    char idbuf[KVR_LOAD_MAX_ID_BYTES];
    kvr_sched_event_t named = *ev;
    const char *id;
    if (s->n_named > 0 && ev->id == NULL && ev->handle != KVR_REQ_HANDLE_NONE &&
        kvr_load_handle_id(kvr_router_load(s->r), ev->handle, &id, &named.id_len) == KVR_OK) {
        memcpy(idbuf, id, named.id_len);
        named.id = idbuf;
    }
    int rc = apply_to_router(s, ev, now_ms);
    if (rc != KVR_OK)
        return rc;
    s->applied[ev->origin]++;
    notify(s, &named);
    kvr_sched_dispatch(s, now_ms, KVR_SCHED_BY_EVENT); /* a load may have gone down */
    return KVR_OK;
}

int kvr_sched_admit_peer(kvr_sched_t *s, const kvr_load_request_t *lr, uint64_t now_ms,
                         kvr_req_handle_t *handle)
{
    int rc = kvr_router_admit(s->r, lr, now_ms, handle);
    if (rc != KVR_OK)
        return rc;
    s->applied[KVR_SCHED_ORIGIN_PEER]++;
    kvr_sched_event_t ev = {.kind = KVR_SCHED_ROUTED,
                            .origin = KVR_SCHED_ORIGIN_PEER,
                            .handle = *handle,
                            .id = lr->id,
                            .id_len = lr->id_len,
                            .decay_fraction = NAN,
                            .booking = lr};
    notify(s, &ev);
    return KVR_OK;
}

static int apply_local(kvr_sched_t *s, kvr_sched_kind_t kind, kvr_req_handle_t h, double decay,
                       uint64_t now_ms)
{
    if (h == KVR_REQ_HANDLE_NONE)
        return KVR_EINVAL;
    kvr_sched_event_t ev = {.kind = kind, .handle = h, .decay_fraction = decay};
    return kvr_sched_apply(s, &ev, now_ms);
}

int kvr_sched_first_token(kvr_sched_t *s, kvr_req_handle_t h, uint64_t now_ms)
{
    return apply_local(s, KVR_SCHED_FIRST_TOKEN, h, NAN, now_ms);
}

int kvr_sched_output_block(kvr_sched_t *s, kvr_req_handle_t h, double decay_fraction,
                           uint64_t now_ms)
{
    return apply_local(s, KVR_SCHED_OUTPUT_BLOCK, h, decay_fraction, now_ms);
}

int kvr_sched_release(kvr_sched_t *s, kvr_req_handle_t h, uint64_t now_ms)
{
    return apply_local(s, KVR_SCHED_FREE, h, NAN, now_ms);
}

/* ---------------------------------------------------------------------------------------- */
/* Observers and figures */

static int observe(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg, bool named)
{
    if (fn == NULL)
        return KVR_EINVAL;
    if (s->n_obs == KVR_SCHED_MAX_OBSERVERS)
        return KVR_EFULL;
    s->obs[s->n_obs++] = (observer_t){fn, arg, named};
    s->n_named += named;
    return KVR_OK;
}

int kvr_sched_observe(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg)
{
    return observe(s, fn, arg, false);
}

int kvr_sched_observe_named(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg)
{
    return observe(s, fn, arg, true);
}

void kvr_sched_unobserve(kvr_sched_t *s, kvr_sched_observer_fn fn, void *arg)
{
    for (size_t i = 0; i < s->n_obs; i++) {
        if (s->obs[i].fn == fn && s->obs[i].arg == arg) {
            s->n_named -= s->obs[i].named;
            memmove(&s->obs[i], &s->obs[i + 1], (s->n_obs - i - 1) * sizeof s->obs[0]);
            s->n_obs--;
            return;
        }
    }
}

void kvr_sched_stats(const kvr_sched_t *s, kvr_sched_stats_t *out)
{
    memset(out, 0, sizeof *out);
    out->queue_on = s->queue != NULL;
    if (s->queue != NULL)
        kvr_queue_stats(s->queue, &out->queue);
    memcpy(out->dispatched, s->dispatched, sizeof out->dispatched);
    memcpy(out->applied, s->applied, sizeof out->applied);
}

size_t kvr_sched_queued(const kvr_sched_t *s) { return s->queue ? kvr_queue_len(s->queue) : 0; }

int kvr_sched_verify(const kvr_sched_t *s, char *msg, size_t msg_len)
{
    if (s->queue == NULL) {
        if (s->dispatched[0] + s->dispatched[1] != 0) {
            snprintf(msg, msg_len, "dispatched without a queue");
            return KVR_EINVAL;
        }
        return KVR_OK;
    }
    int rc = kvr_queue_verify(s->queue, msg, msg_len);
    if (rc != KVR_OK)
        return rc;
    kvr_queue_stats_t qs;
    kvr_queue_stats(s->queue, &qs);
    if (s->dispatched[0] + s->dispatched[1] != qs.dispatched) {
        snprintf(msg, msg_len, "dispatched by trigger %llu + %llu != queue's %llu",
                 (unsigned long long)s->dispatched[0], (unsigned long long)s->dispatched[1],
                 (unsigned long long)qs.dispatched);
        return KVR_EINVAL;
    }
    if (s->dispatching) {
        snprintf(msg, msg_len, "a dispatch pass is marked running outside any call");
        return KVR_EINVAL;
    }
    return KVR_OK;
}
