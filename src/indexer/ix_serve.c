/*
 * ix_serve.c: a router's index behind the indexer API (partitions and threads in
 * ix_serve.h). The partition of a query is found by one pass over the router's workers (a
 * router has at most max_workers; the pass is a few hundred nanoseconds at 64).
 */
#include "indexer/ix_serve.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter/router.h"
#include "indexer/ix_api.h"
#include "base/log.h"
#include "nats/nats_link.h"
#include "wire/json_scan.h"
#include "wire/prom.h"

#define MAX_IDS 65536

struct kvr_ix_serve {
    kvr_http_host_t *host;
    kvr_router_t *r;
    kvr_index_t *ix;
    kvr_ingest_t *g;
    kvr_ix_api_t *ixa;
    uint64_t *ids;
    char model[KVR_MODEL_BYTES]; /* the partition of the query being answered */
    bool any_model;              /* no worker declares a model: every worker counts */
    /* the dump's current model filter */
    const char *dump_model; /* the model whose dump entry is being written */
    kvr_nats_t *nats;
    uint64_t nats_requests, nats_unanswerable; /* the latter: no reply subject */
    uint64_t nats_records, nats_records_refused;
    kvr_ratelimit_t rl;
};

static const char *model_of(const kvr_ix_serve_t *s, uint64_t id)
{
    const kvr_worker_spec_t *sp = kvr_router_worker(s->r, id);
    return sp != NULL ? sp->model : NULL;
}

static bool keep(void *arg, kvr_worker_t w)
{
    kvr_ix_serve_t *s = arg;
    if (s->any_model)
        return true;
    const char *m = model_of(s, w.worker_id);
    return m != NULL && (m[0] == '\0' || strcmp(m, s->model) == 0);
}

static int find(void *arg, const kvr_ix_query_t *q, kvr_ix_part_t *out)
{
    kvr_ix_serve_t *s = arg;
    if (strcmp(q->routing_group, "default") != 0 || q->model_name_len >= sizeof s->model)
        return KVR_ENOTFOUND;
    const kvr_router_config_t *c = kvr_router_config(s->r);
    size_t n = kvr_router_worker_ids(s->r, s->ids, MAX_IDS);
    bool named = false, match = false;
    const kvr_worker_spec_t *first = NULL;
    for (size_t i = 0; i < n; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, s->ids[i]);
        if (sp == NULL || sp->model[0] == '\0')
            continue;
        named = true;
        if (strcmp(sp->model, q->model_name) == 0) {
            match = true;
            first = first ? first : sp;
        }
    }
    if (named && !match)
        return KVR_ENOTFOUND;
    s->any_model = !named;
    memcpy(s->model, q->model_name, q->model_name_len + 1);
    *out = (kvr_ix_part_t){.ix = s->ix,
                           .block_size =
                               first && first->block_size ? first->block_size : c->block_size,
                           .eagle = first ? first->eagle : false,
                           .keep = keep,
                           .keep_arg = s};
    return KVR_OK;
}

/* The dump's filter: the workers of the model being written. */
static bool of_dump_model(void *arg, uint64_t worker_id)
{
    kvr_ix_serve_t *s = arg;
    const char *m = model_of(s, worker_id);
    return m != NULL && strcmp(m, s->dump_model) == 0; /* (a worker removed meanwhile: no) */
}

/* The distinct models of the workers, "" included, into models[0..n). */
static size_t distinct_models(kvr_ix_serve_t *s, const char **models, size_t cap)
{
    size_t n = kvr_router_worker_ids(s->r, s->ids, MAX_IDS), k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *m = model_of(s, s->ids[i]);
        bool seen = m == NULL;
        for (size_t j = 0; j < k && !seen; j++)
            seen = strcmp(models[j], m) == 0;
        if (!seen && k < cap)
            models[k++] = m;
    }
    return k;
}

static int dump(void *arg, kvr_json_writer_t *w)
{
    kvr_ix_serve_t *s = arg;
    const uint32_t bs = kvr_router_config(s->r)->block_size;
    const char *models[256];
    size_t n = distinct_models(s, models, 256);
    kvr_json_begin_object(w);
    for (size_t i = 0; i < n; i++) {
        uint32_t mbs = bs;
        for (size_t j = 0, m = kvr_router_worker_ids(s->r, s->ids, MAX_IDS); j < m; j++) {
            const kvr_worker_spec_t *sp = kvr_router_worker(s->r, s->ids[j]);
            if (sp && strcmp(sp->model, models[i]) == 0 && sp->block_size) {
                mbs = sp->block_size;
                break;
            }
        }
        s->dump_model = models[i];
        kvr_ix_dump_src_t src = {.g = s->g, .ix = s->ix, .keep = of_dump_model, .keep_arg = s};
        int rc = kvr_ix_api_dump_partition(w, models[i][0] ? models[i] : "default", "default", mbs,
                                           &src);
        if (rc != KVR_OK)
            return rc;
    }
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

/* Another router's decision (approximate mode), into this router's index as its own are. The
 * partition must be one a query would find (its model), and the pairs must be hashed with
 * the partition's block size: the decoder checked they chain, not which size made them. */
static int record(void *arg, const kvr_ix_record_t *rec, char *msg, size_t msg_len)
{
    kvr_ix_serve_t *s = arg;
    if (kvr_router_config(s->r)->router_mode != KVR_MODE_APPROX) {
        snprintf(msg, msg_len,
                 "this router's index is fed by KV events: routing decisions are "
                 "recorded only by a router in approximate mode");
        return KVR_EEXIST;
    }
    kvr_ix_query_t q = {.model_name = rec->model_name,
                        .model_name_len = rec->model_name_len,
                        .routing_group = rec->routing_group,
                        .routing_group_len = rec->routing_group_len};
    kvr_ix_part_t part;
    if (find(s, &q, &part) != KVR_OK) {
        snprintf(msg, msg_len, "no index for model_name '%.*s' and routing_group '%.*s'",
                 (int)(rec->model_name_len > 200 ? 200 : rec->model_name_len), rec->model_name,
                 (int)(rec->routing_group_len > 200 ? 200 : rec->routing_group_len),
                 rec->routing_group);
        return KVR_ENOTFOUND;
    }
    if (rec->block_size != 0 && rec->block_size != part.block_size) {
        snprintf(msg, msg_len, "block_size %u does not match the block size %u of model_name=%s",
                 rec->block_size, part.block_size, s->model);
        return KVR_EMISMATCH;
    }
    /* a registered worker's cache size, from its router, when this one does not know it */
    const kvr_worker_spec_t *ws = kvr_router_worker(s->r, rec->instance_id);
    if (rec->kv_capacity_blocks > 0 && ws != NULL && ws->total_kv_blocks == 0)
        (void)kvr_router_set_capacity(s->r, rec->instance_id, rec->kv_capacity_blocks);
    int rc = kvr_router_record(s->r, (kvr_worker_t){rec->instance_id, rec->dp_rank},
                               rec->local_hashes, rec->sequence_hashes, rec->n, kvr_now_ms());
    if (rc != KVR_OK)
        snprintf(msg, msg_len, "recording the decision failed: %s", kvr_strerror(rc));
    return rc;
}

static void reply(void *arg, struct evhttp_request *req, int code, const char *ctype,
                  const char *data, size_t len)
{
    kvr_ix_serve_t *s = arg;
    kvr_reply_body(kvr_http_host_reply(s->host), req, code, ctype, data, len);
}

static bool ext_handle(void *arg, struct evhttp_request *req, const char *path, bool get, bool post)
{
    kvr_ix_serve_t *s = arg;
    return kvr_ix_api_handle(s->ixa, req, path, get, post);
}

static void ext_metrics(void *arg, struct kvr_prom *p)
{
    kvr_ix_serve_t *s = arg;
    kvr_ix_api_metrics(s->ixa, p);
    if (s->nats == NULL)
        return;
    const struct {
        const char *name, *help;
        uint64_t v;
    } c[] = {
        {"kvr_indexer_nats_requests_total", "Indexer queries received on <ns>.indexer.query.",
         s->nats_requests},
        {"kvr_indexer_nats_unanswerable_total", "Of those, without a reply subject (dropped).",
         s->nats_unanswerable},
        {"kvr_indexer_nats_records_total", "Routing decisions received on <ns>.indexer.record.",
         s->nats_records},
        {"kvr_indexer_nats_records_refused_total",
         "Of those, refused (no answer goes back: the reason is logged).", s->nats_records_refused},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        kvr_prom_counter(p, c[i].name, c[i].help, (double)c[i].v);
}

/* Whether the JSON object body has a top-level block_hashes member (a /query_by_hash). */
static bool by_hash_body(const char *b, size_t len)
{
    size_t i = kvr_json_skip_ws(b, len, 0);
    if (i >= len || b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, b, len, i, KVR_JSON_LENIENT);
    while (kvr_json_object_next(&it, &m) > 0)
        if (kvr_json_key_is(b, &m, "block_hashes"))
            return true;
    return false;
}

static void on_nats_query(void *arg, const char *subject, const char *reply, const uint8_t *data,
                          size_t len)
{
    (void)subject;
    kvr_ix_serve_t *s = arg;
    s->nats_requests++;
    if (reply == NULL || reply[0] == '\0') {
        s->nats_unanswerable++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN,
                        "indexer query over NATS without a reply subject: "
                        "dropped");
        return;
    }
    int code;
    const char *out;
    size_t out_len;
    kvr_ix_api_answer(s->ixa, "application/json", (const char *)data, len,
                      by_hash_body((const char *)data, len), &code, &out, &out_len);
    (void)kvr_nats_publish(s->nats, reply, NULL, out, out_len);
}

/* A routing decision published by a router in approximate mode: no reply is expected (a
 * refusal is counted and logged here). */
static void on_nats_record(void *arg, const char *subject, const char *reply, const uint8_t *data,
                           size_t len)
{
    (void)subject;
    (void)reply;
    kvr_ix_serve_t *s = arg;
    s->nats_records++;
    int code;
    const char *out;
    size_t out_len;
    kvr_ix_api_record(s->ixa, (const char *)data, len, &code, &out, &out_len);
    if (code != 200) {
        s->nats_records_refused++;
        kvr_log_limited(&s->rl, KVR_LOG_WARN, "routing decision over NATS refused (%d): %.*s", code,
                        (int)(out_len > 300 ? 300 : out_len), out);
    }
}

int kvr_ix_serve_attach_nats(kvr_ix_serve_t *s, kvr_nats_t *nats, const char *ns)
{
    char subj[160];
    snprintf(subj, sizeof subj, "%s.indexer.query", ns);
    s->nats = nats;
    int rc = kvr_nats_subscribe(nats, subj, on_nats_query, s);
    if (rc != KVR_OK || kvr_router_config(s->r)->router_mode != KVR_MODE_APPROX)
        return rc;
    snprintf(subj, sizeof subj, "%s.indexer.record", ns);
    return kvr_nats_subscribe(nats, subj, on_nats_record, s);
}

kvr_ix_serve_t *kvr_ix_serve_new(kvr_http_host_t *host, kvr_fleet_t *fleet, kvr_index_t *ix, kvr_ingest_t *g,
                                 int *status)
{
    kvr_ix_serve_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return *status = KVR_ENOMEM, NULL;
    s->host = host;
    s->r = kvr_fleet_router(fleet);
    s->ix = ix;
    s->g = g;
    s->ids = calloc(MAX_IDS, sizeof *s->ids);
    s->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 5);
    kvr_ix_api_ops_t ops = {.find = find, .dump = dump, .record = record, .reply = reply, .arg = s};
    s->ixa = kvr_ix_api_new(&ops);
    kvr_http_service_t ext = {.handle = ext_handle, .metrics = ext_metrics, .arg = s};
    if (s->ids == NULL || s->ixa == NULL ||
        (*status = kvr_http_host_add_service(host, &ext)) != KVR_OK) {
        *status = *status != KVR_OK ? *status : KVR_ENOMEM;
        kvr_ix_api_free(s->ixa);
        free(s->ids);
        free(s);
        return NULL;
    }
    return s;
}

void kvr_ix_serve_free(kvr_ix_serve_t *s)
{
    if (s == NULL)
        return;
    kvr_http_host_remove_service(s->host, s);
    kvr_ix_api_free(s->ixa);
    free(s->ids);
    free(s);
}
