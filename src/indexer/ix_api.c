/*
 * ix_api.c: the indexer API's queries and dump (shapes, threads and cost in ix_api.h).
 */
#include "indexer/ix_api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "base/grow.h"
#include "events/ingest.h"
#include "http/http.h"
#include "wire/ix_query_mp.h"
#include "wire/router_event_json.h"
#include "wire/prom.h"

struct kvr_ix_api {
    kvr_ix_api_ops_t ops;
    kvr_api_decoder_t *dec;
    kvr_ix_mp_t mp;
    kvr_json_writer_t w;
    kvr_lookup_t lk;
    uint64_t *lbh, *seq;
    size_t lbh_cap, seq_cap;
    uint32_t *freq;
    size_t freq_cap;
    char *body;
    size_t body_cap;
    kvr_ix_api_stats_t st;
};

kvr_ix_api_t *kvr_ix_api_new(const kvr_ix_api_ops_t *ops)
{
    kvr_ix_api_t *a = calloc(1, sizeof *a);
    if (a == NULL)
        return NULL;
    a->ops = *ops;
    a->dec = kvr_api_decoder_new(NULL);
    if (a->dec == NULL) {
        free(a);
        return NULL;
    }
    kvr_ix_mp_init(&a->mp);
    kvr_json_writer_init(&a->w);
    kvr_lookup_init(&a->lk);
    return a;
}

void kvr_ix_api_free(kvr_ix_api_t *a)
{
    if (a == NULL)
        return;
    kvr_api_decoder_free(a->dec);
    kvr_ix_mp_deinit(&a->mp);
    kvr_json_writer_deinit(&a->w);
    kvr_lookup_deinit(&a->lk);
    free(a->lbh);
    free(a->seq);
    free(a->freq);
    free(a->body);
    free(a);
}

typedef struct dump_ctx {
    kvr_json_writer_t *w;
    bool (*keep)(void *arg, uint64_t worker_id);
    void *keep_arg;
} dump_ctx_t;

static int dump_event(void *ud, const kvr_event_t *ev)
{
    dump_ctx_t *d = ud;
    if (d->keep != NULL && !d->keep(d->keep_arg, ev->worker.worker_id))
        return 0;
    return kvr_rev_encode(d->w, ev) == KVR_OK ? 0 : 1;
}

int kvr_ix_api_dump_partition(kvr_json_writer_t *w, const char *model, const char *group,
                              uint32_t block_size, const kvr_ix_dump_src_t *src)
{
    char key[600];
    snprintf(key, sizeof key, "%s:%s", model, group);
    kvr_json_key(w, key);
    kvr_json_begin_object(w);
    kvr_json_key(w, "block_size");
    kvr_json_u64(w, block_size);
    kvr_json_key(w, "events");
    kvr_json_begin_array(w);
    dump_ctx_t d = {w, src->keep, src->keep_arg};
    int rc = src->g != NULL ? kvr_ingest_dump(src->g, dump_event, &d)
                            : kvr_index_dump(src->ix, dump_event, &d);
    if (rc != KVR_OK)
        return rc;
    kvr_json_end_array(w);
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

void kvr_ix_api_error_body(kvr_json_writer_t *w, const char *msg)
{
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "error");
    kvr_json_string(w, msg);
    kvr_json_end_object(w);
}

static int fail(kvr_ix_api_t *a, int code, const char *msg)
{
    kvr_ix_api_error_body(&a->w, msg);
    if (code == 404)
        a->st.not_found++;
    else if (code == 400 || code == 415)
        a->st.bad_requests++;
    return code;
}

/* 1: JSON, 2: MessagePack, 0: neither. */
static int body_format(const char *ctype)
{
    if (ctype == NULL || ctype[0] == '\0')
        return 1;
    size_t n = strcspn(ctype, ";");
    while (n > 0 && (ctype[n - 1] == ' ' || ctype[n - 1] == '\t'))
        n--;
    static const char *const mp[] = {"application/msgpack", "application/x-msgpack",
                                     "application/vnd.msgpack"};
    for (size_t i = 0; i < sizeof mp / sizeof *mp; i++)
        if (strlen(mp[i]) == n && strncasecmp(ctype, mp[i], n) == 0)
            return 2;
    if (n == 16 && strncasecmp(ctype, "application/json", n) == 0)
        return 1;
    return 0;
}

/* The query's sequence hashes into a->seq; the count, or a negative status. */
static long query_hashes(kvr_ix_api_t *a, const kvr_ix_query_t *q, const kvr_ix_part_t *p)
{
    size_t n = q->by_hash ? q->n_hashes : kvr_hash_n_blocks(q->n_tokens, p->block_size, p->eagle);
    if (n == 0)
        return 0;
    if (kvr_grow((void **)&a->lbh, &a->lbh_cap, n, SIZE_MAX, sizeof *a->lbh) != KVR_OK ||
        kvr_grow((void **)&a->seq, &a->seq_cap, n, SIZE_MAX, sizeof *a->seq) != KVR_OK)
        return KVR_ENOMEM;
    if (q->by_hash) {
        kvr_hash_chain(q->hashes, n, a->seq);
        return (long)n;
    }
    kvr_hash_opts_t o = {.lora_name = q->lora_name,
                         .lora_name_len = q->lora_name_len,
                         .cache_namespace = q->cache_salt,
                         .cache_namespace_len = q->cache_salt_len,
                         .is_eagle = p->eagle};
    return kvr_hash_prompt(q->tokens, q->n_tokens, p->block_size, &o, a->lbh, a->seq, n);
}

static int match_cmp(const void *x, const void *y)
{
    const kvr_match_t *a = x, *b = y;
    if (a->worker.worker_id != b->worker.worker_id)
        return a->worker.worker_id < b->worker.worker_id ? -1 : 1;
    return a->worker.dp_rank < b->worker.dp_rank ? -1 : a->worker.dp_rank > b->worker.dp_rank;
}

static void key_u64(kvr_json_writer_t *w, uint64_t k)
{
    char buf[24];
    int n = snprintf(buf, sizeof buf, "%llu", (unsigned long long)k);
    kvr_json_key_n(w, buf, (size_t)n);
}

/* One instance's matches m[0..n) (its ranks) in the instances map. */
static void write_instance(kvr_json_writer_t *w, const kvr_match_t *m, size_t n, uint64_t bs)
{
    uint64_t gpu = 0, cpu = 0, disk = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = m[i].device_blocks, h = d + m[i].host_blocks, k = h + m[i].disk_blocks;
        gpu = d > gpu ? d : gpu;
        cpu = h > cpu ? h : cpu;
        disk = k > disk ? k : disk;
    }
    uint64_t longest = gpu > cpu ? gpu : cpu;
    longest = disk > longest ? disk : longest;
    key_u64(w, m[0].worker.worker_id);
    kvr_json_begin_object(w);
    kvr_json_key(w, "longest_matched");
    kvr_json_u64(w, longest * bs);
    kvr_json_key(w, "gpu");
    kvr_json_u64(w, gpu * bs);
    kvr_json_key(w, "dp");
    kvr_json_begin_object(w);
    for (size_t i = 0; i < n; i++) {
        key_u64(w, m[i].worker.dp_rank);
        kvr_json_u64(w, (uint64_t)m[i].device_blocks * bs);
    }
    kvr_json_end_object(w);
    kvr_json_key(w, "cpu");
    kvr_json_u64(w, cpu * bs);
    kvr_json_key(w, "disk");
    kvr_json_u64(w, disk * bs);
    kvr_json_end_object(w);
}

static void write_scores(kvr_json_writer_t *w, const kvr_match_t *m, size_t n, uint64_t bs)
{
    kvr_json_key(w, "scores");
    kvr_json_begin_object(w);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && m[j].worker.worker_id == m[i].worker.worker_id)
            j++;
        bool any = false;
        for (size_t k = i; k < j; k++) {
            if (m[k].device_blocks == 0)
                continue;
            if (!any)
                key_u64(w, m[i].worker.worker_id), kvr_json_begin_object(w);
            any = true;
            key_u64(w, m[k].worker.dp_rank);
            kvr_json_u64(w, (uint64_t)m[k].device_blocks * bs);
        }
        if (any)
            kvr_json_end_object(w);
        i = j;
    }
    kvr_json_end_object(w);
}

/* frequencies[i]: the workers (ranks) holding device block i of the prompt's prefix. */
static int write_frequencies(kvr_ix_api_t *a, const kvr_match_t *m, size_t n, uint32_t depth)
{
    if (depth > 0 &&
        kvr_grow((void **)&a->freq, &a->freq_cap, depth, SIZE_MAX, sizeof *a->freq) != KVR_OK)
        return KVR_ENOMEM;
    if (depth > 0)
        memset(a->freq, 0, depth * sizeof *a->freq);
    for (size_t i = 0; i < n; i++)
        if (m[i].device_blocks > 0)
            a->freq[m[i].device_blocks - 1]++;
    /* counts of workers ending at each depth -> workers reaching each depth */
    for (uint32_t d = depth; d-- > 1;)
        a->freq[d - 1] += a->freq[d];
    kvr_json_key(&a->w, "frequencies");
    kvr_json_begin_array(&a->w);
    for (uint32_t d = 0; d < depth; d++)
        kvr_json_u64(&a->w, a->freq[d]);
    kvr_json_end_array(&a->w);
    return KVR_OK;
}

static int answer(kvr_ix_api_t *a, const kvr_ix_query_t *q)
{
    kvr_ix_part_t p = {0};
    if (a->ops.find(a->ops.arg, q, &p) != KVR_OK) {
        char msg[700];
        snprintf(msg, sizeof msg, "no indexer for model=%s routing_group=%s", q->model_name,
                 q->routing_group);
        return fail(a, 404, msg);
    }
    long n = query_hashes(a, q, &p);
    if (n < 0)
        return fail(a, 500, kvr_strerror((int)n));
    a->lk.n_matches = 0;
    a->lk.max_depth = 0;
    if (n > 0 && kvr_index_lookup(p.ix, a->seq, (size_t)n, &a->lk) != KVR_OK)
        return fail(a, 500, "index lookup: out of memory");
    size_t m = 0;
    for (size_t i = 0; i < a->lk.n_matches; i++)
        if (p.keep == NULL || p.keep(p.keep_arg, a->lk.matches[i].worker))
            a->lk.matches[m++] = a->lk.matches[i];
    if (m > 1) /* (matches is NULL until a lookup has found something) */
        qsort(a->lk.matches, m, sizeof *a->lk.matches, match_cmp);
    uint32_t depth = 0;
    for (size_t i = 0; i < m; i++)
        depth = a->lk.matches[i].device_blocks > depth ? a->lk.matches[i].device_blocks : depth;
    kvr_json_writer_t *w = &a->w;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    write_scores(w, a->lk.matches, m, p.block_size);
    if (write_frequencies(a, a->lk.matches, m, depth) != KVR_OK)
        return fail(a, 500, "out of memory");
    kvr_json_key(w, "instances");
    kvr_json_begin_object(w);
    for (size_t i = 0; i < m;) {
        size_t j = i;
        while (j < m && a->lk.matches[j].worker.worker_id == a->lk.matches[i].worker.worker_id)
            j++;
        write_instance(w, a->lk.matches + i, j - i, p.block_size);
        i = j;
    }
    kvr_json_end_object(w);
    kvr_json_end_object(w);
    return kvr_json_writer_status(w) == KVR_OK ? 200 : fail(a, 500, "out of memory");
}

/* The writer's text into *out (or an out-of-memory answer). */
static void finish(kvr_ix_api_t *a, int *code, const char **out, size_t *out_len)
{
    if (kvr_json_writer_finish(&a->w, out, out_len) != KVR_OK) {
        *out = "{\"error\":\"out of memory\"}";
        *out_len = strlen(*out);
        *code = 500;
    }
}

void kvr_ix_api_answer(kvr_ix_api_t *a, const char *ctype, const char *body, size_t len,
                       bool by_hash, int *code, const char **out, size_t *out_len)
{
    by_hash ? a->st.queries_by_hash++ : a->st.queries++;
    int fmt = body_format(ctype);
    kvr_ix_query_t q;
    if (fmt == 0) {
        *code = fail(a, 415, "Content-Type: expected application/json or application/msgpack");
    } else if (fmt == 2) {
        a->st.msgpack_bodies++;
        *code = kvr_ix_mp_decode_query(&a->mp, (const uint8_t *)body, len, by_hash, &q) == KVR_OK
                    ? answer(a, &q)
                    : fail(a, 400, a->mp.err);
    } else {
        *code = kvr_api_decode_ix_query(a->dec, body, len, by_hash, &q) == KVR_OK
                    ? answer(a, &q)
                    : fail(a, 400, kvr_api_decoder_error(a->dec));
    }
    finish(a, code, out, out_len);
}

static int record(kvr_ix_api_t *a, const char *body, size_t len)
{
    a->st.records++;
    kvr_ix_record_t rec;
    if (kvr_api_decode_ix_record(a->dec, body, len, &rec) != KVR_OK)
        return fail(a, 400, kvr_api_decoder_error(a->dec));
    if (a->ops.record == NULL)
        return fail(a, 501, "this indexer does not record routing decisions");
    char msg[200] = "";
    int rc = a->ops.record(a->ops.arg, &rec, msg, sizeof msg);
    if (rc != KVR_OK)
        return fail(a,
                    rc == KVR_ENOTFOUND                       ? 404
                    : rc == KVR_EEXIST                        ? 409
                    : rc == KVR_EMISMATCH || rc == KVR_EINVAL ? 400
                                                              : 500,
                    msg[0] ? msg : kvr_strerror(rc));
    kvr_json_writer_reset(&a->w);
    kvr_json_begin_object(&a->w);
    kvr_json_key(&a->w, "status");
    kvr_json_string(&a->w, "ok");
    kvr_json_end_object(&a->w);
    return 200;
}

void kvr_ix_api_record(kvr_ix_api_t *a, const char *body, size_t len, int *code, const char **out,
                       size_t *out_len)
{
    *code = record(a, body, len);
    if (*code != 200)
        a->st.records_refused++;
    finish(a, code, out, out_len);
}

/* The request body, contiguous (a pullup of evhttp's buffer). */
bool kvr_ix_api_handle(kvr_ix_api_t *a, struct evhttp_request *req, const char *path, bool get,
                       bool post)
{
    const char *out;
    size_t out_len;
    int code;
    bool by_hash = strcmp(path, "/query_by_hash") == 0;
    if (post && (by_hash || strcmp(path, "/query") == 0)) {
        size_t len;
        const char *body = kvr_http_body(req, &len);
        const char *ct = evhttp_find_header(evhttp_request_get_input_headers(req), "Content-Type");
        kvr_ix_api_answer(a, ct, body, len, by_hash, &code, &out, &out_len);
    } else if (post && strcmp(path, "/record_routing_decision") == 0) {
        size_t len;
        const char *body = kvr_http_body(req, &len);
        kvr_ix_api_record(a, body, len, &code, &out, &out_len);
    } else if (get && strcmp(path, "/dump") == 0) {
        a->st.dumps++;
        kvr_json_writer_reset(&a->w);
        int rc = a->ops.dump(a->ops.arg, &a->w);
        code = 200;
        if (rc != KVR_OK) {
            char msg[120];
            snprintf(msg, sizeof msg, "dump failed: %s", kvr_strerror(rc));
            code = fail(a, 500, msg);
        }
        finish(a, &code, &out, &out_len);
    } else {
        return false;
    }
    a->ops.reply(a->ops.arg, req, code, "application/json", out, out_len);
    return true;
}

void kvr_ix_api_stats(const kvr_ix_api_t *a, kvr_ix_api_stats_t *out) { *out = a->st; }

void kvr_ix_api_metrics(const kvr_ix_api_t *a, struct kvr_prom *p)
{
    kvr_prom_counter(p, "kvr_indexer_queries_total", "POST /query calls.", (double)a->st.queries);
    kvr_prom_counter(p, "kvr_indexer_queries_by_hash_total", "POST /query_by_hash calls.",
                     (double)a->st.queries_by_hash);
    kvr_prom_counter(p, "kvr_indexer_msgpack_bodies_total", "Query bodies sent as MessagePack.",
                     (double)a->st.msgpack_bodies);
    kvr_prom_counter(p, "kvr_indexer_bad_requests_total",
                     "Queries refused as malformed (400) or of an unknown Content-Type (415).",
                     (double)a->st.bad_requests);
    kvr_prom_counter(p, "kvr_indexer_unknown_partition_total",
                     "Queries naming a model_name / routing_group with no index (404).",
                     (double)a->st.not_found);
    kvr_prom_counter(p, "kvr_indexer_dumps_total", "GET /dump calls.", (double)a->st.dumps);
    kvr_prom_counter(p, "kvr_indexer_routing_decisions_total",
                     "POST /record_routing_decision calls (and NATS records).",
                     (double)a->st.records);
    kvr_prom_counter(p, "kvr_indexer_routing_decisions_refused_total",
                     "Of those, refused (malformed, mismatched pair, unknown partition, a "
                     "partition fed by KV events).",
                     (double)a->st.records_refused);
}
