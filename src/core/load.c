/*
 * load.c: the load tracker. In-flight requests per worker rank, and the load each rank would
 * carry if an incoming request were sent there (the load model of Dynamo's KV router).
 *
 *   requests   slots in one array (grown by doubling up to max_requests), found by id through
 *              an open-addressing table of (seeded XXH3 of the id, slot), or by handle
 *              (generation << 32 | slot; the generation moves on when the slot is freed, so a
 *              stale handle misses and never names a later request); linked twice: into
 *              the age list (oldest first, for expiry) and into their worker's list (for
 *              remove_worker). Each request's block hashes live in a chain of 30-hash chunks
 *              from a shared pool with a free list.
 *   workers    a slot per rank with at least one live request (freed with its last request),
 *              found through an open-addressing table keyed by (worker_id, dp_rank). A slot
 *              keeps the rank's sums: block weights, prefill tokens, requests, unique blocks.
 *   blocks     one open-addressing table keyed by (worker slot, hash): refcount and weight,
 *              and the tag of the request that created the entry (kvr_load_admit_tagged: the
 *              router's stream position of that request's prompt, core/stepclock.h).
 *
 * Invariants (checked by kvr_load_verify):
 *   - refs(w, h) = occurrences of h in the block lists of w's live requests; an entry exists
 *     iff refs > 0, so a worker slot that is freed (no request) owns no entry;
 *   - worker sums = the sums over its requests and entries; totals = sums over workers;
 *   - the age list holds every live request, started_ms non-decreasing. To keep it sorted
 *     when the clock steps back, a request starts at max(now, start of the newest live one);
 *   - every table entry is reachable from its home slot (backward-shift deletion, no
 *     tombstones); tables stay at most half full, so misses are short.
 *
 * Weights are fixed point (1.0 = 2^30), so sums are exact integers: a drained worker is
 * exactly zero whatever the decay fractions were, and active_blocks = round(sum / 2^30)
 * (halves up). A decay fraction is quantized to 2^-30, far below what rounding can see.
 *
 * Projection: with chained sequence hashes, a hash names its whole prefix, and a live request
 * holds all of its prompt's prefixes, so along a query the worker's active hashes form a
 * prefix: "q[i] active" is monotone in i, and the overlap (the longest active prefix, 4.5) is
 * found by binary search. Hashes that are not chained get an answer that is still a boundary
 * (q[k-1] active, q[k] not), like a collision: advisory, never unsafe. A query with
 * assume_kv_reuse off has overlap 0 without a probe, and the blocks of a request admitted with it
 * off are random hashes no query finds. Both settings are per request (kvr_load_opt_t: the
 * reference's decode-pool overrides) with the configuration as default.
 *
 * Policies where the reference drifts or is silent:
 *   - expiry: 300 s, swept at most once a minute from add(): the documented 5 min / 1 min and
 *     the 300 s backstop of PR #13718, not the 3600 s / 30 s of the newest single.rs. An hour
 *     of a leaked booking misroutes for an hour; five minutes is longer than any sane request
 *     without a first token, and expire() is cheap (O(expired)) to call from a timer
 *     (kvr_load_next_expiry). A request is stale when now - started >= expiry_ms.
 *   - duplicate live id: rejected (S24 allows it when documented); the first keeps its state.
 *   - prefill: no modeled durations (router_prefill_load_model = none), so the anchor model of
 *     4.4 reduces to "a request's effective prefill tokens count until its first token".
 *     Stride is 1. Random hashes are redrawn while they collide on the worker, so with
 *     assume_kv_reuse off nothing dedups even by chance, and output blocks are always exclusive.
 *   - a hash repeated inside one prompt counts as two references (never with chained hashes).
 *
 * Memory: bounded by max_requests and the blocks they hold; arrays and tables grow by doubling
 * and keep their peak, so add / free / project do not allocate in steady state. About 340
 * bytes per request slot (the id is stored inline) and 56 to 104 bytes per held block (a
 * 24-byte entry in a table 1/4 to 1/2 full, plus 8 bytes in a chunk). An add either reserves all it
 * needs first or fails with nothing changed. Threads: one thread owns a tracker (the event loop);
 * no locks. Cost: add and free O(blocks of the request); a handle lookup O(1), an id lookup one
 * hash; first_token O(1); output_block O(1), or O(blocks of the request) with a decay fraction;
 * project O(log m) probes per worker; expire O(expired requests' blocks); remove_worker O(worker
 * slots + its requests' blocks).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/oatab.h"
#include "base/rng.h"
#include "core/load.h"
#include "base/verify.h"

#define NONE UINT32_MAX
#define W_SHIFT 30
#define W_ONE (UINT32_C(1) << W_SHIFT)
#define CHUNK_N 30
#define MIN_SLOTS 16u

typedef struct chunk {
    uint64_t h[CHUNK_N];
    uint32_t next;
    uint32_t n;
} chunk_t;

typedef struct block {
    uint64_t hash;
    uint32_t wslot;
    uint32_t refs;   /* 0 = empty entry */
    uint32_t weight; /* fixed point, W_ONE = 1.0 */
    uint32_t tag;    /* the block tag of the request that created it (kvr_load_admit_tagged) */
} block_t;

typedef struct req {
    uint64_t id_hash;
    uint64_t started_ms;
    uint64_t prefill_tokens;
    uint64_t mark; /* the caller's (kvr_load_admit_tagged) */
    uint32_t wslot;
    uint32_t prev, next;   /* age list; next also links the free list */
    uint32_t wprev, wnext; /* the worker's list */
    uint32_t head, tail;   /* block chunks */
    uint32_t n_prompt, n_output;
    uint32_t expected_output_tokens;
    uint32_t gen; /* changes when the slot is freed: stale handles miss */
    uint16_t id_len;
    uint8_t live;
    uint8_t has_expected;
    uint8_t peer; /* admitted with .peer: counted in n_peer */
    char id[KVR_LOAD_MAX_ID_BYTES];
} req_t;

typedef struct wrk {
    kvr_worker_t w;
    uint64_t units; /* sum of block weights */
    uint64_t prefill_tokens;
    uint64_t n_blocks;
    uint32_t n_requests;
    uint32_t head; /* request list; next links the free list when unused */
    uint32_t next;
    uint8_t used;
} wrk_t;

typedef struct ident {
    uint64_t hash;
    uint32_t slot; /* NONE = empty */
    uint32_t pad_;
} ident_t;

struct kvr_load {
    kvr_load_config_t cfg;
    uint64_t rng, id_seed;
    /* requests */
    req_t *req;
    uint32_t cap_req, n_req, free_req, age_head, age_tail;
    uint32_t n_peer;      /* live requests admitted with .peer */
    uint64_t peer_blocks; /* their prompt blocks (n_prompt) */
    ident_t *ids;
    size_t ids_mask;
    /* workers */
    wrk_t *wrk;
    uint32_t cap_wrk, n_wrk, free_wrk;
    uint32_t *wix; /* worker slot, NONE = empty */
    size_t wix_mask;
    /* blocks */
    block_t *blk;
    size_t blk_mask, n_blk;
    /* chunks */
    chunk_t *chk;
    uint32_t cap_chk, free_chk, n_free_chk;
    uint64_t last_check_ms;
    uint64_t prefill_total;
    kvr_load_stats_t st; /* counters only; gauges are filled by kvr_load_stats */
};

/* ---- hashing and randomness ---- */

static size_t bhash(uint32_t wslot, uint64_t h) { return (size_t)kvr_mix64(h + kvr_mix64(wslot + 1)); }

static size_t whash(kvr_worker_t w)
{
    return (size_t)kvr_mix64(w.worker_id * UINT64_C(0x9E3779B97F4A7C15) + w.dp_rank + 1);
}

static uint64_t idhash(const kvr_load_t *lt, const char *id, size_t len)
{
    /* seeded: request ids come from clients, who must not be able to aim probe chains */
    return kvr_xxh3(id, len, lt->id_seed);
}

static bool worker_eq(kvr_worker_t a, kvr_worker_t b)
{
    return a.worker_id == b.worker_id && a.dp_rank == b.dp_rank;
}

/* ---- the three tables (base/oatab.h) ---- */

#define IDS_HOME(c, e) ((e)->hash)
#define IDS_EMPTY(e) ((e)->slot == NONE)
#define IDS_CLEAR(e) ((e)->slot = NONE)
KVR_OATAB_DEFINE(ids, kvr_load_t, ident_t, IDS_HOME, IDS_EMPTY, IDS_CLEAR)

#define WIX_HOME(c, e) whash((c)->wrk[*(e)].w)
#define WIX_EMPTY(e) (*(e) == NONE)
#define WIX_CLEAR(e) (*(e) = NONE)
KVR_OATAB_DEFINE(wix, kvr_load_t, uint32_t, WIX_HOME, WIX_EMPTY, WIX_CLEAR)

#define BLK_HOME(c, e) bhash((e)->wslot, (e)->hash)
#define BLK_EMPTY(e) ((e)->refs == 0)
#define BLK_CLEAR(e) ((e)->refs = 0)
KVR_OATAB_DEFINE(blk, kvr_load_t, block_t, BLK_HOME, BLK_EMPTY, BLK_CLEAR)

/* ---- config ---- */

void kvr_load_config_init(kvr_load_config_t *cfg)
{
    if (cfg == NULL)
        return;
    *cfg = (kvr_load_config_t){
        .block_size = KVR_LOAD_DEFAULT_BLOCK_SIZE,
        .track_active_blocks = true,
        .track_output_blocks = false,
        .assume_kv_reuse = true,
        .track_prefill_tokens = true,
        .expiry_ms = KVR_LOAD_DEFAULT_EXPIRY_MS,
        .check_interval_ms = KVR_LOAD_DEFAULT_CHECK_INTERVAL_MS,
        .max_requests = KVR_LOAD_DEFAULT_MAX_REQUESTS,
        .seed = 0,
    };
}

int kvr_load_config_validate(const kvr_load_config_t *cfg, const char **field)
{
    const char *dummy;
    if (field == NULL)
        field = &dummy;
    *field = NULL;
    if (cfg == NULL)
        return KVR_OK;
    if (cfg->block_size == 0)
        *field = "block_size";
    else if (cfg->track_output_blocks && !cfg->track_active_blocks)
        *field = "track_output_blocks";
    else if (cfg->expiry_ms == 0 || cfg->expiry_ms > KVR_LOAD_MAX_EXPIRY_MS)
        *field = "expiry_ms";
    else if (cfg->check_interval_ms > cfg->expiry_ms)
        *field = "check_interval_ms";
    else if (cfg->max_requests == 0 || cfg->max_requests > KVR_LOAD_MAX_REQUESTS)
        *field = "max_requests";
    else if (cfg->max_peer_requests > KVR_LOAD_MAX_REQUESTS)
        *field = "max_peer_requests";
    return *field == NULL ? KVR_OK : KVR_EINVAL;
}

/* ---- growth (each keeps tables at most half full) ---- */
/* Request slots at most: both budgets. */
static uint32_t slot_limit(const kvr_load_t *lt)
{
    return lt->cfg.max_requests + lt->cfg.max_peer_requests;
}


static int grow_array(void **p, uint32_t *cap, uint32_t want, uint32_t limit, size_t elem)
{
    if (want <= *cap)
        return KVR_OK;
    uint32_t n = *cap ? *cap : MIN_SLOTS;
    while (n < want)
        n = n > UINT32_MAX / 2 ? UINT32_MAX - 1 : n * 2;
    if (n > limit)
        n = limit;
    void *q = realloc(*p, (size_t)n * elem);
    if (q == NULL)
        return KVR_ENOMEM;
    *p = q;
    *cap = n;
    return KVR_OK;
}

static int reserve_requests(kvr_load_t *lt)
{
    if (lt->free_req != NONE)
        return KVR_OK;
    uint32_t old = lt->cap_req;
    int rc = grow_array((void **)&lt->req, &lt->cap_req, old + 1, slot_limit(lt),
                        sizeof *lt->req);
    if (rc != KVR_OK)
        return rc;
    for (uint32_t i = lt->cap_req; i-- > old;) {
        lt->req[i].live = 0;
        lt->req[i].gen = 1;
        lt->req[i].next = lt->free_req;
        lt->free_req = i;
    }
    return KVR_OK;
}

static int reserve_workers(kvr_load_t *lt)
{
    if (lt->free_wrk != NONE)
        return KVR_OK;
    uint32_t old = lt->cap_wrk;
    int rc = grow_array((void **)&lt->wrk, &lt->cap_wrk, old + 1, slot_limit(lt),
                        sizeof *lt->wrk);
    if (rc != KVR_OK)
        return rc;
    for (uint32_t i = lt->cap_wrk; i-- > old;) {
        lt->wrk[i].used = 0;
        lt->wrk[i].next = lt->free_wrk;
        lt->free_wrk = i;
    }
    return KVR_OK;
}

static int reserve_chunks(kvr_load_t *lt, size_t n)
{
    if (lt->n_free_chk >= n)
        return KVR_OK;
    if (n > (size_t)UINT32_MAX / 2 - lt->cap_chk)
        return KVR_ENOMEM;
    uint32_t old = lt->cap_chk;
    int rc = grow_array((void **)&lt->chk, &lt->cap_chk, old + (uint32_t)(n - lt->n_free_chk),
                        UINT32_MAX - 1, sizeof *lt->chk);
    if (rc != KVR_OK)
        return rc;
    for (uint32_t i = lt->cap_chk; i-- > old;) {
        lt->chk[i].next = lt->free_chk;
        lt->free_chk = i;
        lt->n_free_chk++;
    }
    return KVR_OK;
}

static size_t table_cap(size_t live)
{
    size_t cap = MIN_SLOTS;
    while (cap < 2 * live)
        cap *= 2;
    return cap;
}

static int reserve_ids(kvr_load_t *lt, size_t live)
{
    size_t cap = table_cap(live);
    return cap <= lt->ids_mask + 1 ? KVR_OK : ids_rehash(lt, &lt->ids, &lt->ids_mask, cap);
}

static int reserve_wix(kvr_load_t *lt, size_t live)
{
    size_t cap = table_cap(live);
    return cap <= lt->wix_mask + 1 ? KVR_OK : wix_rehash(lt, &lt->wix, &lt->wix_mask, cap);
}

static int reserve_blocks(kvr_load_t *lt, size_t more)
{
    if (more > SIZE_MAX / 4 - lt->n_blk)
        return KVR_ENOMEM;
    size_t cap = table_cap(lt->n_blk + more);
    return cap <= lt->blk_mask + 1 ? KVR_OK : blk_rehash(lt, &lt->blk, &lt->blk_mask, cap);
}

/* ---- lookups ---- */

typedef struct id_key {
    uint64_t hash;
    const char *id;
    size_t len;
} id_key_t;

static bool id_match(const kvr_load_t *lt, const ident_t *e, const void *key)
{
    const id_key_t *k = key;
    const req_t *r = &lt->req[e->slot];
    return e->hash == k->hash && r->id_len == k->len && memcmp(r->id, k->id, k->len) == 0;
}

static uint32_t find_req(const kvr_load_t *lt, const char *id, size_t len)
{
    id_key_t k = {idhash(lt, id, len), id, len};
    const ident_t *e = ids_find(lt, lt->ids, lt->ids_mask, (size_t)k.hash, id_match, &k);
    return e == NULL ? NONE : e->slot;
}

static bool worker_match(const kvr_load_t *lt, const uint32_t *e, const void *key)
{
    return worker_eq(lt->wrk[*e].w, *(const kvr_worker_t *)key);
}

static uint32_t find_worker(const kvr_load_t *lt, kvr_worker_t w)
{
    const uint32_t *e = wix_find(lt, lt->wix, lt->wix_mask, whash(w), worker_match, &w);
    return e == NULL ? NONE : *e;
}

typedef struct blk_key {
    uint32_t wslot;
    uint64_t hash;
} blk_key_t;

static bool blk_match(const kvr_load_t *lt, const block_t *e, const void *key)
{
    (void)lt;
    const blk_key_t *k = key;
    return e->hash == k->hash && e->wslot == k->wslot;
}

static block_t *find_block(const kvr_load_t *lt, uint32_t wslot, uint64_t h)
{
    blk_key_t k = {wslot, h};
    return blk_find(lt, lt->blk, lt->blk_mask, bhash(wslot, h), blk_match, &k);
}

/* ---- table removals ---- */

static void ids_del(kvr_load_t *lt, uint32_t slot)
{
    size_t i = (size_t)lt->req[slot].id_hash & lt->ids_mask;
    while (lt->ids[i].slot != slot)
        i = (i + 1) & lt->ids_mask;
    ids_remove_at(lt, lt->ids, lt->ids_mask, i);
}

static void wix_del(kvr_load_t *lt, uint32_t slot)
{
    size_t i = whash(lt->wrk[slot].w) & lt->wix_mask;
    while (lt->wix[i] != slot)
        i = (i + 1) & lt->wix_mask;
    wix_remove_at(lt, lt->wix, lt->wix_mask, i);
}

static void blk_del(kvr_load_t *lt, block_t *e)
{
    blk_remove_at(lt, lt->blk, lt->blk_mask, (size_t)(e - lt->blk));
    lt->n_blk--;
}

/* ---- blocks (capacity reserved by the caller) ---- */

static void acquire(kvr_load_t *lt, uint32_t wslot, uint64_t h, uint32_t tag)
{
    block_t *e = find_block(lt, wslot, h);
    if (e != NULL) {
        e->refs++;
        return;
    }
    lt->blk[blk_free_slot(lt->blk, lt->blk_mask, bhash(wslot, h))] =
        (block_t){.hash = h, .wslot = wslot, .refs = 1, .weight = W_ONE, .tag = tag};
    lt->n_blk++;
    lt->wrk[wslot].units += W_ONE;
    lt->wrk[wslot].n_blocks++;
}

static void release(kvr_load_t *lt, uint32_t wslot, uint64_t h)
{
    block_t *e = find_block(lt, wslot, h);
    if (e == NULL || --e->refs > 0)
        return; /* NULL cannot happen while the invariants hold (verify checks them) */
    lt->wrk[wslot].units -= e->weight;
    lt->wrk[wslot].n_blocks--;
    blk_del(lt, e);
}

/* A random hash no block of this worker has: nothing dedups with it. */
static uint64_t fresh_hash(kvr_load_t *lt, uint32_t wslot)
{
    uint64_t h;
    do
        h = kvr_splitmix64(&lt->rng);
    while (find_block(lt, wslot, h) != NULL);
    return h;
}

static void append_hash(kvr_load_t *lt, req_t *r, uint64_t h)
{
    if (r->tail == NONE || lt->chk[r->tail].n == CHUNK_N) {
        uint32_t c = lt->free_chk;
        lt->free_chk = lt->chk[c].next;
        lt->n_free_chk--;
        lt->chk[c].next = NONE;
        lt->chk[c].n = 0;
        if (r->tail == NONE)
            r->head = c;
        else
            lt->chk[r->tail].next = c;
        r->tail = c;
    }
    chunk_t *c = &lt->chk[r->tail];
    c->h[c->n++] = h;
}

static void release_blocks(kvr_load_t *lt, req_t *r)
{
    for (uint32_t c = r->head; c != NONE;) {
        chunk_t *ch = &lt->chk[c];
        for (uint32_t i = 0; i < ch->n; i++)
            release(lt, r->wslot, ch->h[i]);
        uint32_t next = ch->next;
        ch->next = lt->free_chk;
        lt->free_chk = c;
        lt->n_free_chk++;
        c = next;
    }
    r->head = r->tail = NONE;
}

/* ---- workers ---- */

static uint32_t worker_get(kvr_load_t *lt, kvr_worker_t w)
{
    uint32_t s = find_worker(lt, w);
    if (s != NONE)
        return s;
    s = lt->free_wrk;
    lt->free_wrk = lt->wrk[s].next;
    lt->wrk[s] = (wrk_t){.w = w, .head = NONE, .next = NONE, .used = 1};
    lt->wix[wix_free_slot(lt->wix, lt->wix_mask, whash(w))] = s;
    lt->n_wrk++;
    return s;
}

static void worker_put(kvr_load_t *lt, uint32_t s)
{
    wix_del(lt, s);
    lt->wrk[s].used = 0;
    lt->wrk[s].next = lt->free_wrk;
    lt->free_wrk = s;
    lt->n_wrk--;
}

/* ---- requests ---- */

static void link_request(kvr_load_t *lt, uint32_t s)
{
    req_t *r = &lt->req[s];
    r->prev = lt->age_tail;
    r->next = NONE;
    if (lt->age_tail == NONE)
        lt->age_head = s;
    else
        lt->req[lt->age_tail].next = s;
    lt->age_tail = s;
    wrk_t *w = &lt->wrk[r->wslot];
    r->wprev = NONE;
    r->wnext = w->head;
    if (w->head != NONE)
        lt->req[w->head].wprev = s;
    w->head = s;
    w->n_requests++;
    lt->ids[ids_free_slot(lt->ids, lt->ids_mask, (size_t)r->id_hash)] =
        (ident_t){.hash = r->id_hash, .slot = s};
    lt->n_req++;
    lt->n_peer += r->peer;
}

/* Counted once the prompt blocks are in (n_prompt set), uncounted at unlink. */
static void count_peer_blocks(kvr_load_t *lt, const req_t *r)
{
    if (r->peer)
        lt->peer_blocks += r->n_prompt;
}

static void unlink_request(kvr_load_t *lt, uint32_t s)
{
    req_t *r = &lt->req[s];
    if (r->prev == NONE)
        lt->age_head = r->next;
    else
        lt->req[r->prev].next = r->next;
    if (r->next == NONE)
        lt->age_tail = r->prev;
    else
        lt->req[r->next].prev = r->prev;
    wrk_t *w = &lt->wrk[r->wslot];
    if (r->wprev == NONE)
        w->head = r->wnext;
    else
        lt->req[r->wprev].wnext = r->wnext;
    if (r->wnext != NONE)
        lt->req[r->wnext].wprev = r->wprev;
    w->n_requests--;
    ids_del(lt, s);
    lt->n_req--;
    lt->n_peer -= r->peer;
    if (r->peer)
        lt->peer_blocks -= r->n_prompt;
}

static void end_prefill(kvr_load_t *lt, req_t *r)
{
    lt->wrk[r->wslot].prefill_tokens -= r->prefill_tokens;
    lt->prefill_total -= r->prefill_tokens;
    r->prefill_tokens = 0;
}

/* Releases everything request s holds; frees its worker slot with its last request. */
static void drop_request(kvr_load_t *lt, uint32_t s)
{
    req_t *r = &lt->req[s];
    uint32_t ws = r->wslot;
    end_prefill(lt, r);
    release_blocks(lt, r);
    unlink_request(lt, s);
    r->live = 0;
    r->gen = r->gen == UINT32_MAX ? 1 : r->gen + 1; /* never 0: a handle is never 0 */
    r->next = lt->free_req;
    lt->free_req = s;
    if (lt->wrk[ws].n_requests == 0)
        worker_put(lt, ws);
}

/* ---- lifecycle ---- */

kvr_load_t *kvr_load_new(const kvr_load_config_t *cfg, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    kvr_load_config_t c;
    kvr_load_config_init(&c);
    if (cfg != NULL)
        c = *cfg;
    if (kvr_load_config_validate(&c, NULL) != KVR_OK) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_load_t *lt = calloc(1, sizeof *lt);
    if (lt == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    lt->cfg = c;
    lt->rng = c.seed;
    lt->id_seed = kvr_mix64(c.seed ^ UINT64_C(0x6c6f6164));
    lt->free_req = lt->age_head = lt->age_tail = NONE;
    lt->free_wrk = lt->free_chk = NONE;
    if (reserve_ids(lt, 1) != KVR_OK || reserve_wix(lt, 1) != KVR_OK ||
        reserve_blocks(lt, 1) != KVR_OK) {
        kvr_load_free(lt);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return lt;
}

void kvr_load_free(kvr_load_t *lt)
{
    if (lt == NULL)
        return;
    free(lt->req);
    free(lt->ids);
    free(lt->wrk);
    free(lt->wix);
    free(lt->blk);
    free(lt->chk);
    free(lt);
}

static bool id_ok(const char *id, size_t len)
{
    return id != NULL && len > 0 && len <= KVR_LOAD_MAX_ID_BYTES;
}

static int check_request(const kvr_load_t *lt, const kvr_load_request_t *rq)
{
    if (lt == NULL || rq == NULL || !id_ok(rq->id, rq->id_len))
        return KVR_EINVAL;
    if (!lt->cfg.track_active_blocks)
        return KVR_OK;
    if (rq->n_seq > 0 && rq->seq == NULL)
        return KVR_EINVAL;
    if (rq->n_seq > rq->isl_tokens / (rq->block_size ? rq->block_size : lt->cfg.block_size))
        return KVR_EINVAL; /* more blocks than tokens: hashed with another block size */
    if (rq->n_seq > UINT32_MAX / 2)
        return KVR_ETOOBIG;
    return KVR_OK;
}

/* Everything an add may need, before anything changes. */
static int reserve_add(kvr_load_t *lt, size_t n_blocks)
{
    int rc = reserve_requests(lt);
    if (rc == KVR_OK)
        rc = reserve_ids(lt, (size_t)lt->n_req + 1);
    if (rc == KVR_OK)
        rc = reserve_workers(lt);
    if (rc == KVR_OK)
        rc = reserve_wix(lt, (size_t)lt->n_wrk + 1);
    if (rc == KVR_OK)
        rc = reserve_blocks(lt, n_blocks);
    if (rc == KVR_OK)
        rc = reserve_chunks(lt, (n_blocks + CHUNK_N - 1) / CHUNK_N);
    return rc;
}

static void maybe_expire(kvr_load_t *lt, uint64_t now_ms)
{
    if (now_ms >= lt->last_check_ms && now_ms - lt->last_check_ms >= lt->cfg.check_interval_ms)
        (void)kvr_load_expire(lt, now_ms);
}

static void fill_request(kvr_load_t *lt, req_t *r, const kvr_load_request_t *rq, uint64_t now_ms)
{
    uint64_t newest = lt->age_tail == NONE ? 0 : lt->req[lt->age_tail].started_ms;
    r->id_hash = idhash(lt, rq->id, rq->id_len);
    r->started_ms = now_ms > newest ? now_ms : newest;
    r->prefill_tokens = 0;
    r->head = r->tail = NONE;
    r->n_prompt = r->n_output = 0;
    r->has_expected = rq->has_expected_output_tokens;
    r->expected_output_tokens = rq->has_expected_output_tokens ? rq->expected_output_tokens : 0;
    r->id_len = (uint16_t)rq->id_len;
    memcpy(r->id, rq->id, rq->id_len);
    r->live = 1;
    r->peer = rq->peer && lt->cfg.max_peer_requests > 0;
}

/* Whether rq fits its budget: peers' own when they have one, else max_requests (the local
 * requests', or everyone's with no peer budget). Counts a refusal. */
static bool has_room(kvr_load_t *lt, const kvr_load_request_t *rq)
{
    if (lt->cfg.max_peer_requests == 0) {
        if (lt->n_req < lt->cfg.max_requests)
            return true;
        lt->st.full++;
        return false;
    }
    if (rq->peer) {
        uint64_t blocks = lt->cfg.track_active_blocks ? rq->n_seq : 0;
        if (lt->n_peer < lt->cfg.max_peer_requests &&
            (lt->cfg.max_peer_blocks == 0 || lt->peer_blocks + blocks <= lt->cfg.max_peer_blocks))
            return true;
        lt->st.peer_full++;
        return false;
    }
    if (lt->n_req - lt->n_peer < lt->cfg.max_requests)
        return true;
    lt->st.full++;
    return false;
}


/* A request's own setting, or the tracker's. */
static bool opt_on(kvr_load_opt_t o, bool config)
{
    return o == KVR_LOAD_CONFIG ? config : o == KVR_LOAD_ON;
}

static void add_prompt_blocks(kvr_load_t *lt, req_t *r, const kvr_load_request_t *rq, uint32_t tag)
{
    if (!lt->cfg.track_active_blocks)
        return;
    bool reuse = opt_on(rq->assume_kv_reuse, lt->cfg.assume_kv_reuse);
    for (size_t i = 0; i < rq->n_seq; i++) {
        uint64_t h = reuse ? rq->seq[i] : fresh_hash(lt, r->wslot);
        acquire(lt, r->wslot, h, tag);
        append_hash(lt, r, h);
    }
    r->n_prompt = (uint32_t)rq->n_seq;
}

static void add_prefill(kvr_load_t *lt, req_t *r, const kvr_load_request_t *rq)
{
    if (!opt_on(rq->track_prefill_tokens, lt->cfg.track_prefill_tokens))
        return;
    uint64_t cached = rq->cached_tokens < rq->isl_tokens ? rq->cached_tokens : rq->isl_tokens;
    r->prefill_tokens = rq->isl_tokens - cached;
    lt->wrk[r->wslot].prefill_tokens += r->prefill_tokens;
    lt->prefill_total += r->prefill_tokens;
}

int kvr_load_admit_tagged(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms,
                          uint32_t tag, uint64_t mark, kvr_req_handle_t *handle)
{
    if (handle != NULL)
        *handle = KVR_REQ_HANDLE_NONE;
    int rc = check_request(lt, rq);
    if (rc != KVR_OK)
        return rc;
    maybe_expire(lt, now_ms);
    if (find_req(lt, rq->id, rq->id_len) != NONE) {
        lt->st.duplicates++;
        return KVR_EEXIST;
    }
    if (!has_room(lt, rq))
        return KVR_EFULL;
    size_t n_blocks = lt->cfg.track_active_blocks ? rq->n_seq : 0;
    rc = reserve_add(lt, n_blocks);
    if (rc != KVR_OK)
        return rc;
    uint32_t s = lt->free_req;
    req_t *r = &lt->req[s];
    lt->free_req = r->next;
    fill_request(lt, r, rq, now_ms);
    r->wslot = worker_get(lt, rq->worker);
    link_request(lt, s);
    add_prompt_blocks(lt, r, rq, tag);
    r->mark = mark;
    count_peer_blocks(lt, r);
    add_prefill(lt, r, rq);
    lt->st.adds++;
    if (handle != NULL)
        *handle = (uint64_t)r->gen << 32 | s;
    return KVR_OK;
}

int kvr_load_admit(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms,
                   kvr_req_handle_t *handle)
{
    return kvr_load_admit_tagged(lt, rq, now_ms, 0, 0, handle);
}

int kvr_load_block_tag(const kvr_load_t *lt, kvr_worker_t worker, uint64_t hash, uint32_t *tag)
{
    uint32_t s = lt != NULL ? find_worker(lt, worker) : NONE;
    const block_t *e = s == NONE ? NULL : find_block(lt, s, hash);
    if (e == NULL)
        return KVR_ENOTFOUND;
    *tag = e->tag;
    return KVR_OK;
}

int kvr_load_add(kvr_load_t *lt, const kvr_load_request_t *rq, uint64_t now_ms)
{
    return kvr_load_admit(lt, rq, now_ms, NULL);
}

/* The live slot a handle names, or NONE (stale, never issued, or NONE handle). */
static uint32_t slot_of(const kvr_load_t *lt, kvr_req_handle_t h)
{
    uint32_t s = (uint32_t)h, gen = (uint32_t)(h >> 32);
    if (s >= lt->cap_req || !lt->req[s].live || lt->req[s].gen != gen)
        return NONE;
    return s;
}

/* The lifecycle calls share one shape: find the slot (by id or by handle), count a miss,
 * then act on the slot. */
static uint32_t lookup(kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                       uint64_t *misses)
{
    uint32_t s = id != NULL ? find_req(lt, id, id_len) : slot_of(lt, h);
    if (s == NONE)
        (*misses)++;
    return s;
}

int kvr_load_mark(const kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                  kvr_worker_t *worker, uint64_t *mark)
{
    uint32_t s = NONE;
    if (lt != NULL)
        s = id != NULL ? (id_ok(id, id_len) ? find_req(lt, id, id_len) : NONE) : slot_of(lt, h);
    if (s == NONE)
        return KVR_ENOTFOUND;
    *worker = lt->wrk[lt->req[s].wslot].w;
    *mark = lt->req[s].mark;
    return KVR_OK;
}

int kvr_load_handle_id(const kvr_load_t *lt, kvr_req_handle_t h, const char **id, size_t *id_len)
{
    uint32_t s = lt != NULL ? slot_of(lt, h) : NONE;
    if (s == NONE)
        return KVR_ENOTFOUND;
    *id = lt->req[s].id;
    *id_len = lt->req[s].id_len;
    return KVR_OK;
}

int kvr_load_request_handle(const kvr_load_t *lt, const char *id, size_t id_len, kvr_req_handle_t h,
                            kvr_req_handle_t *handle)
{
    if (lt == NULL || handle == NULL || (id != NULL && !id_ok(id, id_len)))
        return KVR_EINVAL;
    uint32_t s = id != NULL ? find_req(lt, id, id_len) : slot_of(lt, h);
    if (s == NONE)
        return KVR_ENOTFOUND;
    *handle = (uint64_t)lt->req[s].gen << 32 | s;
    return KVR_OK;
}

static int first_token_at(kvr_load_t *lt, uint32_t s)
{
    if (s == NONE)
        return KVR_ENOTFOUND;
    end_prefill(lt, &lt->req[s]);
    lt->st.first_tokens++;
    return KVR_OK;
}

int kvr_load_first_token(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms)
{
    (void)now_ms; /* for the decay models of 4.4; static without modeled durations */
    if (lt == NULL || !id_ok(id, id_len))
        return KVR_EINVAL;
    return first_token_at(lt, lookup(lt, id, id_len, 0, &lt->st.unknown_marks));
}

int kvr_load_first_token_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms)
{
    (void)now_ms;
    if (lt == NULL)
        return KVR_EINVAL;
    return first_token_at(lt, lookup(lt, NULL, 0, h, &lt->st.unknown_marks));
}

/* Every block held by this request alone now weighs w. */
static void apply_decay(kvr_load_t *lt, const req_t *r, uint32_t w)
{
    wrk_t *wk = &lt->wrk[r->wslot];
    for (uint32_t c = r->head; c != NONE; c = lt->chk[c].next) {
        const chunk_t *ch = &lt->chk[c];
        for (uint32_t i = 0; i < ch->n; i++) {
            block_t *e = find_block(lt, r->wslot, ch->h[i]);
            if (e == NULL || e->refs != 1)
                continue;
            wk->units = wk->units - e->weight + w;
            e->weight = w;
        }
    }
}

static bool decay_ok(double decay_fraction)
{
    return isnan(decay_fraction) || (decay_fraction >= 0.0 && decay_fraction <= 1.0);
}

static int output_block_at(kvr_load_t *lt, uint32_t s, double decay_fraction)
{
    if (s == NONE)
        return KVR_ENOTFOUND;
    req_t *r = &lt->req[s];
    if (!lt->cfg.track_output_blocks)
        return KVR_OK;
    if (r->n_output == UINT32_MAX)
        return KVR_EFULL;
    int rc = reserve_blocks(lt, 1);
    if (rc == KVR_OK)
        rc = reserve_chunks(lt, 1);
    if (rc != KVR_OK)
        return rc;
    uint64_t h = fresh_hash(lt, r->wslot);
    acquire(lt, r->wslot, h, 0);
    append_hash(lt, r, h);
    r->n_output++;
    if (!isnan(decay_fraction))
        apply_decay(lt, r, (uint32_t)llround(decay_fraction * (double)W_ONE));
    lt->st.output_blocks++;
    return KVR_OK;
}

int kvr_load_output_block(kvr_load_t *lt, const char *id, size_t id_len, double decay_fraction,
                          uint64_t now_ms)
{
    (void)now_ms;
    if (lt == NULL || !id_ok(id, id_len))
        return KVR_EINVAL;
    if (!decay_ok(decay_fraction))
        return KVR_ERANGE;
    return output_block_at(lt, lookup(lt, id, id_len, 0, &lt->st.unknown_marks), decay_fraction);
}

int kvr_load_output_block_h(kvr_load_t *lt, kvr_req_handle_t h, double decay_fraction,
                            uint64_t now_ms)
{
    (void)now_ms;
    if (lt == NULL)
        return KVR_EINVAL;
    if (!decay_ok(decay_fraction))
        return KVR_ERANGE;
    return output_block_at(lt, lookup(lt, NULL, 0, h, &lt->st.unknown_marks), decay_fraction);
}

static int free_at(kvr_load_t *lt, uint32_t s)
{
    if (s == NONE)
        return KVR_ENOTFOUND;
    drop_request(lt, s);
    lt->st.frees++;
    return KVR_OK;
}

int kvr_load_free_request(kvr_load_t *lt, const char *id, size_t id_len, uint64_t now_ms)
{
    (void)now_ms;
    if (lt == NULL || !id_ok(id, id_len))
        return KVR_EINVAL;
    return free_at(lt, lookup(lt, id, id_len, 0, &lt->st.unknown_frees));
}

int kvr_load_free_h(kvr_load_t *lt, kvr_req_handle_t h, uint64_t now_ms)
{
    (void)now_ms;
    if (lt == NULL)
        return KVR_EINVAL;
    return free_at(lt, lookup(lt, NULL, 0, h, &lt->st.unknown_frees));
}

static bool stale(const kvr_load_t *lt, const req_t *r, uint64_t now_ms)
{
    return now_ms >= r->started_ms && now_ms - r->started_ms >= lt->cfg.expiry_ms;
}

size_t kvr_load_expire(kvr_load_t *lt, uint64_t now_ms)
{
    if (lt == NULL)
        return 0;
    lt->last_check_ms = now_ms;
    size_t n = 0;
    while (lt->age_head != NONE && stale(lt, &lt->req[lt->age_head], now_ms)) {
        drop_request(lt, lt->age_head);
        n++;
    }
    lt->st.expired += n;
    return n;
}

uint64_t kvr_load_next_expiry(const kvr_load_t *lt)
{
    if (lt == NULL || lt->age_head == NONE)
        return UINT64_MAX;
    uint64_t started = lt->req[lt->age_head].started_ms;
    return started > UINT64_MAX - lt->cfg.expiry_ms ? UINT64_MAX : started + lt->cfg.expiry_ms;
}

int kvr_load_remove_worker(kvr_load_t *lt, uint64_t worker_id, size_t *n_dropped)
{
    size_t dummy;
    if (n_dropped == NULL)
        n_dropped = &dummy;
    *n_dropped = 0;
    if (lt == NULL)
        return KVR_EINVAL;
    uint64_t ranks = 0;
    for (uint32_t s = 0; s < lt->cap_wrk; s++) {
        if (!lt->wrk[s].used || lt->wrk[s].w.worker_id != worker_id)
            continue;
        ranks++;
        while (lt->wrk[s].used) { /* the slot is freed with its last request */
            drop_request(lt, lt->wrk[s].head);
            (*n_dropped)++;
        }
    }
    lt->st.workers_removed += ranks;
    lt->st.requests_dropped += *n_dropped;
    return ranks > 0 ? KVR_OK : KVR_ENOWORKER;
}

/* ---- queries ---- */

static uint64_t rounded_blocks(uint64_t units)
{
    return (units >> W_SHIFT) + ((units >> (W_SHIFT - 1)) & 1);
}

void kvr_load_snapshot(const kvr_load_t *lt, kvr_worker_t worker, kvr_load_snapshot_t *out)
{
    if (out == NULL)
        return;
    *out = (kvr_load_snapshot_t){0};
    uint32_t s = lt == NULL ? NONE : find_worker(lt, worker);
    if (s == NONE)
        return;
    const wrk_t *w = &lt->wrk[s];
    out->active_blocks = rounded_blocks(w->units);
    out->active_prefill_tokens = w->prefill_tokens;
    out->unique_blocks = w->n_blocks;
    out->active_requests = w->n_requests;
}

/* The longest prefix of q active on the worker (binary search; see the module comment). */
static size_t overlap_depth(const kvr_load_t *lt, uint32_t ws, const uint64_t *q, size_t m)
{
    if (m == 0 || lt->wrk[ws].n_blocks == 0 || find_block(lt, ws, q[0]) == NULL)
        return 0;
    if (find_block(lt, ws, q[m - 1]) != NULL)
        return m;
    size_t lo = 0, hi = m - 1; /* q[lo] active, q[hi] not */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (find_block(lt, ws, q[mid]) != NULL)
            lo = mid;
        else
            hi = mid;
    }
    return lo + 1;
}

static void project_one(const kvr_load_t *lt, const kvr_load_query_t *q, size_t m,
                        kvr_load_projection_t *p)
{
    uint32_t s = find_worker(lt, p->worker);
    uint64_t cached = p->cached_tokens < q->isl_tokens ? p->cached_tokens : q->isl_tokens;
    uint64_t prefill = q->isl_tokens - cached;
    p->active_prefill_tokens = 0;
    p->active_blocks = 0;
    p->active_requests = 0;
    p->overlap_blocks = 0;
    if (s != NONE) {
        const wrk_t *w = &lt->wrk[s];
        p->active_prefill_tokens = w->prefill_tokens;
        p->active_blocks = rounded_blocks(w->units);
        p->active_requests = w->n_requests;
        if (opt_on(q->assume_kv_reuse, lt->cfg.assume_kv_reuse))
            p->overlap_blocks = overlap_depth(lt, s, q->seq, m);
    }
    p->potential_prefill_tokens = p->active_prefill_tokens + prefill;
    p->potential_decode_blocks = p->active_blocks + (m - p->overlap_blocks);
}

int kvr_load_project(const kvr_load_t *lt, const kvr_load_query_t *q, kvr_load_projection_t *p,
                     size_t n)
{
    if (lt == NULL || q == NULL || (n > 0 && p == NULL))
        return KVR_EINVAL;
    size_t m = lt->cfg.track_active_blocks ? q->n_seq : 0;
    if (m > 0 && q->seq == NULL)
        return KVR_EINVAL;
    for (size_t i = 0; i < n; i++)
        project_one(lt, q, m, &p[i]);
    return KVR_OK;
}

int kvr_load_project_one(const kvr_load_t *lt, const kvr_load_query_t *q,
                         kvr_load_projection_t *p)
{
    return kvr_load_project(lt, q, p, 1);
}

int kvr_load_request_info(const kvr_load_t *lt, const char *id, size_t id_len,
                          kvr_load_request_info_t *out)
{
    if (lt == NULL || out == NULL || !id_ok(id, id_len))
        return KVR_EINVAL;
    uint32_t s = find_req(lt, id, id_len);
    if (s == NONE)
        return KVR_ENOTFOUND;
    const req_t *r = &lt->req[s];
    *out = (kvr_load_request_info_t){
        .worker = lt->wrk[r->wslot].w,
        .started_ms = r->started_ms,
        .prefill_tokens = r->prefill_tokens,
        .n_prompt_blocks = r->n_prompt,
        .n_output_blocks = r->n_output,
        .has_expected_output_tokens = r->has_expected != 0,
        .expected_output_tokens = r->expected_output_tokens,
    };
    return KVR_OK;
}

/* The first min(cap, n_prompt) prompt hashes of r into out; their number. */
static size_t copy_prompt(const kvr_load_t *lt, const req_t *r, uint64_t *out, size_t cap)
{
    size_t n = 0, most = r->n_prompt < cap ? r->n_prompt : cap;
    for (uint32_t c = r->head; c != NONE && n < most; c = lt->chk[c].next)
        for (uint32_t i = 0; i < lt->chk[c].n && n < most; i++)
            out[n++] = lt->chk[c].h[i];
    return n;
}

int kvr_load_prompt_h(const kvr_load_t *lt, kvr_req_handle_t h, uint64_t *out, size_t cap,
                      size_t *n)
{
    *n = 0;
    uint32_t s = slot_of(lt, h);
    if (s == NONE)
        return KVR_ENOTFOUND;
    *n = copy_prompt(lt, &lt->req[s], out, cap);
    return KVR_OK;
}

int kvr_load_foreach(const kvr_load_t *lt, kvr_load_visit_fn fn, void *arg)
{
    if (lt == NULL || fn == NULL)
        return KVR_EINVAL;
    uint32_t most = 1;
    for (uint32_t s = lt->age_head; s != NONE; s = lt->req[s].next)
        most = lt->req[s].n_prompt > most ? lt->req[s].n_prompt : most;
    uint64_t *hashes = malloc((size_t)most * sizeof *hashes);
    if (hashes == NULL)
        return KVR_ENOMEM;
    int rc = KVR_OK;
    for (uint32_t s = lt->age_head; s != NONE && rc == KVR_OK; s = lt->req[s].next) {
        const req_t *r = &lt->req[s];
        kvr_load_request_view_t v = {.id = r->id,
                                     .id_len = r->id_len,
                                     .handle = (uint64_t)r->gen << 32 | s,
                                     .prompt_hashes = hashes};
        (void)kvr_load_request_info(lt, r->id, r->id_len, &v.info);
        v.info.n_prompt_blocks = (uint32_t)copy_prompt(lt, r, hashes, most);
        rc = fn(arg, &v);
    }
    free(hashes);
    return rc;
}

static uint64_t bytes_owned(const kvr_load_t *lt)
{
    return sizeof *lt + (uint64_t)lt->cap_req * sizeof *lt->req +
           (uint64_t)(lt->ids_mask + 1) * sizeof *lt->ids +
           (uint64_t)lt->cap_wrk * sizeof *lt->wrk +
           (uint64_t)(lt->wix_mask + 1) * sizeof *lt->wix +
           (uint64_t)(lt->blk_mask + 1) * sizeof *lt->blk + (uint64_t)lt->cap_chk * sizeof *lt->chk;
}

void kvr_load_stats(const kvr_load_t *lt, kvr_load_stats_t *out)
{
    if (out == NULL)
        return;
    *out = (kvr_load_stats_t){0};
    if (lt == NULL)
        return;
    *out = lt->st;
    out->live_requests = lt->n_req;
    out->unique_blocks = lt->n_blk;
    out->workers = lt->n_wrk;
    out->active_prefill_tokens = lt->prefill_total;
    out->bytes = bytes_owned(lt);
    out->max_requests = lt->cfg.max_requests;
    out->peer_requests = lt->n_peer;
    out->max_peer_requests = lt->cfg.max_peer_requests;
    out->peer_blocks = lt->peer_blocks;
}

/* ---- verify ---- */

#define FAIL KVR_VERIFY_FAIL

static int verify_ids(const kvr_load_t *lt, char *msg, size_t msg_len)
{
    size_t n = 0;
    for (size_t i = 0; i <= lt->ids_mask; i++) {
        const ident_t *e = &lt->ids[i];
        if (e->slot == NONE)
            continue;
        n++;
        if (e->slot >= lt->cap_req || !lt->req[e->slot].live)
            FAIL("id entry %zu names a dead slot %u", i, e->slot);
        const req_t *r = &lt->req[e->slot];
        if (r->id_len == 0 || r->id_len > KVR_LOAD_MAX_ID_BYTES ||
            e->hash != r->id_hash || r->id_hash != idhash(lt, r->id, r->id_len))
            FAIL("request slot %u: bad id or id hash", e->slot);
        if (find_req(lt, r->id, r->id_len) != e->slot)
            FAIL("request slot %u unreachable by its id", e->slot);
    }
    if (n != lt->n_req)
        FAIL("id table holds %zu requests, counter %u", n, lt->n_req);
    if (2 * n > lt->ids_mask + 1)
        FAIL("id table over half full");
    return KVR_OK;
}

static int verify_lists(const kvr_load_t *lt, char *msg, size_t msg_len)
{
    uint32_t n = 0, prev = NONE;
    for (uint32_t s = lt->age_head; s != NONE; prev = s, s = lt->req[s].next) {
        if (s >= lt->cap_req || !lt->req[s].live || lt->req[s].prev != prev || ++n > lt->n_req)
            FAIL("age list broken at slot %u", s);
        if (prev != NONE && lt->req[prev].started_ms > lt->req[s].started_ms)
            FAIL("age list out of order at slot %u", s);
    }
    if (n != lt->n_req || lt->age_tail != prev)
        FAIL("age list holds %u of %u requests", n, lt->n_req);
    uint32_t nf = 0;
    for (uint32_t s = lt->free_req; s != NONE; s = lt->req[s].next)
        if (s >= lt->cap_req || lt->req[s].live || ++nf > lt->cap_req)
            FAIL("request free list broken at slot %u", s);
    if (nf + lt->n_req != lt->cap_req)
        FAIL("request slots: %u free + %u live != %u", nf, lt->n_req, lt->cap_req);
    uint32_t peers = 0;
    uint64_t pblocks = 0;
    for (uint32_t i = 0; i < lt->cap_req; i++)
        if (lt->req[i].live && lt->req[i].peer) {
            peers++;
            pblocks += lt->req[i].n_prompt;
        }
    if (peers != lt->n_peer || pblocks != lt->peer_blocks)
        FAIL("%u live peer requests holding %llu blocks, counters %u and %llu", peers,
             (unsigned long long)pblocks, lt->n_peer, (unsigned long long)lt->peer_blocks);
    if (lt->cfg.max_peer_blocks > 0 && lt->peer_blocks > lt->cfg.max_peer_blocks)
        FAIL("peer requests hold %llu blocks, over max_peer_blocks %llu",
             (unsigned long long)lt->peer_blocks, (unsigned long long)lt->cfg.max_peer_blocks);
    if (lt->cfg.max_peer_requests == 0 && lt->n_req > lt->cfg.max_requests)
        FAIL("%u live requests over max_requests %u", lt->n_req, lt->cfg.max_requests);
    if (lt->cfg.max_peer_requests > 0 && (lt->n_peer > lt->cfg.max_peer_requests ||
                                          lt->n_req - lt->n_peer > lt->cfg.max_requests))
        FAIL("%u peer requests (cap %u), %u local (cap %u)", lt->n_peer,
             lt->cfg.max_peer_requests, lt->n_req - lt->n_peer, lt->cfg.max_requests);
    return KVR_OK;
}

/* One worker's request list against its sums; chunk and block counts into cnt. */
static int verify_worker(const kvr_load_t *lt, uint32_t ws, uint32_t *cnt, uint64_t *chunks,
                         char *msg, size_t msg_len)
{
    const wrk_t *w = &lt->wrk[ws];
    if (find_worker(lt, w->w) != ws)
        FAIL("worker slot %u unreachable by its key", ws);
    uint32_t n = 0, prev = NONE;
    uint64_t prefill = 0;
    for (uint32_t s = w->head; s != NONE; prev = s, s = lt->req[s].wnext) {
        const req_t *r = &lt->req[s];
        if (s >= lt->cap_req || !r->live || r->wslot != ws || r->wprev != prev || ++n > lt->n_req)
            FAIL("worker slot %u: request list broken at slot %u", ws, s);
        prefill += r->prefill_tokens;
        uint64_t held = 0;
        for (uint32_t c = r->head; c != NONE; c = lt->chk[c].next) {
            const chunk_t *ch = &lt->chk[c];
            if (c >= lt->cap_chk || ch->n == 0 || ch->n > CHUNK_N ||
                (ch->next != NONE && ch->n != CHUNK_N) || ++*chunks > lt->cap_chk)
                FAIL("request slot %u: chunk %u broken", s, c);
            if (ch->next == NONE && c != r->tail)
                FAIL("request slot %u: tail is not the last chunk", s);
            for (uint32_t i = 0; i < ch->n; i++) {
                const block_t *e = find_block(lt, ws, ch->h[i]);
                if (e == NULL)
                    FAIL("request slot %u holds a block missing from the table", s);
                cnt[e - lt->blk]++;
            }
            held += ch->n;
        }
        if (held != (uint64_t)r->n_prompt + r->n_output || (r->head == NONE) != (r->tail == NONE))
            FAIL("request slot %u: %llu hashes for %u + %u blocks", s, (unsigned long long)held,
                 r->n_prompt, r->n_output);
        if (r->n_output > 0 && !lt->cfg.track_output_blocks)
            FAIL("request slot %u has output blocks while not tracking them", s);
    }
    if (n != w->n_requests || n == 0)
        FAIL("worker slot %u: %u requests listed, counter %u", ws, n, w->n_requests);
    if (prefill != w->prefill_tokens)
        FAIL("worker slot %u: prefill tokens %llu, requests sum %llu", ws,
             (unsigned long long)w->prefill_tokens, (unsigned long long)prefill);
    return KVR_OK;
}

static int verify_workers(const kvr_load_t *lt, uint32_t *cnt, char *msg, size_t msg_len)
{
    uint32_t used = 0, nf = 0;
    uint64_t chunks = 0, prefill = 0;
    for (uint32_t s = 0; s < lt->cap_wrk; s++) {
        if (!lt->wrk[s].used)
            continue;
        used++;
        prefill += lt->wrk[s].prefill_tokens;
        int rc = verify_worker(lt, s, cnt, &chunks, msg, msg_len);
        if (rc != KVR_OK)
            return rc;
    }
    for (uint32_t s = lt->free_wrk; s != NONE; s = lt->wrk[s].next)
        if (s >= lt->cap_wrk || lt->wrk[s].used || ++nf > lt->cap_wrk)
            FAIL("worker free list broken at slot %u", s);
    size_t indexed = 0;
    for (size_t i = 0; i <= lt->wix_mask; i++)
        indexed += lt->wix[i] != NONE;
    if (used != lt->n_wrk || nf + used != lt->cap_wrk || indexed != used)
        FAIL("workers: %u used, %u free, %zu indexed, counter %u, slots %u", used, nf, indexed,
             lt->n_wrk, lt->cap_wrk);
    uint32_t nfc = 0;
    for (uint32_t c = lt->free_chk; c != NONE; c = lt->chk[c].next)
        if (c >= lt->cap_chk || ++nfc > lt->cap_chk)
            FAIL("chunk free list broken at %u", c);
    if (nfc != lt->n_free_chk || chunks + nfc != lt->cap_chk)
        FAIL("chunks: %llu held + %u free (counter %u) != %u", (unsigned long long)chunks, nfc,
             lt->n_free_chk, lt->cap_chk);
    if (prefill != lt->prefill_total)
        FAIL("prefill total %llu, workers sum %llu", (unsigned long long)lt->prefill_total,
             (unsigned long long)prefill);
    return KVR_OK;
}

static int verify_blocks(const kvr_load_t *lt, const uint32_t *cnt, uint64_t *sums, char *msg,
                         size_t msg_len)
{
    size_t n = 0;
    for (size_t i = 0; i <= lt->blk_mask; i++) {
        const block_t *e = &lt->blk[i];
        if (e->refs == 0)
            continue;
        n++;
        if (e->wslot >= lt->cap_wrk || !lt->wrk[e->wslot].used)
            FAIL("block entry %zu belongs to a free worker slot %u", i, e->wslot);
        if (e->refs != cnt[i])
            FAIL("block entry %zu: refcount %u, held %u times", i, e->refs, cnt[i]);
        if (e->weight > W_ONE)
            FAIL("block entry %zu: weight %u over 1.0", i, e->weight);
        if (find_block(lt, e->wslot, e->hash) != e)
            FAIL("block entry %zu unreachable from its home", i);
        sums[2 * (size_t)e->wslot] += e->weight;
        sums[2 * (size_t)e->wslot + 1]++;
    }
    if (n != lt->n_blk || 2 * n > lt->blk_mask + 1)
        FAIL("block table holds %zu entries, counter %zu, capacity %zu", n, lt->n_blk,
             lt->blk_mask + 1);
    if (n > 0 && !lt->cfg.track_active_blocks)
        FAIL("blocks held while not tracking active blocks");
    for (uint32_t s = 0; s < lt->cap_wrk; s++) {
        const wrk_t *w = &lt->wrk[s];
        if (w->used && (w->units != sums[2 * (size_t)s] || w->n_blocks != sums[2 * (size_t)s + 1]))
            FAIL("worker slot %u: units %llu / blocks %llu, entries say %llu / %llu", s,
                 (unsigned long long)w->units, (unsigned long long)w->n_blocks,
                 (unsigned long long)sums[2 * (size_t)s],
                 (unsigned long long)sums[2 * (size_t)s + 1]);
    }
    return KVR_OK;
}

int kvr_load_verify(const kvr_load_t *lt, char *msg, size_t msg_len)
{
    if (lt == NULL)
        FAIL("tracker is NULL");
    int rc = verify_ids(lt, msg, msg_len);
    if (rc == KVR_OK)
        rc = verify_lists(lt, msg, msg_len);
    if (rc != KVR_OK)
        return rc;
    uint32_t *cnt = calloc(lt->blk_mask + 1, sizeof *cnt);
    uint64_t *sums = calloc(2 * (size_t)lt->cap_wrk + 1, sizeof *sums);
    if (cnt == NULL || sums == NULL) {
        free(cnt);
        free(sums);
        if (msg != NULL && msg_len > 0)
            snprintf(msg, msg_len, "out of memory");
        return KVR_ENOMEM;
    }
    rc = verify_workers(lt, cnt, msg, msg_len);
    if (rc == KVR_OK)
        rc = verify_blocks(lt, cnt, sums, msg, msg_len);
    free(cnt);
    free(sums);
    return rc;
}
