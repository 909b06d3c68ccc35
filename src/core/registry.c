/*
 * registry.c: the worker registry (registry.h): worker specs (parsing and validation), the
 * registered workers, their ranks (the rank table and its (worker_id, rank) map) and the model
 * pools a request is served by.
 *
 * Invariants (kvr_registry_check, asserted after every change in debug builds): the rank table
 * (cands, rank_widx, rmap) lists exactly the ranks [dp_start, dp_start + dp_size) of every
 * registered worker, in registration order; rmap maps each to its index and holds nothing
 * else; n_pooled and n_prefill count the pooled and prefill workers; every worker's taint
 * pointers point into its own spec. Per-request fields of cands are the router's: rebuilding
 * zeroes them.
 * Ownership: the registry owns every array here; specs are copied in. Threads: the router's
 * thread (no locks). Cost: add and remove O(ranks) (the table is rebuilt); find O(workers);
 * a rank by (worker_id, rank) O(1) expected; resolving a request's pool O(workers).
 */
#include "core/registry.h"

#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/namelist.h"
#include "core/endpoint.h"

const char *kvr_rank_state_name(kvr_rank_state_t s)
{
    static const char *const names[] = {"no_events", "exact", "recovering",
                                        "degraded",  "error", "unreachable"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "unknown";
}

/* ---------------------------------------------------------------------------------------- */
/* Worker specs */

static int spec_err(char *err, size_t len, const char *fmt, const char *a, const char *b)
{
    if (err != NULL && len > 0)
        snprintf(err, len, fmt, a, b);
    return KVR_EINVAL;
}

static int parse_u64(const char *v, uint64_t *out)
{
    if (*v == '\0' || *v == '-' || *v == '+')
        return -1;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end != '\0')
        return -1;
    *out = (uint64_t)x;
    return 0;
}

static int set_str(char *dst, size_t cap, const char *v, const char *key, char *err, size_t len)
{
    if (strlen(v) >= cap)
        return spec_err(err, len, "worker %s: longer than the limit ('%.40s')", key, v);
    memcpy(dst, v, strlen(v) + 1);
    return KVR_OK;
}

static int set_taints(kvr_worker_spec_t *w, const char *v, char *err, size_t len)
{
    w->n_taints = 0;
    while (*v != '\0') {
        const char *semi = strchr(v, ';');
        size_t n = semi ? (size_t)(semi - v) : strlen(v);
        if (n == 0 || n >= KVR_TAINT_BYTES || w->n_taints == KVR_MAX_TAINTS)
            return spec_err(err, len, "worker taints: at most 8 non-empty taints of < 64 bytes%s%s",
                            "", "");
        memcpy(w->taints[w->n_taints], v, n);
        w->taints[w->n_taints++][n] = '\0';
        v += n + (semi ? 1 : 0);
    }
    return KVR_OK;
}

static const char *const ROLE_NAMES[] = {"both", "prefill", "decode"};

const char *kvr_worker_role_name(kvr_worker_role_t role)
{
    return (unsigned)role < 3 ? ROLE_NAMES[role] : "?";
}

int kvr_worker_role_parse(const char *s, size_t len, kvr_worker_role_t *out)
{
    for (unsigned i = 0; i < 3; i++)
        if (strlen(ROLE_NAMES[i]) == len && memcmp(ROLE_NAMES[i], s, len) == 0) {
            *out = (kvr_worker_role_t)i;
            return KVR_OK;
        }
    return KVR_EINVAL;
}

static int spec_kv(kvr_worker_spec_t *w, const char *key, const char *v, bool *has_id, char *err,
                   size_t len)
{
    uint64_t x;
    if (strcmp(key, "role") == 0) {
        if (kvr_worker_role_parse(v, strlen(v), &w->role) != KVR_OK)
            return spec_err(err, len, "worker role: prefill, decode or both ('%s')%s", v, "");
        return KVR_OK;
    }
    if (strcmp(key, "bootstrap_host") == 0)
        return set_str(w->bootstrap_host, sizeof w->bootstrap_host, v, key, err, len);
    if (strcmp(key, "bootstrap_port") == 0) {
        if (parse_u64(v, &x) != 0 || x == 0 || x > 65535)
            return spec_err(err, len, "worker bootstrap_port: an integer in [1, 65535] ('%s')%s", v,
                            "");
        w->bootstrap_port = (uint32_t)x;
        return KVR_OK;
    }
    if (strcmp(key, "id") == 0 || strcmp(key, "worker_id") == 0) {
        if (parse_u64(v, &w->worker_id) != 0)
            return spec_err(err, len, "worker id: not an unsigned integer ('%s')%s", v, "");
        *has_id = true;
        return KVR_OK;
    }
    if (strcmp(key, "url") == 0)
        return set_str(w->url, sizeof w->url, v, key, err, len);
    if (strcmp(key, "events") == 0)
        return set_str(w->events, sizeof w->events, v, key, err, len);
    if (strcmp(key, "replay") == 0)
        return set_str(w->replay, sizeof w->replay, v, key, err, len);
    if (strcmp(key, "taints") == 0)
        return set_taints(w, v, err, len);
    if (strcmp(key, "model") == 0)
        return set_str(w->model, sizeof w->model, v, key, err, len);
    if (strcmp(key, "loras") == 0)
        return set_str(w->loras, sizeof w->loras, v, key, err, len);
    if (strcmp(key, "tokenizer") == 0)
        return set_str(w->tokenizer, sizeof w->tokenizer, v, key, err, len);
    if (strcmp(key, "block_size") == 0) {
        if (parse_u64(v, &x) != 0 || x == 0 || x > 65536)
            return spec_err(err, len, "worker block_size: an integer in [1, 65536] ('%s')%s", v,
                            "");
        w->block_size = (uint32_t)x;
        return KVR_OK;
    }
    if (strcmp(key, "eagle") == 0 || strcmp(key, "is_eagle") == 0) {
        if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
            w->eagle = true;
        else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
            w->eagle = false;
        else
            return spec_err(err, len, "worker eagle: true, false, 1 or 0 ('%s')%s", v, "");
        return KVR_OK;
    }
    bool num = parse_u64(v, &x) == 0;
    if (strcmp(key, "dp_size") == 0 && num && x <= UINT32_MAX)
        w->dp_size = (uint32_t)x;
    else if (strcmp(key, "dp_start") == 0 && num && x <= UINT32_MAX)
        w->dp_start = (uint32_t)x;
    else if (strcmp(key, "max_num_batched_tokens") == 0 && num)
        w->max_num_batched_tokens = x;
    else if ((strcmp(key, "total_kv_blocks") == 0 || strcmp(key, "num_blocks") == 0) && num)
        w->total_kv_blocks = x;
    else if (strcmp(key, "dp_size") == 0 || strcmp(key, "dp_start") == 0 ||
             strcmp(key, "max_num_batched_tokens") == 0 || strcmp(key, "total_kv_blocks") == 0 ||
             strcmp(key, "num_blocks") == 0)
        return spec_err(err, len, "worker %s: not an unsigned integer ('%s')", key, v);
    else
        return spec_err(err, len, "worker: unknown key '%s'%s", key, "");
    return KVR_OK;
}

int kvr_worker_spec_parse(const char *text, kvr_worker_spec_t *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    out->dp_size = 1;
    char buf[2048];
    if (text == NULL || strlen(text) >= sizeof buf)
        return spec_err(err, err_len, "worker: description missing or too long%s%s", "", "");
    memcpy(buf, text, strlen(text) + 1);
    bool has_id = false;
    for (char *save = NULL, *item = strtok_r(buf, ",", &save); item != NULL;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (eq == NULL)
            return spec_err(err, err_len, "worker: expected key=value, got '%s'%s", item, "");
        *eq = '\0';
        int rc = spec_kv(out, item, eq + 1, &has_id, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    if (!has_id)
        return spec_err(err, err_len, "worker: id is required (id=<unsigned integer>)%s%s", "", "");
    return kvr_worker_spec_validate(out, err, err_len);
}

int kvr_worker_spec_validate(const kvr_worker_spec_t *w, char *err, size_t err_len)
{
    if (w->dp_size == 0 || w->dp_size > KVR_MAX_DP_SIZE)
        return spec_err(err, err_len, "worker dp_size: must be in [1, 256]%s%s", "", "");
    if ((uint64_t)w->dp_start + w->dp_size > UINT32_MAX)
        return spec_err(err, err_len, "worker dp_start: dp_start + dp_size overflows%s%s", "", "");
    if (w->replay[0] != '\0' && w->events[0] == '\0')
        return spec_err(err, err_len, "worker replay: needs events too%s%s", "", "");
    if (w->block_size > 65536)
        return spec_err(err, err_len, "worker block_size: must be in [1, 65536]%s%s", "", "");
    if ((unsigned)w->role > KVR_ROLE_DECODE)
        return spec_err(err, err_len, "worker role: prefill, decode or both%s%s", "", "");
    if (w->bootstrap_port > 65535)
        return spec_err(err, err_len, "worker bootstrap_port: must be in [1, 65535]%s%s", "", "");
    if ((w->bootstrap_port != 0 || w->bootstrap_host[0] != '\0') && w->role != KVR_ROLE_PREFILL)
        return spec_err(err, err_len,
                        "worker bootstrap_port: only a prefill worker (role=prefill) has a "
                        "bootstrap server%s%s",
                        "", "");
    if (w->bootstrap_host[0] != '\0' && w->bootstrap_port == 0)
        return spec_err(err, err_len, "worker bootstrap_host: needs bootstrap_port too%s%s", "",
                        "");
    for (const char *h = w->bootstrap_host; *h != '\0'; h++)
        if ((unsigned char)*h <= 0x20 || *h == '/' || *h == '@' || *h == '?' || *h == '#')
            return spec_err(err, err_len,
                            "worker bootstrap_host: a host name or address only (no scheme, "
                            "port, path or space)%s%s",
                            "", "");
    for (const char *l = w->loras; *l != '\0'; l++)
        if ((*l == ';' && (l == w->loras || l[1] == ';' || l[1] == '\0')) ||
            (unsigned char)*l < 0x20)
            return spec_err(err, err_len,
                            "worker loras: names separated by single ';', no "
                            "empty name or control character%s%s",
                            "", "");
    /* the url's grammar; allow lists are the router's (check_endpoints) */
    char e[KVR_ADDR_BYTES + 160];
    if (w->url[0] != '\0' && kvr_endpoint_check_url(w->url, NULL, e, sizeof e) != KVR_OK)
        return spec_err(err, err_len, "worker %s%s", e, "");
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Workers and the rank table */

void kvr_registry_init(kvr_registry_t *g, uint32_t block_size)
{
    memset(g, 0, sizeof *g);
    g->block_size = block_size;
}

void kvr_registry_deinit(kvr_registry_t *g)
{
    for (size_t i = 0; i < g->n_w; i++)
        free(g->w[i].rk);
    free(g->w);
    free(g->wfit);
    free(g->cands);
    free(g->proj);
    free(g->rank_widx);
    free(g->rmap);
    memset(g, 0, sizeof *g);
}

static size_t rmap_slot(uint64_t id, uint32_t rank, size_t mask)
{
    uint64_t x = id * UINT64_C(0x9E3779B97F4A7C15) ^ ((uint64_t)rank << 32 | rank);
    x ^= x >> 31;
    return (size_t)(x * UINT64_C(0xBF58476D1CE4E5B9) >> 17) & mask;
}

long kvr_registry_rank(const kvr_registry_t *g, kvr_worker_t w)
{
    if (g->rmap == NULL)
        return -1;
    for (size_t i = rmap_slot(w.worker_id, w.dp_rank, g->rmap_mask);; i = (i + 1) & g->rmap_mask) {
        uint32_t v = g->rmap[i];
        if (v == 0)
            return -1;
        const kvr_select_candidate_t *c = &g->cands[v - 1];
        if (c->worker.worker_id == w.worker_id && c->worker.dp_rank == w.dp_rank)
            return (long)v - 1;
    }
}

int kvr_registry_rebuild(kvr_registry_t *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_w; i++)
        n += g->w[i].spec.dp_size;
    if (n > g->cap_ranks) {
        size_t cap = n * 2;
        kvr_select_candidate_t *c = realloc(g->cands, cap * sizeof *c);
        if (c != NULL)
            g->cands = c;
        kvr_load_projection_t *p = realloc(g->proj, cap * sizeof *p);
        if (p != NULL)
            g->proj = p;
        uint32_t *wi = realloc(g->rank_widx, cap * sizeof *wi);
        if (wi != NULL)
            g->rank_widx = wi;
        if (c == NULL || p == NULL || wi == NULL)
            return KVR_ENOMEM;
        g->cap_ranks = cap;
    }
    size_t mcap = 64;
    while (mcap < 2 * n)
        mcap *= 2;
    uint32_t *map = calloc(mcap, sizeof *map);
    if (map == NULL)
        return KVR_ENOMEM;
    free(g->rmap);
    g->rmap = map;
    g->rmap_mask = mcap - 1;
    size_t k = 0;
    for (size_t i = 0; i < g->n_w; i++) {
        kvr_wentry_t *we = &g->w[i];
        for (uint32_t d = 0; d < we->spec.dp_size; d++, k++) {
            kvr_select_candidate_t *c = &g->cands[k];
            memset(c, 0, sizeof *c);
            c->worker = (kvr_worker_t){we->spec.worker_id, we->spec.dp_start + d};
            c->taints = we->taint_ptrs;
            c->n_taints = we->spec.n_taints;
            g->rank_widx[k] = (uint32_t)i;
            size_t s = rmap_slot(c->worker.worker_id, c->worker.dp_rank, g->rmap_mask);
            while (g->rmap[s] != 0)
                s = (s + 1) & g->rmap_mask;
            g->rmap[s] = (uint32_t)k + 1;
        }
    }
    g->n_ranks = n;
    return KVR_OK;
}

long kvr_registry_find(const kvr_registry_t *g, uint64_t id)
{
    for (size_t i = 0; i < g->n_w; i++)
        if (g->w[i].spec.worker_id == id)
            return (long)i;
    return -1;
}

static void fix_taint_ptrs(kvr_wentry_t *we)
{
    for (size_t t = 0; t < we->spec.n_taints; t++)
        we->taint_ptrs[t] = we->spec.taints[t];
}

static bool model_is(const kvr_worker_spec_t *s, const char *m, size_t n)
{
    return strlen(s->model) == n && memcmp(s->model, m, n) == 0;
}

/* The worker serves the adapter: registered with it, or its engine lists it. */
bool kvr_registry_serves_lora(const kvr_wentry_t *w, const char *l, size_t n)
{
    return kvr_namelist_has(w->spec.loras, l, n) || kvr_namelist_has(w->learned, l, n);
}

/* The worker takes part in model pools (a model, or adapters registered or learned). */
static bool pooled(const kvr_wentry_t *w)
{
    return w->spec.model[0] != '\0' || w->spec.loras[0] != '\0' || w->learned[0] != '\0';
}

/* What the registration names, against the operator's allow lists (core/endpoint.h). */
/* A model's workers hash the same way: same block size and Eagle setting as the model's
 * registered workers (a worker without a model is the "any model" pool), and tokenize the same
 * way: two workers of a model naming tokenizer folders name the same one. */
int kvr_registry_check_pool(const kvr_registry_t *g, const kvr_worker_spec_t *w, char *err,
                            size_t err_len)
{
    uint32_t bs = w->block_size ? w->block_size : g->block_size;
    for (size_t i = 0; i < g->n_w && w->tokenizer[0] != '\0'; i++) {
        const kvr_worker_spec_t *o = &g->w[i].spec;
        if (strcmp(o->model, w->model) == 0 && o->tokenizer[0] != '\0' &&
            strcmp(o->tokenizer, w->tokenizer) != 0) {
            snprintf(err, err_len,
                     "worker %llu: tokenizer %s, but model '%s' is tokenized from %s (worker "
                     "%llu): a model's prompts are tokenized one way",
                     (unsigned long long)w->worker_id, w->tokenizer,
                     w->model[0] ? w->model : "(any)", o->tokenizer,
                     (unsigned long long)o->worker_id);
            return KVR_EINVAL;
        }
    }
    for (size_t i = 0; i < g->n_w; i++) {
        const kvr_worker_spec_t *o = &g->w[i].spec;
        if (strcmp(o->model, w->model) != 0)
            continue;
        uint32_t obs = o->block_size ? o->block_size : g->block_size;
        if (obs != bs || o->eagle != w->eagle) {
            snprintf(err, err_len,
                     "worker %llu: block_size %u, eagle=%s, but model '%s' is served with "
                     "block_size %u, eagle=%s (worker %llu): a model's requests are hashed one way",
                     (unsigned long long)w->worker_id, bs, w->eagle ? "true" : "false",
                     w->model[0] ? w->model : "(any)", obs, o->eagle ? "true" : "false",
                     (unsigned long long)o->worker_id);
            return KVR_EINVAL;
        }
        return KVR_OK;
    }
    return KVR_OK;
}

int kvr_registry_add(kvr_registry_t *g, const kvr_worker_spec_t *w)
{
    if (g->n_w == g->cap_w) {
        size_t cap = g->cap_w ? g->cap_w * 2 : 16;
        kvr_wentry_t *nw = realloc(g->w, cap * sizeof *nw);
        if (nw == NULL)
            return KVR_ENOMEM;
        g->w = nw;
        bool *fit = realloc(g->wfit, cap * sizeof *fit);
        if (fit == NULL)
            return KVR_ENOMEM; /* g->w grew, which is harmless */
        g->wfit = fit;
        g->cap_w = cap;
        for (size_t i = 0; i < g->n_w; i++)
            fix_taint_ptrs(&g->w[i]); /* the specs moved */
    }
    kvr_wentry_t *we = &g->w[g->n_w];
    memset(we, 0, sizeof *we);
    we->spec = *w;
    we->rk = calloc(w->dp_size, sizeof *we->rk);
    if (we->rk == NULL)
        return KVR_ENOMEM;
    fix_taint_ptrs(we);
    g->n_w++;
    int rc = kvr_registry_rebuild(g);
    if (rc != KVR_OK) {
        free(we->rk);
        g->n_w--;
        return rc;
    }
    g->n_pooled += pooled(we);
    g->n_prefill += we->spec.role == KVR_ROLE_PREFILL;
    g->prefill_seen = g->prefill_seen || we->spec.role == KVR_ROLE_PREFILL;
    KVR_REGISTRY_ASSERT(g);
    return rc;
}

int kvr_registry_remove(kvr_registry_t *g, size_t i)
{
    assert(i < g->n_w);
    free(g->w[i].rk);
    g->n_pooled -= pooled(&g->w[i]);
    g->n_prefill -= g->w[i].spec.role == KVR_ROLE_PREFILL;
    memmove(&g->w[i], &g->w[i + 1], (g->n_w - i - 1) * sizeof *g->w);
    g->n_w--;
    for (size_t k = i; k < g->n_w; k++)
        fix_taint_ptrs(&g->w[k]);
    int rc = kvr_registry_rebuild(g);
    if (rc == KVR_OK)
        KVR_REGISTRY_ASSERT(g);
    return rc;
}

void kvr_registry_set_learned(kvr_registry_t *g, size_t i, const char *loras)
{
    kvr_wentry_t *w = &g->w[i];
    g->n_pooled -= pooled(w);
    size_t n = strlen(loras);
    if (n >= sizeof w->learned) { /* keep the whole names that fit */
        n = sizeof w->learned - 1;
        while (n > 0 && loras[n] != ';')
            n--;
    }
    memcpy(w->learned, loras, n);
    w->learned[n] = '\0';
    g->n_pooled += pooled(w);
}

/* ---------------------------------------------------------------------------------------- */
/* Model pools: which workers serve a request, and how its prompt is hashed */

/* The worker whose settings the request's prompt is hashed with: the first worker of its
 * model (or serving the adapter it names as its model), else the first worker serving any
 * model, else (no model named) the first worker. */
static const kvr_worker_spec_t *pool_ref(const kvr_registry_t *g, const kvr_route_req_t *q)
{
    bool named = q->model != NULL && q->model_len > 0;
    const kvr_worker_spec_t *any = NULL;
    for (size_t i = 0; i < g->n_w; i++) {
        const kvr_worker_spec_t *s = &g->w[i].spec;
        if (!named || model_is(s, q->model, q->model_len) ||
            (g->n_pooled > 0 && kvr_registry_serves_lora(&g->w[i], q->model, q->model_len)))
            return s;
        if (any == NULL && s->model[0] == '\0')
            any = s;
    }
    return any;
}

/* How q's prompt is hashed: its model's block size and Eagle setting, and its adapter (its
 * lora_name, or its model when that names an adapter, as vLLM's server takes adapters). */
kvr_pool_hash_t kvr_registry_pool_of(const kvr_registry_t *g, const kvr_route_req_t *q)
{
    /* Without pools every worker is unpooled and pool_ref would find the first: skip the scan. */
    const kvr_worker_spec_t *ref = g->n_pooled > 0 ? pool_ref(g, q)
                                   : g->n_w > 0    ? &g->w[0].spec
                                                   : NULL;
    kvr_pool_hash_t p = {ref != NULL && ref->block_size ? ref->block_size : g->block_size,
                         ref != NULL && ref->eagle, q->lora_name, q->lora_name_len};
    if ((p.lora == NULL || p.lora_len == 0) && q->model != NULL && q->model_len > 0 &&
        kvr_registry_is_adapter(g, q->model, q->model_len)) {
        p.lora = q->model;
        p.lora_len = q->model_len;
    }
    return p;
}

bool kvr_registry_is_adapter(const kvr_registry_t *g, const char *name, size_t len)
{
    if (g->n_pooled == 0)
        return false;
    bool adapter = false;
    for (size_t i = 0; i < g->n_w; i++) {
        if (model_is(&g->w[i].spec, name, len))
            return false;
        adapter = adapter || kvr_registry_serves_lora(&g->w[i], name, len);
    }
    return adapter;
}

static bool in_pool(const kvr_worker_spec_t *s, kvr_pool_t pool)
{
    return pool == KVR_POOL_PREFILL ? s->role == KVR_ROLE_PREFILL : s->role != KVR_ROLE_PREFILL;
}

int kvr_registry_resolve(kvr_registry_t *g, const kvr_route_req_t *q, bool lora_strict,
                         kvr_pool_hash_t *cur, const char **field)
{
    bool named = q->model != NULL && q->model_len > 0;
    bool lora = q->lora_name != NULL && q->lora_name_len > 0;
    bool models = g->n_pooled > 0 && (named || lora);
    bool roles = g->n_prefill > 0 || q->pool == KVR_POOL_PREFILL;
    g->all_fit = !models && !roles;
    *cur = kvr_registry_pool_of(g, q); /* O(1) without pools: the first worker is the reference */
    if (g->all_fit)
        return KVR_OK;
    size_t n_model = 0, n_role = 0, n_lora = 0;
    for (size_t i = 0; i < g->n_w; i++) {
        const kvr_worker_spec_t *s = &g->w[i].spec;
        bool m =
            !models || !named || s->model[0] == '\0' || model_is(s, q->model, q->model_len) ||
            kvr_registry_serves_lora(&g->w[i], q->model, q->model_len); /* one of its adapters */
        bool in = m && in_pool(s, q->pool);
        g->wfit[i] = in;
        n_model += m;
        n_role += in;
        n_lora += in && models && lora &&
                  kvr_registry_serves_lora(&g->w[i], q->lora_name, q->lora_name_len);
    }
    if (named && n_model == 0 && g->n_w > 0) {
        *field = "model: no worker serves it";
        return KVR_ENOMODEL;
    }
    if (n_role == 0) {
        *field = q->pool == KVR_POOL_PREFILL ? "no prefill worker (role=prefill) serves it"
                                             : "no decode worker (role=decode or both) serves it";
        return KVR_ENOWORKER;
    }
    if (models && lora && n_lora == 0 && lora_strict) {
        *field = "lora_name: no worker serves this adapter (lora_strict)";
        return KVR_ENOMODEL;
    }
    if (n_lora > 0) /* only the workers that declare the adapter */
        for (size_t i = 0; i < g->n_w; i++)
            g->wfit[i] =
                g->wfit[i] && kvr_registry_serves_lora(&g->w[i], q->lora_name, q->lora_name_len);
    return KVR_OK;
}

const char *kvr_disagg_state_name(kvr_disagg_state_t s)
{
    static const char *const names[] = {"pending", "active", "unavailable"};
    return (unsigned)s < 3 ? names[s] : "?";
}

size_t kvr_registry_n_role(const kvr_registry_t *g, kvr_worker_role_t role, bool ready_only)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_w; i++)
        n += g->w[i].spec.role == role && !(ready_only && g->w[i].fenced);
    return n;
}

size_t kvr_registry_n_ready(const kvr_registry_t *g)
{
    size_t n = 0;
    for (size_t i = 0; i < g->n_w; i++)
        n += !g->w[i].fenced;
    return n;
}

kvr_rank_status_t *kvr_registry_rank_status(const kvr_registry_t *g, kvr_worker_t w)
{
    long i = kvr_registry_find(g, w.worker_id);
    if (i < 0)
        return NULL;
    const kvr_wentry_t *we = &g->w[i];
    if (w.dp_rank < we->spec.dp_start || w.dp_rank - we->spec.dp_start >= we->spec.dp_size)
        return NULL;
    return &we->rk[w.dp_rank - we->spec.dp_start].st;
}

kvr_stepclock_t *kvr_registry_clock(const kvr_registry_t *g, size_t k)
{
    const kvr_wentry_t *we = &g->w[g->rank_widx[k]];
    return &we->rk[g->cands[k].worker.dp_rank - we->spec.dp_start].clk;
}

/* ---------------------------------------------------------------------------------------- */
/* Invariants */

static bool worker_ok(const kvr_registry_t *g, size_t i, size_t *k)
{
    const kvr_wentry_t *we = &g->w[i];
    for (size_t t = 0; t < we->spec.n_taints; t++)
        if (we->taint_ptrs[t] != we->spec.taints[t])
            return false;
    for (uint32_t d = 0; d < we->spec.dp_size; d++, (*k)++) {
        kvr_worker_t w = {we->spec.worker_id, we->spec.dp_start + d};
        if (*k >= g->n_ranks || g->rank_widx[*k] != i ||
            g->cands[*k].worker.worker_id != w.worker_id ||
            g->cands[*k].worker.dp_rank != w.dp_rank || kvr_registry_rank(g, w) != (long)*k)
            return false;
    }
    return true;
}

bool kvr_registry_check(const kvr_registry_t *g)
{
    size_t k = 0, pooled_n = 0, prefill_n = 0;
    for (size_t i = 0; i < g->n_w; i++) {
        if (!worker_ok(g, i, &k))
            return false;
        pooled_n += pooled(&g->w[i]);
        prefill_n += g->w[i].spec.role == KVR_ROLE_PREFILL;
    }
    size_t used = 0;
    for (size_t s = 0; g->rmap != NULL && s <= g->rmap_mask; s++)
        used += g->rmap[s] != 0;
    return k == g->n_ranks && used == g->n_ranks && pooled_n == g->n_pooled &&
           prefill_n == g->n_prefill;
}
