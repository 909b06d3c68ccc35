/*
 * registry.h (private to the tree; not installed): the router's worker registry
 * (core/registry.c): the registered workers (their specs, fencing, learned adapters, per-rank
 * status and step clocks), the rank table the router routes over, and the model pools and
 * roles that decide which workers serve a request.
 *
 * Invariants: the rank table (cands, rank_widx, rmap) lists exactly the ranks
 * [dp_start, dp_start + dp_size) of every registered worker, in registration order, and is
 * rebuilt on every registry change; per-request fields of cands (overlaps, loads, busy) and
 * wfit / all_fit are the router's, rewritten by every route before use. kvr_registry_check
 * verifies the table; debug builds assert it after every change.
 * Ownership: the registry owns its arrays (kvr_registry_deinit frees them); specs are copied
 * in; pointers into it live until the next add or remove. Threads: the router's thread.
 * Cost: add / remove O(ranks); find O(workers); a rank by (worker_id, rank) O(1) expected.
 */
#ifndef KVR_CORE_REGISTRY_H
#define KVR_CORE_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/select.h"
#include "core/stepclock.h"
#include "kvrouter/router.h"

typedef struct kvr_rank {
    kvr_rank_status_t st; /* what the ingest side reports */
    kvr_stepclock_t clk;  /* its engine's steps */
} kvr_rank_t;

typedef struct kvr_wentry {
    kvr_worker_spec_t spec;
    const char *taint_ptrs[KVR_MAX_TAINTS];
    bool fenced;
    kvr_rank_t *rk;                /* dp_size entries */
    char learned[KVR_LORAS_BYTES]; /* adapters its engine lists (/v1/models), ';'-separated */
} kvr_wentry_t;

/* How a request's prompt is hashed: its model's block size and Eagle setting, its adapter. */
typedef struct kvr_pool_hash {
    uint32_t bs;
    bool eagle;
    const char *lora;
    size_t lora_len;
} kvr_pool_hash_t;

typedef struct kvr_registry {
    uint32_t block_size; /* the router's: a worker registered with block_size 0 has it */
    kvr_wentry_t *w;
    size_t n_w, cap_w;
    bool *wfit;        /* per worker (cap_w): serves the request being routed (model, adapter) */
    bool all_fit;      /* every worker serves it (wfit not consulted) */
    size_t n_pooled;   /* workers registered with a model or adapters (0: no pool logic) */
    size_t n_prefill;  /* workers of role prefill (0: no role logic) */
    bool prefill_seen; /* a prefill worker was registered once (the pool left "pending") */

    kvr_select_candidate_t *cands; /* the rank table: one candidate per rank */
    kvr_load_projection_t *proj;   /* per rank: the router's load projection scratch */
    uint32_t *rank_widx;           /* per rank: its worker's index in w */
    size_t n_ranks, cap_ranks;
    uint32_t *rmap; /* (worker_id, rank) -> cand index + 1; 0 = empty */
    size_t rmap_mask;
} kvr_registry_t;

void kvr_registry_init(kvr_registry_t *g, uint32_t block_size);
void kvr_registry_deinit(kvr_registry_t *g);

/* The worker's index in w, or -1. */
long kvr_registry_find(const kvr_registry_t *g, uint64_t id);
/* The rank's index in the rank table, or -1. */
long kvr_registry_rank(const kvr_registry_t *g, kvr_worker_t w);
/* KVR_OK, or KVR_EINVAL (err says why) when w's model is served with another block size or
 * Eagle setting: a model's requests are hashed one way. */
int kvr_registry_check_pool(const kvr_registry_t *g, const kvr_worker_spec_t *w, char *err,
                            size_t err_len);
/* Appends a validated spec (its id not registered) and rebuilds the rank table. KVR_ENOMEM
 * leaves the registry as it was. */
int kvr_registry_add(kvr_registry_t *g, const kvr_worker_spec_t *w);
/* Removes worker i (< n_w) and rebuilds the rank table. */
int kvr_registry_remove(kvr_registry_t *g, size_t i);
/* Rebuilds the rank table from the workers (per-request fields zeroed). */
int kvr_registry_rebuild(kvr_registry_t *g);
/* Worker i's learned adapters (the whole names that fit). */
void kvr_registry_set_learned(kvr_registry_t *g, size_t i, const char *loras);
bool kvr_registry_serves_lora(const kvr_wentry_t *w, const char *l, size_t n);

/* How q's prompt is hashed (its model's reference worker). */
kvr_pool_hash_t kvr_registry_pool_of(const kvr_registry_t *g, const kvr_route_req_t *q);
bool kvr_registry_is_adapter(const kvr_registry_t *g, const char *name, size_t len);
/* Marks, per worker, whether it serves q (wfit, all_fit) and sets *cur (pool_of).
 * KVR_ENOMODEL when no worker serves the named model, or (lora_strict) none declares the named
 * adapter; KVR_ENOWORKER when no worker of q's pool serves it; *field says which. */
int kvr_registry_resolve(kvr_registry_t *g, const kvr_route_req_t *q, bool lora_strict,
                         kvr_pool_hash_t *cur, const char **field);

size_t kvr_registry_n_role(const kvr_registry_t *g, kvr_worker_role_t role, bool ready_only);
size_t kvr_registry_n_ready(const kvr_registry_t *g);
/* A registered rank's status and step clock (NULL / rank k of the table). */
kvr_rank_status_t *kvr_registry_rank_status(const kvr_registry_t *g, kvr_worker_t w);
kvr_stepclock_t *kvr_registry_clock(const kvr_registry_t *g, size_t k);

/* Checks the invariants above; true when they hold. O(ranks); for asserts and tests. */
bool kvr_registry_check(const kvr_registry_t *g);
#ifdef NDEBUG
#define KVR_REGISTRY_ASSERT(g) ((void)0)
#else
#define KVR_REGISTRY_ASSERT(g) assert(kvr_registry_check(g))
#endif

#endif /* KVR_CORE_REGISTRY_H */
