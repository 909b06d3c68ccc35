/*
 * fe_models.c: GET /v1/models of the front end (fe_models.h): every worker's list, asked
 * at most every FE_MODELS_TTL_MS, merged, with concurrent callers answered by one round.
 * Invariants: a pool has at most one models call in flight (m_in_flight); models_pending
 * counts the calls of the round; waiters are answered once, when it ends. Ownership: a pool
 * owns its model list. Threads: the HTTP thread. Cost: one call per worker a round.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>
#include <event2/http.h>
#include <yajl/yajl_tree.h>

#include "base/namelist.h"
#include "kvrouter/router.h"
#include "fleet/fleet.h"
#include "frontend/fe_models.h"
#include "http/http.h"

/* ---------------------------------------------------------------------------------------- */
/* GET /v1/models */

/* Adds id (its first len bytes, copied into names) unless listed. */
static void add_named(kvr_oai_model_t *ms, size_t *n, char *names, size_t *used, const char *id,
                      size_t len)
{
    for (size_t j = 0; j < *n; j++)
        if (strlen(ms[j].id) == len && memcmp(ms[j].id, id, len) == 0)
            return;
    char *c = names + *used;
    memcpy(c, id, len);
    c[len] = '\0';
    *used += len + 1;
    ms[(*n)++] = (kvr_oai_model_t){c, 0, "kvrouter", 0, NULL};
}

/* The models and adapters workers were registered with (model=, loras=) that their own
 * /v1/models did not list (a worker without a url, or one not asked yet). */
static void add_registered(kvr_frontend_t *fe, kvr_oai_model_t *ms, size_t *n, char *names)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t nw = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS), used = 0;
    for (size_t i = 0; i < nw && i < FE_MAX_WORKERS; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp == NULL)
            continue;
        if (sp->model[0] != '\0')
            add_named(ms, n, names, &used, sp->model, strlen(sp->model));
        const char *cur = sp->loras, *l;
        size_t len;
        while (kvr_namelist_next(&cur, &l, &len))
            add_named(ms, n, names, &used, l, len);
    }
}

void fe_models_answer(kvr_frontend_t *fe, struct evhttp_request *req)
{
    size_t cap = 0, n = 0, bytes = 0;
    for (size_t i = 0; i < fe->n_pools; i++)
        cap += fe->pools[i]->dead ? 0 : fe->pools[i]->n_models;
    uint64_t ids[FE_MAX_WORKERS];
    size_t nw = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    for (size_t i = 0; i < nw && i < FE_MAX_WORKERS; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp == NULL)
            continue;
        cap += 1 + (sp->loras[0] != '\0'); /* names: at most one per ';' plus one */
        for (const char *l = sp->loras; *l; l++)
            cap += *l == ';';
        bytes += strlen(sp->model) + strlen(sp->loras) + 2;
    }
    kvr_oai_model_t *ms = calloc(cap + 1, sizeof *ms);
    char *names = malloc(bytes + 1);
    if (ms == NULL || names == NULL) {
        free(ms);
        free(names);
        kvr_reply_error(&fe->rep, req, 500, NULL, "out of memory");
        return;
    }
    for (size_t i = 0; i < fe->n_pools; i++) {
        const upool_t *u = fe->pools[i];
        if (u->dead || kvr_router_worker(fe->r, u->worker_id) == NULL)
            continue;
        for (size_t k = 0; k < u->n_models; k++) {
            const pmodel_t *pm = &u->models[k];
            bool dup = false;
            for (size_t j = 0; j < n && !dup; j++)
                dup = strcmp(ms[j].id, pm->id) == 0;
            if (!dup)
                ms[n++] = (kvr_oai_model_t){pm->id, pm->created, pm->owned_by, pm->max_model_len,
                                            pm->parent};
        }
    }
    add_registered(fe, ms, &n, names);
    kvr_json_writer_reset(&fe->w);
    kvr_oai_encode_models(&fe->w, ms, n);
    free(ms);
    free(names);
    kvr_reply_writer(&fe->rep, req, 200);
}

static void models_round_done(kvr_frontend_t *fe)
{
    fe->models_valid = true;
    fe->models_at_ms = kvr_now_ms();
    for (size_t i = 0; i < fe->n_waiters; i++)
        fe_models_answer(fe, fe->waiters[i]);
    fe->n_waiters = 0;
}

static char *dup_str(const char *s) { return s ? strdup(s) : NULL; }

/* Replaces u's model list from a /v1/models answer; false if it does not parse. */
static bool parse_models(upool_t *u, const char *b, size_t len)
{
    if (len == 0 || len > FE_MODELS_MAX_BYTES)
        return false;
    char *text = malloc(len + 1);
    if (text == NULL)
        return false;
    memcpy(text, b, len);
    text[len] = '\0';
    yajl_val root = yajl_tree_parse(text, NULL, 0);
    free(text);
    static const char *data_path[] = {"data", NULL};
    yajl_val data = root ? yajl_tree_get(root, data_path, yajl_t_array) : NULL;
    if (data == NULL) {
        yajl_tree_free(root);
        return false;
    }
    size_t n = YAJL_GET_ARRAY(data)->len;
    if (n > FE_MAX_MODELS)
        n = FE_MAX_MODELS;
    pmodel_t *ms = calloc(n + 1, sizeof *ms);
    size_t k = 0;
    static const char *id_p[] = {"id", NULL}, *own_p[] = {"owned_by", NULL};
    static const char *cr_p[] = {"created", NULL}, *mml_p[] = {"max_model_len", NULL};
    static const char *par_p[] = {"parent", NULL};
    char learned[KVR_LORAS_BYTES] = ""; /* its adapters: entries with a parent (vLLM) */
    size_t n_learned = 0;
    for (size_t i = 0; ms != NULL && i < n; i++) {
        yajl_val m = YAJL_GET_ARRAY(data)->values[i];
        yajl_val id = yajl_tree_get(m, id_p, yajl_t_string);
        const char *ids = id != NULL ? YAJL_GET_STRING(id) : NULL;
        if (ids == NULL || !kvr_json_utf8_valid(ids, strlen(ids)))
            continue;
        yajl_val par = yajl_tree_get(m, par_p, yajl_t_string);
        const char *pars = par != NULL ? YAJL_GET_STRING(par) : NULL;
        size_t idl = strlen(ids);
        if (pars != NULL && pars[0] != '\0' && strcmp(pars, ids) != 0 && idl > 0 &&
            strchr(ids, ';') == NULL && n_learned + idl + 2 < sizeof learned) {
            if (n_learned > 0)
                learned[n_learned++] = ';';
            memcpy(learned + n_learned, ids, idl + 1);
            n_learned += idl;
        }
        yajl_val own = yajl_tree_get(m, own_p, yajl_t_string);
        yajl_val cr = yajl_tree_get(m, cr_p, yajl_t_number);
        yajl_val mml = yajl_tree_get(m, mml_p, yajl_t_number);
        ms[k].id = dup_str(ids);
        ms[k].owned_by = dup_str(own ? YAJL_GET_STRING(own) : "kvrouter");
        ms[k].parent = pars != NULL && pars[0] != '\0' && kvr_json_utf8_valid(pars, strlen(pars))
                           ? dup_str(pars)
                           : NULL;
        ms[k].created = cr && YAJL_IS_INTEGER(cr) && YAJL_GET_INTEGER(cr) > 0
                            ? (uint64_t)YAJL_GET_INTEGER(cr) : (uint64_t)time(NULL);
        ms[k].max_model_len = mml && YAJL_IS_INTEGER(mml) && YAJL_GET_INTEGER(mml) > 0
                                  ? (uint64_t)YAJL_GET_INTEGER(mml) : 0;
        if (ms[k].id == NULL || ms[k].owned_by == NULL) {
            free(ms[k].id);
            free(ms[k].owned_by);
            free(ms[k].parent);
            continue;
        }
        k++;
    }
    yajl_tree_free(root);
    if (ms == NULL)
        return false;
    for (size_t i = 0; i < u->n_models; i++) {
        free(u->models[i].id);
        free(u->models[i].owned_by);
        free(u->models[i].parent);
    }
    free(u->models);
    u->models = ms;
    u->n_models = k;
    (void)kvr_router_set_learned_loras(u->fe->r, u->worker_id, learned);
    return true;
}

static void on_models_done(struct evhttp_request *up, void *arg)
{
    upool_t *u = arg;
    kvr_frontend_t *fe = u->fe;
    u->m_in_flight = false;
    if (up != NULL && evhttp_request_get_response_code(up) == 200) {
        struct evbuffer *in = evhttp_request_get_input_buffer(up);
        size_t len = evbuffer_get_length(in);
        if (!parse_models(u, len ? (const char *)evbuffer_pullup(in, -1) : "", len)) {
            fe->st.upstream_errors[UPK_PROTOCOL]++;
            kvr_log_limited(&fe->rl_proto, KVR_LOG_WARN, "worker %llu: /v1/models answer "
                            "without a data array", (unsigned long long)u->worker_id);
        }
    }
    if (fe->models_pending > 0 && --fe->models_pending == 0)
        models_round_done(fe);
}

/* Asks every registered worker with a url for its models; the round ends when all answered. */
static void models_refresh(kvr_frontend_t *fe)
{
    fe->st.models_refreshes++;
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    if (n > FE_MAX_WORKERS)
        n = FE_MAX_WORKERS;
    fe->models_pending = 1; /* held until every probe is out */
    for (size_t i = 0; i < n; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp == NULL || sp->url[0] == '\0' || kvr_router_fenced(fe->r, ids[i]))
            continue;
        upool_t *u = fe_pool_for(fe, sp);
        if (u == NULL || u->bad_url || u->m_in_flight)
            continue;
        if (u->mconn == NULL) {
            struct timeval tv = {FE_MODELS_TIMEOUT_S, 0};
            if ((u->mconn = fe_new_conn(fe, u, &tv)) == NULL)
                continue;
        }
        struct evhttp_request *up = evhttp_request_new(on_models_done, u);
        if (up == NULL)
            continue;
        evhttp_add_header(evhttp_request_get_output_headers(up), "Host", u->loc.host_hdr);
        char path[KVR_ADDR_BYTES + 16];
        snprintf(path, sizeof path, "%s/v1/models", u->loc.base_path);
        u->m_in_flight = true;
        fe->models_pending++;
        if (evhttp_make_request(u->mconn, up, EVHTTP_REQ_GET, path) != 0 && u->m_in_flight) {
            u->m_in_flight = false;
            fe->models_pending--;
        }
    }
    if (--fe->models_pending == 0)
        models_round_done(fe);
}

void fe_models_tick(kvr_frontend_t *fe)
{
    if (fe->models_pending == 0 && kvr_now_ms() - fe->models_at_ms >= FE_ADAPTERS_REFRESH_MS)
        models_refresh(fe); /* the adapters each engine serves, for routing */
}

void fe_h_models(kvr_frontend_t *fe, struct evhttp_request *req)
{
    fe->st.requests[2]++;
    bool fresh = fe->models_valid && kvr_now_ms() - fe->models_at_ms < FE_MODELS_TTL_MS;
    if (fresh || (fe->n_waiters == FE_MAX_MODEL_WAITERS && fe->models_pending > 0)) {
        fe_models_answer(fe, req);
        return;
    }
    if (fe->waiters == NULL &&
        (fe->waiters = calloc(FE_MAX_MODEL_WAITERS, sizeof *fe->waiters)) == NULL) {
        kvr_reply_error(&fe->rep, req, 500, NULL, "out of memory");
        return;
    }
    fe->waiters[fe->n_waiters++] = req;
    if (fe->models_pending == 0)
        models_refresh(fe);
}

/* ---------------------------------------------------------------------------------------- */
/* Why no worker */

void fe_models_names(kvr_frontend_t *fe, char *buf, size_t len)
{
    uint64_t ids[FE_MAX_WORKERS];
    const char *seen[64];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS), used = 0, n_seen = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS && n_seen < 64; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp == NULL || sp->model[0] == '\0')
            continue;
        bool dup = false;
        for (size_t j = 0; j < n_seen && !dup; j++)
            dup = strcmp(seen[j], sp->model) == 0;
        if (dup || used + strlen(sp->model) + 3 >= len)
            continue;
        seen[n_seen++] = sp->model;
        used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "", sp->model);
    }
}

bool fe_models_serves(kvr_frontend_t *fe, const kvr_worker_spec_t *sp, const char *model)
{
    if (model == NULL || sp->model[0] == '\0' || strcmp(sp->model, model) == 0)
        return true;
    size_t ml = strlen(model);
    const char *learned = kvr_router_learned_loras(fe->r, sp->worker_id);
    return kvr_namelist_has(sp->loras, model, ml) ||
           (learned != NULL && kvr_namelist_has(learned, model, ml));
}

bool fe_models_served(kvr_frontend_t *fe, const char *model)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp != NULL && sp->url[0] != '\0' && fe_models_serves(fe, sp, model))
            return true;
    }
    return false;
}

void fe_models_why_none(kvr_frontend_t *fe, const char *model, char *buf, size_t len)
{
    uint64_t ids[FE_MAX_WORKERS];
    size_t n = kvr_router_worker_ids(fe->r, ids, FE_MAX_WORKERS);
    size_t with_url = 0, of_model = 0, fenced = 0;
    for (size_t i = 0; i < n && i < FE_MAX_WORKERS; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(fe->r, ids[i]);
        if (sp == NULL || sp->url[0] == '\0')
            continue;
        with_url++;
        if (!fe_models_serves(fe, sp, model))
            continue;
        of_model++;
        fenced += kvr_router_fenced(fe->r, ids[i]);
    }
    if (n == 0) {
        snprintf(buf, len, "no worker is registered (--worker, POST /v1/workers or discovery)");
    } else if (with_url == 0) {
        snprintf(buf, len, "none of the %zu registered workers has a url to send requests to", n);
    } else if (of_model == 0) {
        char names[512];
        fe_models_names(fe, names, sizeof names);
        snprintf(buf, len, "no worker serves model `%s` (the workers serve: %s)", model, names);
    } else if (fenced == of_model) {
        snprintf(buf, len, "all %zu workers that could serve it are fenced after failing in a "
                 "row (each returns once its /health answers)", of_model);
    } else {
        snprintf(buf, len, "%zu of %zu workers that could serve it are fenced", fenced, of_model);
    }
}
