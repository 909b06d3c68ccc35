/*
 * indexer_server.c: `kvrouter indexer`'s daemon (API, access, start-up order and threads in
 * indexer_server.h). The registry is two flat arrays (partitions, registrations) scanned
 * linearly: a fleet has a handful of partitions and at most thousands of ranks, and every
 * scan is on a registration, an unregistration or a listing, never on a query (a query finds
 * its partition among the handful, then only touches the index).
 *
 * Invariants: n_parts <= max_partitions; reserved == the sum of the partitions' max_pairs
 * <= max_total_pairs (so the pairs of every index together stay under max_total_pairs: each
 * index evicts beyond its own max_pairs); a partition's regs == the registrations naming it;
 * a registration's part is live. The pair budget is reserved, not shared on demand: an index's
 * budget is fixed when it is made, and a partition that could grow into another's share would
 * have to be shrunk, which the index cannot do. Reserving min(max_pairs, what is left) keeps a
 * single partition at its full size and turns the budget into a refusal (400 naming
 * --max-total-pairs) for the partition that does not fit, never into eviction elsewhere.
 * The reaper (every REAP_MS, on the loop) drops a partition with no registration whose index
 * holds no pair and no recorded decision: partitions made by decisions (approximate mode) go
 * once their decisions expire, so names nobody registers cannot fill the cap for good.
 *
 * Peer recovery reads only bounded answers (kvr_http_fetch's max_bytes, and the format's first
 * bytes): a partitions list at most PARTITION_ENTRY_BYTES per partition this side may hold; a
 * snapshot at most SNAP_BYTES_PER_PAIR per pair its partition may keep, plus the largest rank
 * table; a JSON dump at most DUMP_BYTES_PER_PAIR per pair of every partition that could be
 * made; none over PEER_ANSWER_MAX_BYTES (4 GiB, the one bound there was before). A peer
 * sending more is refused unread past that (cold start, counted, logged).
 *
 * A peer's registrations (its GET /workers, read by ix_peer_regs.c) are subscribed here before
 * its index is fetched, so that their live events queue from then on (as --workers' do) and a
 * rank with a replay socket resumes from the snapshot's cursor (kvr_ingest_load_all_mem). They
 * are bounded like the rest: PART_MAX_RANKS entries of WORKERS_BYTES_PER_RANK per partition
 * asked about. An instance --workers registers in a partition is not taken from the peer
 * there (the command line wins). What the recovered index holds of a rank no registration
 * here follows goes stale (no events update it): such ranks are kept in `stale` (a gauge, a
 * /health line) until a registration follows them or their partition goes.
 *
 * Cost: a registration, a partition made or dropped: O(partitions + registrations + stale
 * ranks); the reaper: one stats copy per partition a tick; a query: the partition lookup and
 * the index's. Start-up with a peer adds one pass over each answer and, per recovered rank, a
 * look for its registration.
 */
#include "indexer/indexer_server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "kvrouter/router.h"
#include "http/http.h"
#include "events/ingest.h"
#include "indexer/ix_api.h"
#include "indexer/ix_peer_regs.h"
#include "base/log.h"
#include "wire/api_json.h"
#include "wire/index_snapshot.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/prom.h"
#include "wire/router_event_json.h"

#define NAME_BYTES 256
#define REAP_MS 250
/* What a peer's answer may legitimately be (see the module comment). A partitions entry is
 * {"model_name":"<255>","routing_group":"<255>","block_size":65536} (names with escapes are
 * refused); a snapshot event stores one block in 36 bytes, and a pair has up to 4 tiers; a
 * dump event of one block is ~300 bytes of JSON. */
#define PARTITION_ENTRY_BYTES 1024
#define SNAP_BYTES_PER_PAIR 160
#define SNAP_FIXED_BYTES ((size_t)KVR_SNAP_MAX_RANKS * 32 + 65536)
#define DUMP_BYTES_PER_PAIR 400
#define PEER_ANSWER_MAX_BYTES ((size_t)4 << 30) /* and never more than before the bounds */
/* (instance, dp_rank) listeners a partition's ingest keeps; and what GET /workers writes for
 * one: its endpoints, replay endpoints and listener entries (~1 KiB with 255-byte addresses
 * and the longest last_error), and, for an instance of that one rank, its names (255 bytes
 * each, up to 6x when escaped) and fields. */
#define PART_MAX_RANKS KVR_IX_PART_MAX_RANKS
#define WORKERS_BYTES_PER_RANK 4608

/* per_pair bytes for each of pairs, plus fixed, within PEER_ANSWER_MAX_BYTES. */
static size_t answer_bound(size_t pairs, size_t per_pair, size_t fixed)
{
    size_t room = (PEER_ANSWER_MAX_BYTES - fixed) / per_pair;
    return pairs < room ? pairs * per_pair + fixed : PEER_ANSWER_MAX_BYTES;
}

typedef struct part {
    char model[NAME_BYTES], group[NAME_BYTES];
    uint32_t block_size;
    size_t max_pairs; /* its index's budget, reserved from max_total_pairs */
    size_t regs;      /* registrations naming it */
    kvr_index_t *ix;
    kvr_ingest_t *g;
    bool started;
    uint64_t recovered_events, recovered_rejected;
} part_t;

/* One (instance, dp_rank) registration. */
typedef struct reg {
    uint64_t id;
    uint32_t rank;
    part_t *part;
    char endpoint[KVR_ADDR_BYTES], replay[KVR_ADDR_BYTES];
} reg_t;

/* A rank the index recovered from a peer holds and no registration here follows: nothing
 * updates what the index holds of it (kvr_indexer_stale_ranks, /health). */
typedef struct stale_rank {
    const part_t *part;
    uint64_t id;
    uint32_t rank;
} stale_rank_t;

typedef struct ix_stats {
    uint64_t registered, register_conflicts, register_refused;
    uint64_t unregistered, unregister_unknown;
    uint64_t parts_made, parts_dropped, parts_refused_cap, parts_refused_budget;
    uint64_t records_full; /* decisions refused: the partition's index has no rank slot left */
    uint64_t unauthorized;
    uint64_t peer_failures; /* peers whose index was not read at start */
    uint64_t peer_regs_failures; /* peers whose registrations were not read at start */
    uint64_t peer_regs_subscribed, peer_regs_known, peer_regs_refused; /* theirs, taken how */
} ix_stats_t;

struct kvr_indexer {
    struct event_base *base;
    struct evhttp *http;
    kvr_http_guard_t *guard;
    uint16_t port;
    kvr_indexer_config_t cfg;
    bool running; /* past start-up: new partitions start their ingest at once */
    part_t **parts;
    size_t n_parts, cap_parts;
    size_t reserved; /* the partitions' max_pairs, summed */
    struct event *reaper;
    kvr_access_t access;
    kvr_ratelimit_t rl_parts, rl_auth, rl_records;
    reg_t *regs;
    size_t n_regs, cap_regs;
    char *peers[KVR_INDEXER_MAX_PEERS];
    size_t n_peers;
    kvr_ix_api_t *api;
    kvr_api_decoder_t *dec;
    kvr_json_writer_t w;
    kvr_prom_t prom;
    kvr_reply_t rep; /* over w, the indexer's error shape */
    char origin[600];
    bool recovered_at_start; /* --peers given: /health tells how the index and registrations
                                began */
    char regs_origin[700];   /* what the peers' registrations gave */
    stale_rank_t *stale;     /* see stale_rank_t */
    size_t n_stale, cap_stale;
    ix_stats_t st;
};

/* ---- partitions ----------------------------------------------------------------------- */

/* A name of n bytes (not NUL-terminated) for a message: at most 60 bytes of it (ix_api's
 * messages are 200 bytes: the cap comes first, then the names). */
#define p_name(s, n) (int)((n) < 60 ? (n) : 60), (s)

static part_t *part_find(kvr_indexer_t *x, const char *model, size_t ml, const char *group,
                         size_t gl)
{
    for (size_t i = 0; i < x->n_parts; i++) {
        part_t *p = x->parts[i];
        if (strlen(p->model) == ml && memcmp(p->model, model, ml) == 0 && strlen(p->group) == gl &&
            memcmp(p->group, group, gl) == 0)
            return p;
    }
    return NULL;
}

static void part_free(part_t *p)
{
    if (p == NULL)
        return;
    kvr_ingest_free(p->g);
    kvr_index_free(p->ix);
    free(p);
}

static int part_start(part_t *p)
{
    if (p->started)
        return KVR_OK;
    int rc = kvr_ingest_start(p->g);
    p->started = rc == KVR_OK;
    return rc;
}

/* The pairs a new partition would reserve now: min(max_pairs, what is left of the budget), or
 * 0 when less than KVR_INDEXER_MIN_PAIRS is left. */
static size_t part_share(const kvr_indexer_t *x)
{
    size_t left = x->cfg.max_total_pairs - x->reserved;
    size_t want = x->cfg.max_pairs < left ? x->cfg.max_pairs : left;
    return want >= KVR_INDEXER_MIN_PAIRS || want == x->cfg.max_pairs ? want : 0;
}

/* The partition, made (and, once running, started) when new; a block size other than the
 * partition's is refused with both sizes in err (KVR_EMISMATCH), a partition beyond
 * max_partitions or max_total_pairs with the cap named (KVR_EFULL, counted and logged). */
static part_t *part_get(kvr_indexer_t *x, const char *model, size_t ml, const char *group,
                        size_t gl, uint32_t block_size, char *err, size_t err_len, int *status)
{
    int dummy;
    status = status != NULL ? status : &dummy;
    *status = KVR_OK;
    part_t *p = part_find(x, model, ml, group, gl);
    if (p != NULL) {
        if (p->block_size != block_size) {
            snprintf(err, err_len,
                     "block_size %u does not match the block size %u of model_name=%.200s "
                     "routing_group=%.200s (fixed by its first registration)",
                     block_size, p->block_size, p->model, p->group);
            *status = KVR_EMISMATCH;
            return NULL;
        }
        return p;
    }
    if (ml >= NAME_BYTES || gl >= NAME_BYTES) {
        snprintf(err, err_len, "model_name and routing_group: at most %d bytes each",
                 NAME_BYTES - 1);
        *status = KVR_EINVAL;
        return NULL;
    }
    size_t share = part_share(x);
    if (x->n_parts >= x->cfg.max_partitions || share == 0) {
        bool cap = x->n_parts >= x->cfg.max_partitions;
        if (cap)
            snprintf(err, err_len,
                     "--max-partitions %zu reached: no partition for model_name=%.*s "
                     "routing_group=%.*s (one with no registration goes once its index is "
                     "empty)",
                     x->cfg.max_partitions, p_name(model, ml), p_name(group, gl));
        else
            snprintf(err, err_len,
                     "--max-total-pairs %zu reached (%zu partitions reserve %zu pairs, "
                     "--max-pairs %zu each): no partition for model_name=%.*s routing_group=%.*s",
                     x->cfg.max_total_pairs, x->n_parts, x->reserved, x->cfg.max_pairs,
                     p_name(model, ml), p_name(group, gl));
        cap ? x->st.parts_refused_cap++ : x->st.parts_refused_budget++;
        kvr_log_limited(&x->rl_parts, KVR_LOG_WARN, "%s", err);
        *status = KVR_EFULL;
        return NULL;
    }
    if (kvr_grow((void **)&x->parts, &x->cap_parts, x->n_parts + 1, SIZE_MAX, sizeof *x->parts) !=
        KVR_OK)
        goto oom;
    p = calloc(1, sizeof *p);
    if (p == NULL)
        goto oom;
    memcpy(p->model, model, ml);
    memcpy(p->group, group, gl);
    p->block_size = block_size;
    p->max_pairs = share;
    int st = KVR_OK;
    kvr_index_config_t ic = {.max_pairs = share};
    p->ix = kvr_index_new(&ic, &st);
    kvr_ingest_config_t gc = {.block_size = block_size,
                              .approx_ttl_ms = x->cfg.decision_ttl_ms,
                              .max_ranks = PART_MAX_RANKS};
    p->g = p->ix ? kvr_ingest_new(p->ix, &gc, &st) : NULL;
    if (p->g == NULL || (x->running && part_start(p) != KVR_OK)) {
        part_free(p);
        goto oom;
    }
    x->parts[x->n_parts++] = p;
    x->reserved += share;
    x->st.parts_made++;
    kvr_log(KVR_LOG_INFO, "partition model_name=%s routing_group=%s: block size %u, %zu pairs",
            p->model, p->group, block_size, share);
    return p;
oom:
    snprintf(err, err_len, "out of memory making the partition's index");
    *status = KVR_ENOMEM;
    return NULL;
}

/* The stale ranks of partition p (all of them, or rank (id, rank)) are stale no more: a
 * registration follows the rank now, or the partition goes. */
static void stale_forget(kvr_indexer_t *x, const part_t *p, bool all, uint64_t id, uint32_t rank)
{
    for (size_t i = 0; i < x->n_stale;) {
        const stale_rank_t *k = &x->stale[i];
        if (k->part == p && (all || (k->id == id && k->rank == rank)))
            x->stale[i] = x->stale[--x->n_stale];
        else
            i++;
    }
}

/* Drops parts[i] (no registration names it) and gives its reservation back. */
static void part_drop(kvr_indexer_t *x, size_t i)
{
    part_t *p = x->parts[i];
    stale_forget(x, p, true, 0, 0);
    x->parts[i] = x->parts[--x->n_parts];
    x->reserved -= p->max_pairs;
    x->st.parts_dropped++;
    kvr_log_limited(&x->rl_parts, KVR_LOG_INFO,
                    "partition model_name=%s routing_group=%s dropped: no registration, nothing "
                    "in its index",
                    p->model, p->group);
    part_free(p);
}

/* Every REAP_MS: the partitions nobody registers and whose index is empty (their recorded
 * decisions expired, their last rank unregistered) go. The stats are the ingest thread's
 * snapshot, republished after every command and every 100 ms: one older than a decision
 * recorded since cannot say empty (the command republished it), so a live partition is never
 * dropped; an empty one may be seen a tick late. */
static void on_reap(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    kvr_indexer_t *x = arg;
    for (size_t i = 0; i < x->n_parts;) {
        part_t *p = x->parts[i];
        bool empty = false;
        if (p->regs == 0) {
            kvr_ingest_stats_t gs;
            kvr_ingest_stats(p->g, &gs);
            empty = gs.index.pairs == 0 && gs.recorded_pairs == 0;
        }
        if (empty)
            part_drop(x, i);
        else
            i++;
    }
}

/* ---- registrations -------------------------------------------------------------------- */

static reg_t *reg_find(kvr_indexer_t *x, const part_t *part, uint64_t id, uint32_t rank)
{
    for (size_t i = 0; i < x->n_regs; i++)
        if (x->regs[i].part == part && x->regs[i].id == id && x->regs[i].rank == rank)
            return &x->regs[i];
    return NULL;
}

static bool endpoint_ok(const char *s, size_t n)
{
    static const char *const schemes[] = {"tcp://", "ipc://", "inproc://"};
    if (n == 0 || n >= KVR_ADDR_BYTES)
        return false;
    for (size_t i = 0; i < 3; i++) {
        size_t k = strlen(schemes[i]);
        if (n > k && strncmp(s, schemes[i], k) == 0)
            return true;
    }
    return false;
}

/* A registration: KVR_OK; KVR_EINVAL (err: a bad endpoint or block size), KVR_EEXIST. */
static int do_register(kvr_indexer_t *x, const kvr_ix_register_t *r, char *err, size_t err_len)
{
    if (!endpoint_ok(r->endpoint, r->endpoint_len) ||
        (r->replay_endpoint != NULL && !endpoint_ok(r->replay_endpoint, r->replay_endpoint_len))) {
        snprintf(err, err_len, "%s: must be a tcp://, ipc:// or inproc:// address under %d bytes",
                 endpoint_ok(r->endpoint, r->endpoint_len) ? "replay_endpoint" : "endpoint",
                 KVR_ADDR_BYTES);
        return KVR_EINVAL;
    }
    int st;
    part_t *p = part_get(x, r->model_name, r->model_name_len, r->routing_group,
                         r->routing_group_len, r->block_size, err, err_len, &st);
    if (p == NULL)
        return st == KVR_ENOMEM ? KVR_ENOMEM : KVR_EINVAL;
    if (reg_find(x, p, r->instance_id, r->dp_rank) != NULL) {
        snprintf(err, err_len,
                 "instance_id %llu dp_rank %u is already registered for model_name=%.200s "
                 "routing_group=%.200s",
                 (unsigned long long)r->instance_id, r->dp_rank, p->model, p->group);
        return KVR_EEXIST;
    }
    if (kvr_grow((void **)&x->regs, &x->cap_regs, x->n_regs + 1, SIZE_MAX, sizeof *x->regs) !=
        KVR_OK) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    kvr_worker_spec_t sp = {.worker_id = r->instance_id,
                            .dp_size = 1,
                            .dp_start = r->dp_rank,
                            .block_size = p->block_size};
    memcpy(sp.events, r->endpoint, r->endpoint_len);
    if (r->replay_endpoint != NULL)
        memcpy(sp.replay, r->replay_endpoint, r->replay_endpoint_len);
    int rc = kvr_ingest_subscribe(p->g, &sp, err, err_len);
    if (rc != KVR_OK)
        return rc == KVR_EEXIST ? KVR_EINVAL : rc;
    reg_t *g = &x->regs[x->n_regs++];
    *g = (reg_t){.id = r->instance_id, .rank = r->dp_rank, .part = p};
    p->regs++;
    stale_forget(x, p, false, r->instance_id, r->dp_rank);
    memcpy(g->endpoint, sp.events, sizeof g->endpoint);
    memcpy(g->replay, sp.replay, sizeof g->replay);
    kvr_log(KVR_LOG_INFO,
            "registered instance %llu dp_rank %u (%s%s%s) for model_name=%s "
            "routing_group=%s",
            (unsigned long long)r->instance_id, r->dp_rank, g->endpoint,
            g->replay[0] ? ", replay " : "", g->replay, p->model, p->group);
    return KVR_OK;
}

static void reg_remove_at(kvr_indexer_t *x, size_t i)
{
    reg_t *g = &x->regs[i];
    part_t *p = g->part;
    (void)kvr_ingest_remove_rank(p->g, (kvr_worker_t){g->id, g->rank});
    p->regs--;
    kvr_log(KVR_LOG_INFO,
            "unregistered instance %llu dp_rank %u from model_name=%s "
            "routing_group=%s",
            (unsigned long long)g->id, g->rank, p->model, p->group);
    x->regs[i] = x->regs[--x->n_regs];
}

/* The registrations matching u removed: how many. */
static size_t do_unregister(kvr_indexer_t *x, const kvr_ix_unregister_t *u)
{
    size_t removed = 0;
    for (size_t i = 0; i < x->n_regs;) {
        const reg_t *g = &x->regs[i];
        const part_t *p = g->part;
        bool match = g->id == u->instance_id && strlen(p->model) == u->model_name_len &&
                     memcmp(p->model, u->model_name, u->model_name_len) == 0 &&
                     (u->routing_group == NULL ||
                      (strlen(p->group) == u->routing_group_len &&
                       memcmp(p->group, u->routing_group, u->routing_group_len) == 0)) &&
                     (!u->has_dp_rank || g->rank == u->dp_rank);
        if (!match) {
            i++;
            continue;
        }
        reg_remove_at(x, i);
        removed++;
    }
    return removed;
}

/* ---- replies -------------------------------------------------------------------------- */

/* The indexer's error shape: {"error": "message"} (the reference indexer's). */
static void ix_error(kvr_json_writer_t *w, const char *msg, const char *type, int code)
{
    (void)type;
    (void)code;
    kvr_ix_api_error_body(w, msg);
}

static const kvr_reply_style_t ix_style = {.error = ix_error,
                                           .oom_body = "{\"error\":\"out of memory\"}"};

static void reply(void *arg, struct evhttp_request *req, int code, const char *ctype,
                  const char *data, size_t len)
{
    kvr_indexer_t *x = arg;
    kvr_reply_body(&x->rep, req, code, ctype, data, len);
}

static void reply_writer(kvr_indexer_t *x, struct evhttp_request *req, int code)
{
    kvr_reply_writer(&x->rep, req, code);
}

static void reply_error(kvr_indexer_t *x, struct evhttp_request *req, int code, const char *msg)
{
    kvr_reply_error(&x->rep, req, code, NULL, "%s", msg);
}

static void reply_ok(kvr_indexer_t *x, struct evhttp_request *req, int code)
{
    kvr_json_writer_reset(&x->w);
    kvr_json_begin_object(&x->w);
    kvr_json_key(&x->w, "status");
    kvr_json_string(&x->w, "ok");
    kvr_json_end_object(&x->w);
    reply_writer(x, req, code);
}

/* ---- handlers ------------------------------------------------------------------------- */

static void h_register(kvr_indexer_t *x, struct evhttp_request *req)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_ix_register_t r;
    if (kvr_api_decode_ix_register(x->dec, body, len, &r) != KVR_OK) {
        x->st.register_refused++;
        reply_error(x, req, 400, kvr_api_decoder_error(x->dec));
        return;
    }
    char err[600] = "";
    int rc = do_register(x, &r, err, sizeof err);
    if (rc == KVR_OK) {
        x->st.registered++;
        reply_ok(x, req, 201);
        return;
    }
    if (rc == KVR_EEXIST)
        x->st.register_conflicts++;
    else
        x->st.register_refused++;
    reply_error(x, req, rc == KVR_EEXIST ? 409 : rc == KVR_ENOMEM ? 500 : 400, err);
}

/* The partitions matching u whose recorded decisions (approximate mode) of the instance were
 * dropped: how many. */
static size_t forget_recorded(kvr_indexer_t *x, const kvr_ix_unregister_t *u)
{
    size_t n = 0;
    for (size_t i = 0; i < x->n_parts; i++) {
        const part_t *p = x->parts[i];
        bool match = strlen(p->model) == u->model_name_len &&
                     memcmp(p->model, u->model_name, u->model_name_len) == 0 &&
                     (u->routing_group == NULL ||
                      (strlen(p->group) == u->routing_group_len &&
                       memcmp(p->group, u->routing_group, u->routing_group_len) == 0));
        if (match && kvr_ingest_forget(p->g, u->instance_id, u->has_dp_rank, u->dp_rank) == KVR_OK)
            n++;
    }
    return n;
}

static void h_unregister(kvr_indexer_t *x, struct evhttp_request *req)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_ix_unregister_t u;
    if (kvr_api_decode_ix_unregister(x->dec, body, len, &u) != KVR_OK) {
        reply_error(x, req, 400, kvr_api_decoder_error(x->dec));
        return;
    }
    size_t removed = do_unregister(x, &u);
    if (removed + forget_recorded(x, &u) == 0) {
        x->st.unregister_unknown++;
        char msg[700];
        snprintf(msg, sizeof msg, "instance_id %llu is not registered for model_name=%s%s%s",
                 (unsigned long long)u.instance_id, u.model_name,
                 u.routing_group ? " routing_group=" : "", u.routing_group ? u.routing_group : "");
        reply_error(x, req, 404, msg);
        return;
    }
    x->st.unregistered++;
    reply_ok(x, req, 200);
}

/* A listener's status as the reference names them, and its last error. */
static const char *listener_status(const kvr_rank_status_t *st, char *why, size_t why_len)
{
    why[0] = '\0';
    switch (st->state) {
    case KVR_RANK_NO_EVENTS:
        return "pending";
    case KVR_RANK_ERROR:
        snprintf(why, why_len, "block size mismatch: the engine sends blocks of %u tokens",
                 st->engine_block_size);
        return "failed";
    case KVR_RANK_UNREACHABLE:
        snprintf(why, why_len, "events connection lost");
        return "failed";
    default:
        return "active";
    }
}

static int status_rank(const char *s)
{
    return strcmp(s, "failed") == 0 ? 2 : strcmp(s, "pending") == 0 ? 1 : 0;
}

static void write_listener(kvr_json_writer_t *w, const part_t *p, const reg_t *g,
                           const char **worst)
{
    kvr_rank_status_t st;
    memset(&st, 0, sizeof st);
    (void)kvr_ingest_rank_status(p->g, (kvr_worker_t){g->id, g->rank}, &st);
    char why[160];
    const char *s = listener_status(&st, why, sizeof why);
    if (status_rank(s) > status_rank(*worst))
        *worst = s;
    char key[16];
    snprintf(key, sizeof key, "%u", g->rank);
    kvr_json_key(w, key);
    kvr_json_begin_object(w);
    kvr_json_key(w, "endpoint");
    kvr_json_string(w, g->endpoint);
    kvr_json_key(w, "status");
    kvr_json_string(w, s);
    if (why[0] != '\0') {
        kvr_json_key(w, "last_error");
        kvr_json_string(w, why);
    }
    kvr_json_key(w, "index_state");
    kvr_json_string(w, kvr_rank_state_name(st.state));
    kvr_json_key(w, "events_applied");
    kvr_json_u64(w, st.events_applied);
    kvr_json_key(w, "index_blocks");
    kvr_json_u64(w, st.index_blocks);
    kvr_json_end_object(w);
}

/* {"<dp_rank>": address} of the instance of regs[first] (its events, or replay, addresses;
 * ranks without a replay address are left out of the latter). */
static void write_endpoints(kvr_indexer_t *x, size_t first, bool replay)
{
    const reg_t *g0 = &x->regs[first];
    kvr_json_begin_object(&x->w);
    for (size_t i = first; i < x->n_regs; i++) {
        const reg_t *g = &x->regs[i];
        if (g->part != g0->part || g->id != g0->id || (replay && g->replay[0] == '\0'))
            continue;
        char key[16];
        snprintf(key, sizeof key, "%u", g->rank);
        kvr_json_key(&x->w, key);
        kvr_json_string(&x->w, replay ? g->replay : g->endpoint);
    }
    kvr_json_end_object(&x->w);
}

/* One instance of one partition: its registrations are regs[i] and later ones alike. */
static void write_instance(kvr_indexer_t *x, size_t first)
{
    kvr_json_writer_t *w = &x->w;
    const reg_t *g0 = &x->regs[first];
    const part_t *p = g0->part;
    kvr_json_begin_object(w);
    kvr_json_key(w, "instance_id");
    kvr_json_u64(w, g0->id);
    kvr_json_key(w, "source");
    kvr_json_string(w, "zmq");
    kvr_json_key(w, "model_name");
    kvr_json_string(w, p->model);
    kvr_json_key(w, "routing_group");
    kvr_json_string(w, p->group);
    kvr_json_key(w, "block_size");
    kvr_json_u64(w, p->block_size);
    kvr_json_key(w, "endpoints");
    write_endpoints(x, first, false);
    for (size_t i = first; i < x->n_regs; i++) /* listed when a rank has one (ours) */
        if (x->regs[i].part == g0->part && x->regs[i].id == g0->id && x->regs[i].replay[0]) {
            kvr_json_key(w, "replay_endpoints");
            write_endpoints(x, first, true);
            break;
        }
    const char *worst = "active";
    kvr_json_key(w, "listeners");
    kvr_json_begin_object(w);
    for (size_t i = first; i < x->n_regs; i++) {
        const reg_t *g = &x->regs[i];
        if (g->part == g0->part && g->id == g0->id)
            write_listener(w, p, g, &worst);
    }
    kvr_json_end_object(w);
    kvr_json_key(w, "status");
    kvr_json_string(w, worst);
    kvr_json_end_object(w);
}

static bool first_of_instance(const kvr_indexer_t *x, size_t i)
{
    for (size_t j = 0; j < i; j++)
        if (x->regs[j].part == x->regs[i].part && x->regs[j].id == x->regs[i].id)
            return false;
    return true;
}

static void h_workers(kvr_indexer_t *x, struct evhttp_request *req)
{
    struct evkeyvalq q;
    memset(&q, 0, sizeof q); /* an empty list: what evhttp_parse_query_str fills */
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *qs = u ? evhttp_uri_get_query(u) : NULL;
    if (qs != NULL && evhttp_parse_query_str(qs, &q) != 0) {
        reply_error(x, req, 400, "query string: not application/x-www-form-urlencoded");
        return;
    }
    const char *model = evhttp_find_header(&q, "model_name");
    const char *group = evhttp_find_header(&q, "routing_group");
    kvr_json_writer_reset(&x->w);
    kvr_json_begin_array(&x->w);
    for (size_t i = 0; i < x->n_regs; i++) {
        const part_t *p = x->regs[i].part;
        if ((model && strcmp(model, p->model) != 0) || (group && strcmp(group, p->group) != 0) ||
            !first_of_instance(x, i))
            continue;
        write_instance(x, i);
    }
    kvr_json_end_array(&x->w);
    evhttp_clear_headers(&q);
    reply_writer(x, req, 200);
}

static int peer_find(const kvr_indexer_t *x, const char *url, size_t n)
{
    for (size_t i = 0; i < x->n_peers; i++)
        if (strlen(x->peers[i]) == n && memcmp(x->peers[i], url, n) == 0)
            return (int)i;
    return -1;
}

static int peer_add(kvr_indexer_t *x, const char *url, size_t n)
{
    if (peer_find(x, url, n) >= 0)
        return KVR_OK;
    if (x->n_peers >= KVR_INDEXER_MAX_PEERS)
        return KVR_EFULL;
    char *c = strndup(url, n);
    if (c == NULL)
        return KVR_ENOMEM;
    x->peers[x->n_peers++] = c;
    return KVR_OK;
}

static void h_peer(kvr_indexer_t *x, struct evhttp_request *req, bool add)
{
    size_t len;
    const char *body = kvr_http_body(req, &len);
    kvr_ix_peer_t pr;
    if (kvr_api_decode_ix_peer(x->dec, body, len, &pr) != KVR_OK) {
        reply_error(x, req, 400, kvr_api_decoder_error(x->dec));
        return;
    }
    if (strncmp(pr.url, "http://", 7) != 0) {
        reply_error(x, req, 400, "url: must be an http:// URL");
        return;
    }
    if (add) {
        int rc = peer_add(x, pr.url, pr.url_len);
        if (rc != KVR_OK) {
            reply_error(x, req, rc == KVR_EFULL ? 400 : 500,
                        rc == KVR_EFULL ? "more than 64 peers" : "out of memory");
            return;
        }
        reply_ok(x, req, 201);
        return;
    }
    int i = peer_find(x, pr.url, pr.url_len);
    if (i < 0) {
        reply_error(x, req, 404, "peer not found");
        return;
    }
    free(x->peers[i]);
    x->peers[i] = x->peers[--x->n_peers];
    reply_ok(x, req, 200);
}

static void h_peers(kvr_indexer_t *x, struct evhttp_request *req)
{
    kvr_json_writer_reset(&x->w);
    kvr_json_begin_array(&x->w);
    for (size_t i = 0; i < x->n_peers; i++)
        kvr_json_string(&x->w, x->peers[i]);
    kvr_json_end_array(&x->w);
    reply_writer(x, req, 200);
}

static void part_metrics(kvr_indexer_t *x, kvr_prom_t *p)
{
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"kvr_indexer_pairs", "gauge", "(worker rank, block) pairs held by a partition's index."},
        {"kvr_indexer_events_applied_total", "counter", "KV events applied to a partition."},
        {"kvr_indexer_events_rejected_total", "counter",
         "KV events a partition's index refused (unknown parent, repeated hash)."},
        {"kvr_indexer_block_size_mismatch_total", "counter",
         "KV events refused: the engine's block size is not the partition's."},
        {"kvr_indexer_recovered_events_total", "counter",
         "Events applied from a peer's dump at start."},
        {"kvr_indexer_decisions_recorded_total", "counter",
         "Routing decisions recorded in a partition (approximate mode)."},
        {"kvr_indexer_recorded_pairs", "gauge",
         "Of the pairs, those held by recorded decisions (expire after their TTL)."},
        {"kvr_indexer_ranks_resumed_total", "counter",
         "Ranks resumed from a saved cursor (a peer's snapshot) and confirmed by their "
         "engine's replay socket."},
        {"kvr_indexer_resumes_failed_total", "counter",
         "Resumed cursors their engine could not confirm (the rank's state was dropped and "
         "learnt again)."},
    };
    for (size_t f = 0; f < sizeof fams / sizeof *fams; f++) {
        kvr_prom_family(p, fams[f].name, fams[f].type, fams[f].help);
        for (size_t i = 0; i < x->n_parts; i++) {
            part_t *pt = x->parts[i];
            kvr_ingest_stats_t gs;
            kvr_ingest_stats(pt->g, &gs);
            double v[] = {(double)gs.index.pairs,       (double)gs.events_applied,
                          (double)gs.events_rejected,   (double)gs.block_size_mismatch,
                          (double)pt->recovered_events, (double)gs.records,
                          (double)gs.recorded_pairs,    (double)gs.zmq.resumes,
                          (double)gs.zmq.resumes_failed};
            kvr_prom_label_t l[] = {{"model_name", pt->model}, {"routing_group", pt->group}};
            kvr_prom_sample(p, fams[f].name, l, 2, v[f]);
        }
    }
}

/* The peers' registrations at start, and the ranks of the recovered index left unfollowed. */
static void peer_regs_metrics(kvr_indexer_t *x, kvr_prom_t *p)
{
    kvr_prom_gauge(p, "kvr_indexer_stale_ranks",
                   "(worker, dp_rank) ranks the index recovered from a peer holds that no "
                   "registration here follows: nothing updates what it holds of them (their "
                   "registrations were not obtained from the peer; /health says why). 0 once "
                   "each is registered.",
                   (double)x->n_stale);
    kvr_prom_counter(p, "kvr_indexer_peer_registrations_failures_total",
                     "Peers whose registrations (GET /workers) were not read at start (no "
                     "answer, refused, too large, malformed).",
                     (double)x->st.peer_regs_failures);
    const char *name = "kvr_indexer_peer_registrations_total";
    kvr_prom_family(p, name, "counter",
                    "Registrations read from a peer at start: subscribed here, already "
                    "registered here (--workers win), or refused here.");
    const struct {
        const char *result;
        uint64_t v;
    } rows[] = {{"subscribed", x->st.peer_regs_subscribed},
                {"known", x->st.peer_regs_known},
                {"refused", x->st.peer_regs_refused}};
    for (size_t i = 0; i < 3; i++) {
        kvr_prom_label_t l = {"result", rows[i].result};
        kvr_prom_sample(p, name, &l, 1, (double)rows[i].v);
    }
}

/* 200 "OK"; after a start with --peers, then "index: <origin>", "registrations: <what the
 * peers' gave>" and, while ranks of the recovered index are unfollowed, "stale: ...". */
static void h_health(kvr_indexer_t *x, struct evhttp_request *req)
{
    if (!x->recovered_at_start) {
        reply(x, req, 200, "text/plain", "OK", 2);
        return;
    }
    char b[2048];
    int n = snprintf(b, sizeof b, "OK\nindex: %s\nregistrations: %s\n", x->origin,
                     x->regs_origin);
    if (x->n_stale > 0 && n > 0 && (size_t)n < sizeof b)
        n += snprintf(b + n, sizeof b - (size_t)n,
                      "stale: %zu ranks of the recovered index have no registration here: no "
                      "KV events update what it holds of them (POST /register them)\n",
                      x->n_stale);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof b ? (size_t)n : sizeof b - 1;
    reply(x, req, 200, "text/plain", b, len);
}

static void h_metrics(kvr_indexer_t *x, struct evhttp_request *req)
{
    kvr_prom_t *p = &x->prom;
    kvr_prom_reset(p);
    kvr_prom_gauge(p, "kvr_indexer_partitions", "(model_name, routing_group) partitions.",
                   (double)x->n_parts);
    kvr_prom_gauge(p, "kvr_indexer_registrations", "Registered (instance, dp_rank) listeners.",
                   (double)x->n_regs);
    kvr_prom_gauge(p, "kvr_indexer_peers", "Known peer indexers.", (double)x->n_peers);
    kvr_prom_counter(p, "kvr_indexer_registered_total", "POST /register answered 201.",
                     (double)x->st.registered);
    kvr_prom_counter(p, "kvr_indexer_register_conflicts_total",
                     "POST /register answered 409 (already registered).",
                     (double)x->st.register_conflicts);
    kvr_prom_counter(p, "kvr_indexer_register_refused_total",
                     "POST /register answered 400 (malformed, bad endpoint, block size).",
                     (double)x->st.register_refused);
    kvr_prom_counter(p, "kvr_indexer_unregistered_total", "POST /unregister answered 200.",
                     (double)x->st.unregistered);
    kvr_prom_counter(p, "kvr_indexer_unregister_unknown_total", "POST /unregister answered 404.",
                     (double)x->st.unregister_unknown);
    kvr_prom_gauge(p, "kvr_indexer_pair_budget",
                   "Pairs every partition together may hold (--max-total-pairs).",
                   (double)x->cfg.max_total_pairs);
    kvr_prom_gauge(p, "kvr_indexer_pairs_reserved",
                   "Of those, reserved by the partitions (each its own index's budget).",
                   (double)x->reserved);
    kvr_prom_counter(p, "kvr_indexer_partitions_made_total",
                     "Partitions made (by a registration, a decision or a peer's index).",
                     (double)x->st.parts_made);
    kvr_prom_counter(p, "kvr_indexer_partitions_dropped_total",
                     "Partitions dropped: no registration and nothing left in their index.",
                     (double)x->st.parts_dropped);
    kvr_prom_family(p, "kvr_indexer_partitions_refused_total", "counter",
                    "New partitions refused (400), by the cap reached.");
    kvr_prom_label_t lc = {"cause", "max_partitions"}, lb = {"cause", "max_total_pairs"};
    kvr_prom_sample(p, "kvr_indexer_partitions_refused_total", &lc, 1,
                    (double)x->st.parts_refused_cap);
    kvr_prom_sample(p, "kvr_indexer_partitions_refused_total", &lb, 1,
                    (double)x->st.parts_refused_budget);
    kvr_prom_counter(p, "kvr_indexer_decisions_over_capacity_total",
                     "Routing decisions refused (400): the partition's index has no rank slot "
                     "or room left.",
                     (double)x->st.records_full);
    kvr_prom_counter(p, "kvr_indexer_unauthorized_total",
                     "Calls refused with 401: no token, or not the one the route needs.",
                     (double)x->st.unauthorized);
    kvr_prom_counter(p, "kvr_indexer_peer_recovery_failures_total",
                     "Peers whose index was not read at start (no answer, refused, too large, "
                     "malformed).",
                     (double)x->st.peer_failures);
    peer_regs_metrics(x, p);
    part_metrics(x, p);
    kvr_ix_api_metrics(x->api, p);
    kvr_http_guard_metrics_all(&x->guard, 1, p);
    if (p->oom) {
        reply_error(x, req, 500, "out of memory");
        return;
    }
    reply(x, req, 200, "text/plain; version=0.0.4", p->buf, p->len);
}

/* GET /v1/index/partitions: what a kvrouter peer fetches the binary snapshots of. */
static void h_partitions(kvr_indexer_t *x, struct evhttp_request *req)
{
    kvr_json_writer_reset(&x->w);
    kvr_json_begin_array(&x->w);
    for (size_t i = 0; i < x->n_parts; i++) {
        kvr_json_begin_object(&x->w);
        kvr_json_key(&x->w, "model_name");
        kvr_json_string(&x->w, x->parts[i]->model);
        kvr_json_key(&x->w, "routing_group");
        kvr_json_string(&x->w, x->parts[i]->group);
        kvr_json_key(&x->w, "block_size");
        kvr_json_u64(&x->w, x->parts[i]->block_size);
        kvr_json_end_object(&x->w);
    }
    kvr_json_end_array(&x->w);
    reply_writer(x, req, 200);
}

/* GET /v1/index/snapshot?model_name=M&routing_group=G: one partition in the warm-restart
 * format (wire/index_snapshot.h), ~20x smaller and faster to read than its JSON dump. */
static void h_snapshot(kvr_indexer_t *x, struct evhttp_request *req)
{
    struct evkeyvalq q;
    memset(&q, 0, sizeof q);
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *qs = u ? evhttp_uri_get_query(u) : NULL;
    if (qs == NULL || evhttp_parse_query_str(qs, &q) != 0) {
        reply_error(x, req, 400, "model_name and routing_group are required (query string)");
        return;
    }
    const char *m = evhttp_find_header(&q, "model_name"),
               *g = evhttp_find_header(&q, "routing_group");
    part_t *p = m && g ? part_find(x, m, strlen(m), g, strlen(g)) : NULL;
    if (p == NULL) {
        evhttp_clear_headers(&q);
        reply_error(x, req, 404, "no such partition (model_name, routing_group)");
        return;
    }
    evhttp_clear_headers(&q);
    uint8_t *buf = NULL;
    size_t len = 0;
    char err[300] = "";
    kvr_ingest_snap_report_t rep;
    if (kvr_ingest_save_mem(p->g, &buf, &len, &rep, err, sizeof err) != KVR_OK) {
        reply_error(x, req, 500, err);
        return;
    }
    if (rep.ranks_skipped > 0) { /* the snapshot keeps exact ranks only: the dump has all */
        free(buf);
        snprintf(err, sizeof err,
                 "%u ranks are not exact (their history is partial) and a snapshot keeps exact "
                 "ranks only: read GET /dump",
                 rep.ranks_skipped);
        reply_error(x, req, 409, err);
        return;
    }
    reply(x, req, 200, "application/octet-stream", (const char *)buf, len);
    free(buf);
}

/* Who may call what (indexer_server.h): the class http/access.h checks a call against. */
static kvr_access_class_t access_class(const char *path, bool get, bool post)
{
    static const char *const writes[] = {"/register",      "/unregister",
                                         "/register_peer", "/deregister_peer",
                                         "/reopen_logs",   "/record_routing_decision"};
    static const char *const copies[] = {"/dump", "/v1/index/partitions", "/v1/index/snapshot"};
    if (get && (strcmp(path, "/health") == 0 || strcmp(path, "/ready") == 0))
        return KVR_ACCESS_OPEN;
    for (size_t i = 0; post && i < sizeof writes / sizeof *writes; i++)
        if (strcmp(path, writes[i]) == 0)
            return KVR_ACCESS_ADMIN;
    for (size_t i = 0; get && i < sizeof copies / sizeof *copies; i++)
        if (strcmp(path, copies[i]) == 0)
            return KVR_ACCESS_PEER;
    return KVR_ACCESS_CLIENT;
}

/* 401 in serve's shape (OpenAI's error object, code "invalid_api_key", the Bearer challenge). */
static void reply_unauthorized(kvr_indexer_t *x, struct evhttp_request *req, const char *path,
                               const char *msg)
{
    x->st.unauthorized++;
    kvr_log_limited(&x->rl_auth, KVR_LOG_WARN, "refused %s: %s", path, msg);
    kvr_json_writer_t *w = &x->w;
    kvr_json_writer_reset(w);
    (void)kvr_oai_encode_auth_error(w, msg);
    evhttp_add_header(evhttp_request_get_output_headers(req), "WWW-Authenticate", "Bearer");
    reply_writer(x, req, 401);
}

static void on_request(struct evhttp_request *req, void *arg)
{
    kvr_indexer_t *x = arg;
    enum evhttp_cmd_type m = evhttp_request_get_command(req);
    const struct evhttp_uri *u = evhttp_request_get_evhttp_uri(req);
    const char *path = u && evhttp_uri_get_path(u) ? evhttp_uri_get_path(u) : "/";
    bool get = m == EVHTTP_REQ_GET, post = m == EVHTTP_REQ_POST;
    char why[200];
    const char *auth = evhttp_find_header(evhttp_request_get_input_headers(req), "Authorization");
    int verdict =
        kvr_access_check(&x->access, access_class(path, get, post), false, auth, why, sizeof why);
    char scratch[200];
    if (verdict != 0 && get && strcmp(path, "/workers") == 0 &&
        kvr_access_check(&x->access, KVR_ACCESS_PEER, false, auth, scratch, sizeof scratch) == 0)
        verdict = 0; /* a peer recovering this index reads its registrations with the peer key */
    if (verdict != 0) { /* 401: no admin listener here, so never the 404 of a wrong one */
        reply_unauthorized(x, req, path, why);
        return;
    }
    if (kvr_ix_api_handle(x->api, req, path, get, post))
        return;
    if (post && strcmp(path, "/register") == 0)
        h_register(x, req);
    else if (post && strcmp(path, "/unregister") == 0)
        h_unregister(x, req);
    else if (get && strcmp(path, "/workers") == 0)
        h_workers(x, req);
    else if (post && strcmp(path, "/register_peer") == 0)
        h_peer(x, req, true);
    else if (post && strcmp(path, "/deregister_peer") == 0)
        h_peer(x, req, false);
    else if (get && strcmp(path, "/peers") == 0)
        h_peers(x, req);
    else if (get && strcmp(path, "/v1/index/partitions") == 0)
        h_partitions(x, req);
    else if (get && strcmp(path, "/v1/index/snapshot") == 0)
        h_snapshot(x, req);
    else if (post && strcmp(path, "/reopen_logs") == 0)
        reply_ok(x, req, 200); /* the reference's log rotation hook: no log file to reopen */
    else if (get && strcmp(path, "/health") == 0)
        h_health(x, req);
    else if (get && strcmp(path, "/ready") == 0) /* the listener opens once the index is in */
        reply_ok(x, req, 200);
    else if (get && strcmp(path, "/metrics") == 0)
        h_metrics(x, req);
    else
        reply_error(x, req, 404, "no such route");
}

/* ---- the ix_api's view of the partitions ---------------------------------------------- */

static int api_find(void *arg, const kvr_ix_query_t *q, kvr_ix_part_t *out)
{
    kvr_indexer_t *x = arg;
    part_t *p =
        part_find(x, q->model_name, q->model_name_len, q->routing_group, q->routing_group_len);
    if (p == NULL)
        return KVR_ENOTFOUND;
    *out = (kvr_ix_part_t){.ix = p->ix, .block_size = p->block_size};
    return KVR_OK;
}

/* A router's decision (approximate mode). A partition is made by the first decision that
 * names its block size, as by a registration. */
static int api_record(void *arg, const kvr_ix_record_t *rec, char *msg, size_t msg_len)
{
    kvr_indexer_t *x = arg;
    part_t *p = part_find(x, rec->model_name, rec->model_name_len, rec->routing_group,
                          rec->routing_group_len);
    if (p == NULL && rec->block_size == 0) {
        snprintf(msg, msg_len,
                 "no index for model_name=%.200s routing_group=%.200s (a decision with its "
                 "block_size makes one)",
                 rec->model_name, rec->routing_group);
        return KVR_ENOTFOUND;
    }
    int st;
    if (rec->block_size != 0 &&
        (p = part_get(x, rec->model_name, rec->model_name_len, rec->routing_group,
                      rec->routing_group_len, rec->block_size, msg, msg_len, &st)) == NULL)
        return st == KVR_EFULL ? KVR_EINVAL : st; /* no room for the partition: a 400 naming
                                                     the cap, as for a registration */
    int rc =
        kvr_ingest_record(p->g, (kvr_worker_t){rec->instance_id, rec->dp_rank}, rec->local_hashes,
                          rec->sequence_hashes, rec->n, rec->kv_capacity_blocks);
    if (rc == KVR_EFULL) {
        /* the index has no rank slot left (or no node chunk): the partition's cap, not an
         * indexer fault */
        kvr_ingest_stats_t gs;
        kvr_ingest_stats(p->g, &gs);
        x->st.records_full++;
        if (gs.index.workers >= KVR_INDEX_DEFAULT_MAX_WORKERS)
            snprintf(msg, msg_len,
                     "%u ranks, the most a partition's index keeps, are recorded: instance_id "
                     "%llu dp_rank %u is not (POST /unregister frees an instance's ranks; "
                     "model_name=%.60s routing_group=%.60s)",
                     KVR_INDEX_DEFAULT_MAX_WORKERS, (unsigned long long)rec->instance_id,
                     rec->dp_rank, p->model, p->group);
        else
            snprintf(msg, msg_len,
                     "the partition's index is full (%zu pairs, --max-pairs): the decision is "
                     "not recorded (model_name=%.60s routing_group=%.60s)",
                     p->max_pairs, p->model, p->group);
        kvr_log_limited(&x->rl_records, KVR_LOG_WARN, "POST /record_routing_decision: %s", msg);
        return KVR_EINVAL;
    }
    if (rc == KVR_EEXIST)
        snprintf(msg, msg_len,
                 "instance_id %llu dp_rank %u is registered with KV events for model_name=%s "
                 "routing_group=%s: its events say what it holds",
                 (unsigned long long)rec->instance_id, rec->dp_rank, p->model, p->group);
    else if (rc != KVR_OK)
        snprintf(msg, msg_len, "recording the decision failed: %s", kvr_strerror(rc));
    return rc;
}

static int api_dump(void *arg, kvr_json_writer_t *w)
{
    kvr_indexer_t *x = arg;
    kvr_json_begin_object(w);
    for (size_t i = 0; i < x->n_parts; i++) {
        part_t *p = x->parts[i];
        kvr_ix_dump_src_t src = {.g = p->g};
        int rc = kvr_ix_api_dump_partition(w, p->model, p->group, p->block_size, &src);
        if (rc != KVR_OK)
            return rc;
    }
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

/* ---- start-up: what a peer's index names ---------------------------------------------- */

/* Rank (id, rank) of partition p is in the index recovered from a peer: stale unless a
 * registration here follows it (callers give each rank once). */
static void stale_add(kvr_indexer_t *x, const part_t *p, uint64_t id, uint32_t rank)
{
    if (reg_find(x, p, id, rank) != NULL)
        return;
    if (kvr_grow((void **)&x->stale, &x->cap_stale, x->n_stale + 1, SIZE_MAX,
                 sizeof *x->stale) != KVR_OK)
        return; /* out of memory: the gauge undercounts, nothing else */
    x->stale[x->n_stale++] = (stale_rank_t){.part = p, .id = id, .rank = rank};
}

/* The ranks of a snapshot's table (applied to p) into the stale ones. */
static void stale_add_snapshot(kvr_indexer_t *x, const part_t *p, const uint8_t *buf, size_t len)
{
    kvr_snap_reader_t r;
    char err[200];
    if (kvr_snap_open(&r, buf, len, err, sizeof err) != KVR_OK)
        return; /* it was applied: cannot happen */
    for (uint32_t i = 0; i < r.info.n_ranks; i++) {
        kvr_snap_rank_t k;
        kvr_snap_rank(&r, i, &k);
        stale_add(x, p, k.worker_id, k.dp_rank);
    }
    kvr_snap_close(&r);
}

/* ---- start-up: a peer's dump ---------------------------------------------------------- */

typedef struct recover {
    kvr_indexer_t *x;
    bool apply; /* false: the checking pass */
    part_t *cur;
    size_t left, n_new; /* the checking pass: the budget and partitions the new ones take */
    stale_rank_t *seen; /* the applying pass: the distinct ranks its events name */
    size_t n_seen, cap_seen, last;
    char err[600];
} recover_t;

static int rec_partition(void *ud, const char *key, size_t len, uint32_t block_size)
{
    recover_t *rc = ud;
    const char *colon = NULL;
    for (size_t i = len; i-- > 0;)
        if (key[i] == ':') {
            colon = key + i;
            break;
        }
    size_t ml = (size_t)(colon - key), gl = len - ml - 1;
    part_t *p = part_find(rc->x, key, ml, colon + 1, gl);
    if (p != NULL && p->block_size != block_size) {
        snprintf(rc->err, sizeof rc->err, "partition %.*s has block size %u there and %u here",
                 (int)len, key, block_size, p->block_size);
        return KVR_EMISMATCH;
    }
    const kvr_indexer_config_t *c = &rc->x->cfg;
    if (!rc->apply && p == NULL && (ml >= NAME_BYTES || gl >= NAME_BYTES)) {
        snprintf(rc->err, sizeof rc->err, "partition %.*s: names of at most %d bytes",
                 (int)(len < 200 ? len : 200), key, NAME_BYTES - 1);
        return KVR_EINVAL;
    }
    if (!rc->apply && p == NULL) { /* room for it, as part_get will judge: nothing half made */
        size_t keep = c->max_pairs < rc->left ? c->max_pairs : rc->left;
        if ((keep < KVR_INDEXER_MIN_PAIRS && keep < c->max_pairs) ||
            ++rc->n_new > c->max_partitions) {
            snprintf(rc->err, sizeof rc->err,
                     "partition %.*s does not fit here (--max-partitions %zu, --max-total-pairs "
                     "%zu)",
                     (int)(len < 200 ? len : 200), key, c->max_partitions, c->max_total_pairs);
            return KVR_EFULL;
        }
        rc->left -= keep;
    }
    if (!rc->apply)
        return KVR_OK;
    rc->cur = part_get(rc->x, key, ml, colon + 1, gl, block_size, rc->err, sizeof rc->err, NULL);
    return rc->cur != NULL ? KVR_OK : KVR_EINVAL;
}

/* Notes the rank an applied event names (the last one found is checked first: a dump's
 * events come in runs of one rank's). */
static void rec_seen(recover_t *rc, kvr_worker_t w)
{
    for (size_t k = 0; k <= rc->n_seen; k++) {
        size_t i = k == 0 ? rc->last : k - 1;
        const stale_rank_t *s = i < rc->n_seen ? &rc->seen[i] : NULL;
        if (s != NULL && s->part == rc->cur && s->id == w.worker_id && s->rank == w.dp_rank) {
            rc->last = i;
            return;
        }
    }
    if (kvr_grow((void **)&rc->seen, &rc->cap_seen, rc->n_seen + 1, SIZE_MAX,
                 sizeof *rc->seen) != KVR_OK)
        return; /* out of memory: the stale gauge undercounts, nothing else */
    rc->last = rc->n_seen;
    rc->seen[rc->n_seen++] = (stale_rank_t){.part = rc->cur, .id = w.worker_id, .rank = w.dp_rank};
}

static int rec_event(void *ud, const kvr_event_t *ev)
{
    recover_t *rc = ud;
    if (!rc->apply)
        return 0;
    rec_seen(rc, ev->worker);
    if (kvr_index_apply(rc->cur->ix, ev) == KVR_OK)
        rc->cur->recovered_events++;
    else
        rc->cur->recovered_rejected++;
    return 0;
}

/* One bounded GET of a peer's (peer_key_file's token sent when there is one). */
typedef struct peer_get {
    const char *url;
    uint64_t timeout_ms;
    const char *bearer;
} peer_get_t;

/* GET url+path, at most max_bytes starting with magic: KVR_OK with the body (malloc'd) when
 * it answered 200. */
static int fetch(const peer_get_t *pg, const char *path, size_t max_bytes, const char *magic,
                 uint8_t **body, size_t *len, int *status, char *err, size_t err_len)
{
    kvr_http_fetch_t q = {.url = pg->url,
                          .path = path,
                          .bearer = pg->bearer,
                          .timeout_ms = pg->timeout_ms,
                          .max_bytes = max_bytes,
                          .magic = magic,
                          .magic_len = magic != NULL ? strlen(magic) : 0};
    *body = NULL;
    *status = 0;
    int rc = kvr_http_fetch(&q, body, len, status, err, err_len);
    if (rc == KVR_OK && *status != 200) {
        snprintf(err, err_len, "GET %.300s answered %d", path, *status);
        free(*body);
        *body = NULL;
        rc = KVR_EIO;
    }
    return rc;
}

/* The most pairs the partitions a peer's dump may make or fill here can keep: max_partitions
 * of max_pairs each, within max_total_pairs. */
static size_t pairs_recoverable(const kvr_indexer_t *x)
{
    size_t cap = x->cfg.max_partitions > SIZE_MAX / x->cfg.max_pairs
                     ? SIZE_MAX
                     : x->cfg.max_partitions * x->cfg.max_pairs;
    return cap < x->cfg.max_total_pairs ? cap : x->cfg.max_total_pairs;
}

/* The reference's JSON dump (a peer without the binary snapshots, or with a rank that is not
 * exact), read whole in a checking pass before a second pass applies it; the ranks its events
 * name that no registration here follows are noted as stale. */
static int recover_dump(kvr_indexer_t *x, const peer_get_t *pg, char *err, size_t err_len)
{
    size_t max = answer_bound(pairs_recoverable(x), DUMP_BYTES_PER_PAIR, 65536);
    uint8_t *body = NULL;
    size_t len = 0;
    int status = 0;
    int rc = fetch(pg, "/dump", max, "{", &body, &len, &status, err, err_len);
    recover_t rec = {.x = x, .left = x->cfg.max_total_pairs - x->reserved, .n_new = x->n_parts};
    kvr_rev_sink_t sink = {rec_partition, rec_event, &rec};
    kvr_rev_report_t rep;
    if (rc == KVR_OK) /* the checking pass: nothing is applied unless all of it reads */
        rc = kvr_rev_decode_dump((const char *)body, len, &sink, &rep, err, err_len);
    if (rc == KVR_OK) {
        rec.apply = true;
        rc = kvr_rev_decode_dump((const char *)body, len, &sink, &rep, err, err_len);
    }
    free(body);
    for (size_t i = 0; rc == KVR_OK && i < rec.n_seen; i++)
        stale_add(x, rec.seen[i].part, rec.seen[i].id, rec.seen[i].rank);
    free(rec.seen);
    if (rc == KVR_OK)
        snprintf(x->origin, sizeof x->origin, "peer %s: %llu events in %llu partitions", pg->url,
                 (unsigned long long)rep.events, (unsigned long long)rep.partitions);
    else if (rec.err[0] != '\0') {
        size_t n = strlen(err);
        snprintf(err + n, err_len - n, ": %s", rec.err);
    }
    return rc;
}

/* ---- start-up: a peer's registrations ------------------------------------------------- */

/* What one peer's registrations gave at start. */
typedef struct regs_try {
    size_t before;  /* registrations here before this peer's: regs[0..before) */
    bool asked;     /* its GET /workers was sent */
    bool missing;   /* ... and (for a partition at least) not read: why says why */
    size_t subscribed, known, refused; /* subscribed here; already registered here (--workers
                                          win, or an earlier peer's); refused here */
    char why[400];  /* the failure, or the first registration refused and why */
} regs_try_t;

/* Whether instance id of partition p was registered here before this peer's registrations:
 * --workers win over a peer for the instances they name. */
static bool instance_known(const kvr_indexer_t *x, const part_t *p, uint64_t id, size_t before)
{
    for (size_t i = 0; i < before; i++)
        if (x->regs[i].part == p && x->regs[i].id == id)
            return true;
    return false;
}

/* One of the peer's registrations, taken as POST /register takes one (counted). */
static void take_peer_reg(kvr_indexer_t *x, const kvr_ix_peer_reg_t *e, regs_try_t *rt)
{
    const kvr_ix_register_t *r = &e->r;
    part_t *p =
        part_find(x, r->model_name, r->model_name_len, r->routing_group, r->routing_group_len);
    if (p != NULL && instance_known(x, p, r->instance_id, rt->before)) {
        rt->known++;
        x->st.peer_regs_known++;
        return;
    }
    char err[600] = "";
    int rc = e->why != NULL ? KVR_EINVAL : do_register(x, r, err, sizeof err);
    if (rc == KVR_OK) {
        rt->subscribed++;
        x->st.peer_regs_subscribed++;
        return;
    }
    rt->refused++;
    x->st.peer_regs_refused++;
    kvr_log(KVR_LOG_WARN, "a peer's registration of instance %llu dp_rank %u is not taken: %s",
            (unsigned long long)r->instance_id, r->dp_rank, e->why != NULL ? e->why : err);
    if (rt->why[0] == '\0')
        snprintf(rt->why, sizeof rt->why, "instance %llu dp_rank %u: %.300s",
                 (unsigned long long)r->instance_id, r->dp_rank, e->why != NULL ? e->why : err);
}

/* The peer's registrations at path (GET /workers, filtered or not; at most max of them), read
 * whole, then each subscribed here, before the peer's index is fetched: their live events
 * queue from then on, and a rank with a replay socket resumes from the snapshot's cursor.
 * false when they could not be read (rt says why; the recovery goes on without them). */
static bool learn_regs(kvr_indexer_t *x, const peer_get_t *pg, const char *path, size_t max,
                       regs_try_t *rt)
{
    rt->asked = true;
    uint8_t *body = NULL;
    size_t len = 0;
    int status;
    char err[300] = "";
    kvr_ix_peer_reg_t *regs = NULL;
    size_t n = 0;
    int rc = fetch(pg, path, answer_bound(max, WORKERS_BYTES_PER_RANK, 65536), "[", &body, &len,
                   &status, err, sizeof err);
    if (rc == KVR_OK)
        rc = kvr_ix_peer_regs_read((const char *)body, len, max, &regs, &n, err, sizeof err);
    if (rc != KVR_OK) {
        rt->missing = true;
        x->st.peer_regs_failures++;
        snprintf(rt->why, sizeof rt->why, "%s", err);
        kvr_log(KVR_LOG_WARN,
                "peer %s: its registrations were not obtained (%s): the engines it follows are "
                "not subscribed here from it",
                pg->url, err);
    }
    for (size_t i = 0; i < n; i++)
        take_peer_reg(x, &regs[i], rt);
    free(regs);
    free(body);
    return rc == KVR_OK;
}

/* x->regs_origin from the registrations of the peer whose index was applied, and the warning
 * when ranks of that index are left without a registration here. */
static void regs_outcome(kvr_indexer_t *x, const char *url, const regs_try_t *rt)
{
    char *o = x->regs_origin;
    size_t cap = sizeof x->regs_origin;
    if (rt->missing && rt->subscribed == 0 && rt->known == 0) {
        snprintf(o, cap, "none obtained from peer %s (%s)", url, rt->why);
    } else {
        int n = snprintf(o, cap, "%zu subscribed from peer %s (%zu already registered here)",
                         rt->subscribed, url, rt->known);
        if ((rt->missing || rt->refused > 0) && n > 0 && (size_t)n < cap)
            snprintf(o + n, cap - (size_t)n, "; %s: %s",
                     rt->refused > 0 ? "some refused" : "not all obtained", rt->why);
    }
    if (x->n_stale > 0)
        kvr_log(KVR_LOG_WARN,
                "%zu ranks of the index recovered from %s have no registration here "
                "(registrations: %s): no KV events will update what the index holds of them, "
                "so it goes stale; register them (POST /register, or --workers) to follow them",
                x->n_stale, url, o);
}

/* ---- start-up: a kvrouter peer's binary snapshots -------------------------------------- */

typedef struct peer_part {
    char model[NAME_BYTES], group[NAME_BYTES];
    uint32_t block_size;
    part_t *part; /* made here before the registrations are taken */
    uint8_t *snap;
    size_t len;
} peer_part_t;

/* Decimal digits b[0..n) as a number in [1, max]; 0 otherwise. */
static uint32_t small_uint(const char *b, size_t n, uint32_t max)
{
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i] < '0' || b[i] > '9' || (v = v * 10 + (uint64_t)(b[i] - '0')) > max)
            return 0;
    }
    return n > 0 ? (uint32_t)v : 0;
}

/* A kvrouter peer's partitions list: [{"model_name","routing_group","block_size"}]. */
static size_t read_partitions(const char *b, size_t len, peer_part_t *out, size_t cap)
{
    size_t n = 0, i = kvr_json_skip_ws(b, len, 0);
    if (i >= len || b[i] != '[')
        return SIZE_MAX;
    for (i = kvr_json_skip_ws(b, len, i + 1); i < len && b[i] == '{' && n < cap;) {
        kvr_json_iter_t it;
        kvr_json_member_t m;
        peer_part_t *p = &out[n];
        memset(p, 0, sizeof *p);
        kvr_json_object_begin(&it, b, len, i, KVR_JSON_STRICT);
        int got;
        while ((got = kvr_json_object_next(&it, &m)) > 0) {
            size_t vl = m.val_end - m.val;
            if (kvr_json_key_is(b, &m, "block_size"))
                p->block_size = small_uint(b + m.val, vl, 65536);
            else if (b[m.val] == '"' && vl - 2 < NAME_BYTES && !memchr(b + m.val, '\\', vl) &&
                     (kvr_json_key_is(b, &m, "model_name") ||
                      kvr_json_key_is(b, &m, "routing_group")))
                memcpy(kvr_json_key_is(b, &m, "model_name") ? p->model : p->group, b + m.val + 1,
                       vl - 2);
        }
        if (got < 0 || p->block_size == 0 || p->model[0] == '\0' || p->group[0] == '\0')
            return SIZE_MAX; /* an object that does not scan, or a field missing */
        n++;
        i = kvr_json_skip_ws(b, len, it.close + 1);
        if (i < len && b[i] == ',')
            i = kvr_json_skip_ws(b, len, i + 1);
    }
    return i < len && b[i] == ']' ? n : SIZE_MAX;
}

/* path?model_name=M&routing_group=G for partition pp (names encoded). */
static void part_path(char *out, size_t cap, const char *path, const peer_part_t *pp)
{
    char *m = evhttp_encode_uri(pp->model), *g = evhttp_encode_uri(pp->group);
    snprintf(out, cap, "%s?model_name=%s&routing_group=%s", path, m ? m : "", g ? g : "");
    free(m);
    free(g);
}

/* Whether the peer's partitions fit here (block sizes, --max-partitions, --max-total-pairs),
 * judged as part_get will make them, in the list's order: nothing is made unless all do. */
static int peer_parts_fit(kvr_indexer_t *x, const peer_part_t *pp, size_t n, char *err,
                          size_t err_len)
{
    size_t left = x->cfg.max_total_pairs - x->reserved, n_new = x->n_parts;
    for (size_t i = 0; i < n; i++) {
        const part_t *own =
            part_find(x, pp[i].model, strlen(pp[i].model), pp[i].group, strlen(pp[i].group));
        if (own != NULL && own->block_size != pp[i].block_size) {
            snprintf(err, err_len, "partition %s:%s has block size %u there and %u here",
                     pp[i].model, pp[i].group, pp[i].block_size, own->block_size);
            return KVR_EMISMATCH;
        }
        if (own != NULL)
            continue;
        size_t keep = x->cfg.max_pairs < left ? x->cfg.max_pairs : left;
        if ((keep < KVR_INDEXER_MIN_PAIRS && keep < x->cfg.max_pairs) ||
            ++n_new > x->cfg.max_partitions) {
            snprintf(err, err_len,
                     "the peer's %zu partitions do not fit here (--max-partitions %zu, "
                     "--max-total-pairs %zu)",
                     n, x->cfg.max_partitions, x->cfg.max_total_pairs);
            return KVR_EFULL;
        }
        left -= keep;
    }
    return KVR_OK;
}

/* The peer's partitions made here, in the list's order (as peer_parts_fit judged them). */
static int peer_parts_make(kvr_indexer_t *x, peer_part_t *pp, size_t n, char *err,
                           size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        int st;
        pp[i].part = part_get(x, pp[i].model, strlen(pp[i].model), pp[i].group,
                              strlen(pp[i].group), pp[i].block_size, err, err_len, &st);
        if (pp[i].part == NULL)
            return st;
    }
    return KVR_OK;
}

/* Each partition's registrations at the peer (GET /workers?model_name=&routing_group=, at
 * most a partition's ranks), subscribed here; the first that cannot be read ends it (a peer
 * that does not serve them: one warning, not one per partition). */
static void peer_parts_regs(kvr_indexer_t *x, const peer_get_t *pg, const peer_part_t *pp,
                            size_t n, regs_try_t *rt)
{
    for (size_t i = 0; i < n; i++) {
        char path[3 * NAME_BYTES + 64];
        part_path(path, sizeof path, "/workers", &pp[i]);
        if (!learn_regs(x, pg, path, PART_MAX_RANKS, rt))
            return;
    }
}

/* Each partition's snapshot, bounded by the pairs it keeps here. KVR_ENOTFOUND when the peer
 * holds a rank that is not exact (409: its dump has it, a snapshot not). */
static int peer_parts_fetch(const peer_get_t *pg, peer_part_t *pp, size_t n, char *err,
                            size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        char path[3 * NAME_BYTES + 64];
        part_path(path, sizeof path, "/v1/index/snapshot", &pp[i]);
        size_t max = answer_bound(pp[i].part->max_pairs, SNAP_BYTES_PER_PAIR, SNAP_FIXED_BYTES);
        int status;
        int rc = fetch(pg, path, max, KVR_SNAP_MAGIC, &pp[i].snap, &pp[i].len, &status, err,
                       err_len);
        if (rc != KVR_OK)
            return status == 409 ? KVR_ENOTFOUND : rc;
    }
    return KVR_OK;
}

/* Every snapshot applied (every rank's events; a rank subscribed here with a replay socket
 * resumes from its cursor: *resumed counts them), and the ranks no registration here follows
 * noted as stale. */
static int peer_parts_apply(kvr_indexer_t *x, const peer_part_t *pp, size_t n, uint64_t *events,
                            uint64_t *resumed, char *err, size_t err_len)
{
    for (size_t i = 0; i < n; i++) {
        part_t *p = pp[i].part;
        kvr_ingest_snap_report_t rep;
        int rc = kvr_ingest_load_all_mem(p->g, pp[i].snap, pp[i].len, &rep, err, err_len);
        if (rc != KVR_OK)
            return rc;
        p->recovered_events += rep.events;
        p->recovered_rejected += rep.events_failed;
        *events += rep.events;
        *resumed += rep.ranks;
        stale_add_snapshot(x, p, pp[i].snap, pp[i].len);
    }
    return KVR_OK;
}

/* A kvrouter peer: its partitions list, checked to fit here; the partitions made and the
 * peer's registrations of each subscribed; every snapshot fetched and checked, then applied
 * (a failure before applies nothing). KVR_ENOTFOUND when the peer has no such route (not
 * kvrouter) or holds a rank that is not exact: read its dump then. Each answer is bounded:
 * the list by max_partitions entries, a partition's registrations by PART_MAX_RANKS, a
 * snapshot by the pairs its partition keeps here. */
static int recover_binary(kvr_indexer_t *x, const peer_get_t *pg, regs_try_t *rt, char *err,
                          size_t err_len)
{
    uint8_t *body;
    size_t len;
    int status;
    int rc = fetch(pg, "/v1/index/partitions", x->cfg.max_partitions * PARTITION_ENTRY_BYTES + 4096,
                   "[", &body, &len, &status, err, err_len);
    if (rc != KVR_OK)
        return status == 404 ? KVR_ENOTFOUND : rc;
    peer_part_t *pp = calloc(x->cfg.max_partitions, sizeof *pp);
    size_t n = pp ? read_partitions((const char *)body, len, pp, x->cfg.max_partitions) : 0;
    free(body);
    if (pp == NULL)
        return snprintf(err, err_len, "out of memory"), KVR_ENOMEM;
    if (n == SIZE_MAX) {
        snprintf(err, err_len,
                 "GET /v1/index/partitions: not a list of partitions (or more than "
                 "--max-partitions %zu)",
                 x->cfg.max_partitions);
        free(pp);
        return KVR_EPARSE;
    }
    uint64_t events = 0, resumed = 0;
    rc = peer_parts_fit(x, pp, n, err, err_len);
    if (rc == KVR_OK)
        rc = peer_parts_make(x, pp, n, err, err_len);
    if (rc == KVR_OK)
        peer_parts_regs(x, pg, pp, n, rt);
    if (rc == KVR_OK)
        rc = peer_parts_fetch(pg, pp, n, err, err_len);
    if (rc == KVR_OK)
        rc = peer_parts_apply(x, pp, n, &events, &resumed, err, err_len);
    for (size_t i = 0; i < n; i++)
        free(pp[i].snap);
    free(pp);
    if (rc == KVR_OK)
        snprintf(x->origin, sizeof x->origin,
                 "peer %s: %llu events in %zu partitions, %llu ranks resuming from its cursors "
                 "(binary)",
                 pg->url, (unsigned long long)events, n, (unsigned long long)resumed);
    return rc;
}

/* Applies the first peer's index that reads whole (a kvrouter peer's binary snapshots, else
 * the reference's GET /dump), with its registrations; KVR_OK if one did. */
static int recover_from_peers(kvr_indexer_t *x, char *why, size_t why_len)
{
    uint64_t timeout = x->cfg.peer_timeout_ms ? x->cfg.peer_timeout_ms : 10000;
    size_t orphans = 0; /* registrations subscribed from peers whose index was not read */
    for (size_t i = 0; i < x->n_peers; i++) {
        peer_get_t pg = {x->peers[i], timeout, x->access.peer_key};
        regs_try_t rt = {.before = x->n_regs};
        char err[700] = "";
        int rc = recover_binary(x, &pg, &rt, err, sizeof err);
        if (rc == KVR_ENOTFOUND) { /* not kvrouter's snapshots: the reference's dump */
            if (!rt.asked)
                (void)learn_regs(x, &pg, "/workers", x->cfg.max_partitions * PART_MAX_RANKS,
                                 &rt);
            err[0] = '\0';
            rc = recover_dump(x, &pg, err, sizeof err);
        }
        if (rc == KVR_OK) {
            kvr_log(KVR_LOG_INFO, "index recovered from %s", x->origin);
            regs_outcome(x, pg.url, &rt);
            return KVR_OK;
        }
        x->st.peer_failures++;
        orphans += rt.subscribed;
        kvr_log(KVR_LOG_WARN, "peer %s: no index recovered: %s", x->peers[i], err);
        snprintf(why, why_len, "%.200s: %.480s", x->peers[i], err); /* bounded: a peer url, its error */
    }
    if (orphans > 0)
        snprintf(x->regs_origin, sizeof x->regs_origin,
                 "%zu subscribed from peers whose index was not read", orphans);
    else
        snprintf(x->regs_origin, sizeof x->regs_origin, "none (no peer's index was read)");
    return KVR_ENOTFOUND;
}

/* ---- life ----------------------------------------------------------------------------- */

static int register_cli_workers(kvr_indexer_t *x, const kvr_indexer_config_t *given, char *err,
                                size_t err_len)
{
    const kvr_indexer_config_t *c = &x->cfg;
    for (size_t i = 0; i < given->n_workers; i++) {
        const kvr_indexer_worker_t *wk = &given->workers[i];
        kvr_ix_register_t r = {.instance_id = wk->instance_id,
                               .endpoint = wk->endpoint,
                               .endpoint_len = strlen(wk->endpoint),
                               .model_name = c->model_name,
                               .model_name_len = strlen(c->model_name),
                               .routing_group = c->routing_group,
                               .routing_group_len = strlen(c->routing_group),
                               .block_size = c->block_size,
                               .dp_rank = wk->dp_rank};
        char why[600];
        if (do_register(x, &r, why, sizeof why) != KVR_OK) {
            snprintf(err, err_len, "--workers: %s", why);
            return KVR_EINVAL;
        }
    }
    return KVR_OK;
}

static int open_listener(kvr_indexer_t *x, char *err, size_t err_len)
{
    kvr_http_limits_t lim = x->cfg.limits;
    lim.max_connections = lim.max_connections ? lim.max_connections : 4096;
    lim.max_header_bytes = lim.max_header_bytes ? lim.max_header_bytes : 65536;
    lim.max_body_bytes = lim.max_body_bytes ? lim.max_body_bytes : (uint64_t)64 << 20;
    lim.header_timeout_ms = lim.header_timeout_ms ? lim.header_timeout_ms : 10000;
    lim.body_timeout_ms = lim.body_timeout_ms ? lim.body_timeout_ms : 30000;
    lim.idle_timeout_ms = lim.idle_timeout_ms ? lim.idle_timeout_ms : 60000;
    lim.methods = "GET and POST";
    x->http = evhttp_new(x->base);
    if (x->http == NULL)
        return snprintf(err, err_len, "out of memory"), KVR_ENOMEM;
    evhttp_set_allowed_methods(x->http, EVHTTP_REQ_GET | EVHTTP_REQ_POST);
    x->guard = kvr_http_guard_new(x->base, x->http, "client", &lim, on_request, x);
    if (x->guard == NULL)
        return snprintf(err, err_len, "out of memory"), KVR_ENOMEM;
    const char *host = x->cfg.bind ? x->cfg.bind : "127.0.0.1";
    int rc = kvr_http_guard_listen(x->guard, host, x->cfg.port, &x->port);
    if (rc != KVR_OK)
        snprintf(err, err_len, "--bind/--port: cannot listen on %s:%u: %s", host, x->cfg.port,
                 kvr_strerror(rc));
    return rc;
}

/* The budget's defaults and their check, naming the flags. */
static int resolve_budget(kvr_indexer_config_t *c, const kvr_indexer_config_t *given, char *err,
                          size_t err_len)
{
    c->max_partitions =
        given->max_partitions ? given->max_partitions : KVR_INDEXER_DEFAULT_PARTITIONS;
    c->max_total_pairs =
        given->max_total_pairs ? given->max_total_pairs : KVR_INDEXER_DEFAULT_TOTAL_PAIRS;
    c->max_pairs = given->max_pairs                                   ? given->max_pairs
                   : KVR_INDEX_DEFAULT_MAX_PAIRS < c->max_total_pairs ? KVR_INDEX_DEFAULT_MAX_PAIRS
                                                                      : c->max_total_pairs;
    if (c->max_partitions > KVR_INDEXER_MAX_PARTITIONS) {
        snprintf(err, err_len, "--max-partitions %zu: at most %d", c->max_partitions,
                 KVR_INDEXER_MAX_PARTITIONS);
        return KVR_EINVAL;
    }
    if (c->max_total_pairs < KVR_INDEXER_MIN_PAIRS) {
        snprintf(err, err_len, "--max-total-pairs %zu: at least %d", c->max_total_pairs,
                 KVR_INDEXER_MIN_PAIRS);
        return KVR_EINVAL;
    }
    if (c->max_pairs > c->max_total_pairs) {
        snprintf(err, err_len,
                 "--max-pairs %zu is more than --max-total-pairs %zu (the pairs of every "
                 "partition together): lower --max-pairs or raise --max-total-pairs",
                 c->max_pairs, c->max_total_pairs);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* The key files (http/access.h reads them from a router configuration). */
static int init_access(kvr_indexer_t *x, char *err, size_t err_len)
{
    kvr_router_config_t *rc = calloc(1, sizeof *rc);
    if (rc == NULL)
        return snprintf(err, err_len, "out of memory"), KVR_ENOMEM;
    const struct {
        const char *flag, *path;
        char *field;
        size_t cap;
    } keys[] = {
        {"--api-key-file", x->cfg.api_key_file, rc->api_key_file, sizeof rc->api_key_file},
        {"--admin-key-file", x->cfg.admin_key_file, rc->admin_key_file, sizeof rc->admin_key_file},
        {"--peer-key-file", x->cfg.peer_key_file, rc->peer_key_file, sizeof rc->peer_key_file},
    };
    int st = KVR_OK;
    for (size_t i = 0; i < 3 && st == KVR_OK; i++) {
        if (keys[i].path == NULL)
            continue;
        if (keys[i].path[0] == '\0' || strlen(keys[i].path) >= keys[i].cap) {
            snprintf(err, err_len, "%s: a path of 1 to %zu bytes", keys[i].flag, keys[i].cap - 1);
            st = KVR_EINVAL;
            break;
        }
        memcpy(keys[i].field, keys[i].path, strlen(keys[i].path) + 1);
    }
    if (st == KVR_OK)
        st = kvr_access_init(&x->access, rc, err, err_len);
    free(rc);
    return st;
}

kvr_indexer_t *kvr_indexer_new(struct event_base *base, const kvr_indexer_config_t *cfg, char *err,
                               size_t err_len)
{
    kvr_indexer_t *x = calloc(1, sizeof *x);
    if (x == NULL)
        return snprintf(err, err_len, "out of memory"), NULL;
    x->base = base;
    x->cfg = *cfg;
    x->cfg.model_name = cfg->model_name ? cfg->model_name : "default";
    x->cfg.routing_group = cfg->routing_group ? cfg->routing_group : KVR_IX_DEFAULT_GROUP;
    x->cfg.workers = NULL; /* not kept */
    x->cfg.peers = NULL;
    x->rl_parts = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    x->rl_auth = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    x->rl_records = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    snprintf(x->origin, sizeof x->origin, "cold");
    kvr_json_writer_init(&x->w);
    kvr_prom_init(&x->prom);
    kvr_ix_api_ops_t ops = {
        .find = api_find, .dump = api_dump, .record = api_record, .reply = reply, .arg = x};
    x->api = kvr_ix_api_new(&ops);
    x->dec = kvr_api_decoder_new(NULL);
    int rrc = kvr_reply_init(&x->rep, &x->w, &ix_style);
    kvr_index_reader_register();
    if (x->api == NULL || x->dec == NULL || rrc != KVR_OK) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    if (resolve_budget(&x->cfg, cfg, err, err_len) != KVR_OK ||
        init_access(x, err, err_len) != KVR_OK)
        goto fail;
    kvr_log(KVR_LOG_INFO,
            "pair budget: %zu pairs for every partition together, %zu a partition (%zu "
            "partitions of that size fit; --max-partitions %zu)",
            x->cfg.max_total_pairs, x->cfg.max_pairs, x->cfg.max_total_pairs / x->cfg.max_pairs,
            x->cfg.max_partitions);
    for (size_t i = 0; i < cfg->n_peers; i++)
        if (peer_add(x, cfg->peers[i], strlen(cfg->peers[i])) != KVR_OK) {
            snprintf(err, err_len, "--peers: more than %d peers", KVR_INDEXER_MAX_PEERS);
            goto fail;
        }
    if (register_cli_workers(x, cfg, err, err_len) != KVR_OK)
        goto fail;
    char why[700] = "";
    x->recovered_at_start = x->n_peers > 0;
    if (x->n_peers > 0 && recover_from_peers(x, why, sizeof why) != KVR_OK) {
        snprintf(x->origin, sizeof x->origin, "cold (no peer's dump read: %.500s)", why);
        kvr_log(KVR_LOG_WARN, "starting with an empty index: no peer's dump read (last: %s)", why);
    }
    for (size_t i = 0; i < x->n_parts; i++)
        if (part_start(x->parts[i]) != KVR_OK) {
            snprintf(err, err_len, "cannot start an ingest thread");
            goto fail;
        }
    x->running = true;
    struct timeval tick = {0, REAP_MS * 1000};
    if ((x->reaper = event_new(base, -1, EV_PERSIST, on_reap, x)) == NULL ||
        event_add(x->reaper, &tick) != 0) {
        snprintf(err, err_len, "out of memory");
        goto fail;
    }
    if (open_listener(x, err, err_len) != KVR_OK)
        goto fail;
    return x;
fail:
    kvr_indexer_free(x);
    return NULL;
}

void kvr_indexer_free(kvr_indexer_t *x)
{
    if (x == NULL)
        return;
    if (x->reaper != NULL)
        event_free(x->reaper);
    if (x->http != NULL)
        evhttp_free(x->http);
    kvr_http_guard_free(x->guard);
    for (size_t i = 0; i < x->n_parts; i++)
        part_free(x->parts[i]);
    free(x->parts);
    free(x->regs);
    free(x->stale);
    for (size_t i = 0; i < x->n_peers; i++)
        free(x->peers[i]);
    kvr_ix_api_free(x->api);
    kvr_api_decoder_free(x->dec);
    kvr_json_writer_deinit(&x->w);
    kvr_prom_deinit(&x->prom);
    kvr_reply_deinit(&x->rep);
    kvr_index_reader_unregister();
    free(x);
}

uint16_t kvr_indexer_port(const kvr_indexer_t *x) { return x->port; }
const char *kvr_indexer_origin(const kvr_indexer_t *x) { return x->origin; }
const char *kvr_indexer_registrations(const kvr_indexer_t *x) { return x->regs_origin; }
void kvr_indexer_drain(kvr_indexer_t *x) { kvr_http_guard_drain(x->guard); }
uint64_t kvr_indexer_busy(const kvr_indexer_t *x) { return kvr_http_guard_busy(x->guard); }
