/*
 * fuzz_api_json.c: libFuzzer target for the JSON API body decoders (wire/api_json.c) and the
 * JSON writer (wire/json_writer.c), the trust boundary of `kvrouter serve`'s HTTP API.
 *
 * Input: the first byte picks the body kind (value % 6: route, output_block, query, loads,
 * workers, router); the rest is the body. Seeds in fuzz/corpus/api_json start with '0'..'5'.
 *
 * Invariants checked: the fast-path decoder and a yajl-only decoder agree on the status, the
 * message and the decoded struct (compared through the canonical encoding); a failure leaves
 * a one-line message fit for a JSON string and a zeroed struct; a success satisfies every
 * documented bound (counts, lengths, ranges, sorted ids, clean strings) and round-trips
 * through the encoder. The response (the OpenAI error body, or a route answer) is written with
 * the writer and must finish; the raw input written as a JSON string must come out as valid
 * UTF-8.
 * Memory: decoders and writers reused across inputs (as the server does), small token limits
 * so each input is cheap. Threads: libFuzzer's one.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/select.h"
#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"

#define FUZZ_MAX_TOKENS 4096
#define FUZZ_MAX_IDS 256

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { K_ROUTE, K_OB, K_QUERY, K_LOADS, K_WORKER, K_ROUTER, K_N };

typedef union any {
    kvr_api_route_t route;
    kvr_api_output_block_t ob;
    kvr_api_query_t query;
    kvr_api_worker_t worker;
    kvr_api_router_t router;
} any_t;

static void check(int cond)
{
    if (!cond)
        abort();
}

static int decode(kvr_api_decoder_t *d, int kind, const char *b, size_t n, any_t *o)
{
    switch (kind) {
    case K_ROUTE:
        return kvr_api_decode_route(d, b, n, &o->route);
    case K_OB:
        return kvr_api_decode_output_block(d, b, n, &o->ob);
    case K_QUERY:
        return kvr_api_decode_query(d, b, n, &o->query);
    case K_LOADS:
        return kvr_api_decode_loads(d, b, n, &o->query);
    case K_WORKER:
        return kvr_api_decode_worker(d, b, n, &o->worker);
    default:
        return kvr_api_decode_router(d, b, n, &o->router);
    }
}

/* The canonical encoding into w; returns the text (valid until w is next used). */
static const char *canon(kvr_json_writer_t *w, int kind, const any_t *o, size_t *len)
{
    kvr_json_writer_reset(w);
    switch (kind) {
    case K_ROUTE:
        kvr_api_encode_route(w, &o->route);
        break;
    case K_OB:
        kvr_api_encode_output_block(w, &o->ob);
        break;
    case K_QUERY:
    case K_LOADS:
        kvr_api_encode_query(w, &o->query);
        break;
    case K_WORKER:
        kvr_api_encode_worker(w, &o->worker);
        break;
    default:
        kvr_api_encode_router(w, &o->router);
        break;
    }
    const char *text;
    check(kvr_json_writer_finish(w, &text, len) == KVR_OK);
    return text;
}

static size_t out_size(int kind)
{
    static const size_t sizes[K_N] = {
        sizeof(kvr_api_route_t), sizeof(kvr_api_output_block_t), sizeof(kvr_api_query_t),
        sizeof(kvr_api_query_t), sizeof(kvr_api_worker_t), sizeof(kvr_api_router_t),
    };
    return sizes[kind];
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return 0;
    return 1;
}

/* A decoded string: NULL with length 0, or NUL-terminated, clean, within bounds. */
static void check_str(const char *s, size_t len, size_t min, size_t max)
{
    if (s == NULL) {
        check(len == 0);
        return;
    }
    check(len >= min && len <= max && strlen(s) == len && kvr_json_utf8_valid(s, len));
    for (size_t i = 0; i < len; i++)
        check((unsigned char)s[i] >= 0x20 && s[i] != 0x7f);
}

static void check_taints(const char *const *t, size_t n)
{
    check(n <= KVR_API_MAX_TAINTS && (n == 0) == (t == NULL));
    for (size_t i = 0; i < n; i++)
        check_str(t[i], strlen(t[i]), 1, KVR_API_MAX_TAINT_BYTES);
}

static void check_preferred(const kvr_taint_weight_t *p, size_t n)
{
    check(n <= KVR_API_MAX_TAINTS && (n == 0) == (p == NULL));
    for (size_t i = 0; i < n; i++) {
        check_str(p[i].taint, strlen(p[i].taint), 1, KVR_API_MAX_TAINT_BYTES);
        check(isfinite(p[i].weight));
        for (size_t j = 0; j < i; j++)
            check(strcmp(p[i].taint, p[j].taint) != 0);
    }
}

static void check_tokens(const uint32_t *t, size_t n)
{
    check(n <= FUZZ_MAX_TOKENS && (n == 0) == (t == NULL));
}

static void check_request_id(bool has, const char *id)
{
    size_t n = strlen(id);
    check(has ? n >= 1 && n <= KVR_API_MAX_REQUEST_ID_BYTES : n == 0);
    if (has)
        check_str(id, n, 1, KVR_API_MAX_REQUEST_ID_BYTES);
}

static void check_route(const kvr_api_route_t *r)
{
    check_tokens(r->tokens, r->n_tokens);
    check_request_id(r->has_request_id, r->request_id);
    check_str(r->lora_name, r->lora_name_len, 1, KVR_API_MAX_NAME_BYTES);
    check_str(r->cache_namespace, r->cache_namespace_len, 1, KVR_API_MAX_NAME_BYTES);
    check(r->n_allowed <= FUZZ_MAX_IDS && (r->n_allowed == 0) == (r->allowed_ids == NULL));
    check(r->has_allowed || r->n_allowed == 0);
    for (size_t i = 1; i < r->n_allowed; i++)
        check(r->allowed_ids[i - 1] <= r->allowed_ids[i]);
    check(isfinite(r->priority_jump));
    check_taints(r->required_taints, r->n_required);
    check_preferred(r->preferred_taints, r->n_preferred);
    const kvr_select_override_t *o = &r->ovr;
    check(!o->has_overlap_score_credit || (isfinite(o->overlap_score_credit) &&
                                           o->overlap_score_credit >= 0));
    check(!o->has_prefill_load_scale || (isfinite(o->prefill_load_scale) &&
                                         o->prefill_load_scale >= 0));
    check(!o->has_temperature || (isfinite(o->temperature) && o->temperature >= 0));
    check(!o->has_shared_cache_multiplier || (o->shared_cache_multiplier >= 0 &&
                                              o->shared_cache_multiplier <= 1));
    check(!o->has_overlap_score_weight || (isfinite(o->overlap_score_weight) &&
                                           o->overlap_score_weight >= 0));
    check(r->has_override || !(o->has_overlap_score_credit || o->has_prefill_load_scale ||
                               o->has_temperature || o->has_shared_cache_multiplier ||
                               o->has_overlap_score_weight || r->has_assume_kv_reuse ||
                               r->has_track_prefill_tokens));
    check(kvr_select_override_validate(o, NULL) == KVR_OK);
}

static void check_decoded(int kind, const any_t *o)
{
    switch (kind) {
    case K_ROUTE:
        check_route(&o->route);
        break;
    case K_OB:
        check(!o->ob.has_decay_fraction ||
              (o->ob.decay_fraction >= 0 && o->ob.decay_fraction <= 1));
        break;
    case K_QUERY:
    case K_LOADS:
        check_tokens(o->query.tokens, o->query.n_tokens);
        check_str(o->query.lora_name, o->query.lora_name_len, 1, KVR_API_MAX_NAME_BYTES);
        check_str(o->query.cache_namespace, o->query.cache_namespace_len, 1,
                  KVR_API_MAX_NAME_BYTES);
        break;
    case K_WORKER: {
        const kvr_api_worker_t *w = &o->worker;
        check_str(w->url, w->url_len, 1, KVR_API_MAX_URL_BYTES);
        check_str(w->events, w->events_len, 1, KVR_API_MAX_URL_BYTES);
        check_str(w->replay, w->replay_len, 1, KVR_API_MAX_URL_BYTES);
        check(w->dp_size >= 1 && w->dp_size <= KVR_API_MAX_DP_SIZE);
        check((uint64_t)w->dp_start + w->dp_size - 1 <= UINT32_MAX);
        check_taints(w->taints, w->n_taints);
        check(!w->has_max_num_batched_tokens || w->max_num_batched_tokens >= 1);
        check(!w->has_total_kv_blocks || w->total_kv_blocks >= 1);
        break;
    }
    default: {
        const kvr_api_router_t *r = &o->router;
        check((unsigned)r->method <= KVR_API_ROUTER_MARK_FREE);
        check_tokens(r->tokens, r->n_tokens);
        check_request_id(r->has_request_id, r->request_id);
        check_str(r->lora_name, r->lora_name_len, 1, KVR_API_MAX_NAME_BYTES);
        check_str(r->cache_namespace, r->cache_namespace_len, 1, KVR_API_MAX_NAME_BYTES);
        check(isfinite(r->priority_jump));
        check_taints(r->required_taints, r->n_required);
        check_preferred(r->preferred_taints, r->n_preferred);
        if (r->method == KVR_API_ROUTER_MARK_PREFILL || r->method == KVR_API_ROUTER_MARK_FREE)
            check(r->has_request_id && r->n_tokens == 0 && r->lora_name == NULL &&
                  r->n_required == 0 && r->n_preferred == 0);
        if (r->method == KVR_API_ROUTER_POTENTIAL_LOADS)
            check(!r->has_request_id && r->n_required == 0 && r->priority_jump == 0);
        break;
    }
    }
}

static void check_message(const char *m)
{
    check(m[0] != '\0' && strlen(m) < 256);
    for (const char *c = m; *c; c++)
        check(*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\');
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_api_decoder_t *fast, *slow, *again;
    static kvr_json_writer_t w1, w2, resp;
    static any_t a, b, c;
    if (fast == NULL) {
        kvr_api_options_t o = {FUZZ_MAX_TOKENS, FUZZ_MAX_IDS, false};
        fast = kvr_api_decoder_new(&o);
        again = kvr_api_decoder_new(&o);
        o.no_fast_path = true;
        slow = kvr_api_decoder_new(&o);
        check(fast != NULL && slow != NULL && again != NULL);
        kvr_json_writer_init(&w1);
        kvr_json_writer_init(&w2);
        kvr_json_writer_init(&resp);
    }
    if (size == 0)
        return 0;
    int kind = data[0] % K_N;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    int s1 = decode(fast, kind, body, len, &a);
    int s2 = decode(slow, kind, body, len, &b);
    check(s1 == s2 && strcmp(kvr_api_decoder_error(fast), kvr_api_decoder_error(slow)) == 0);

    kvr_json_writer_reset(&resp);
    if (s1 != KVR_OK) {
        check(s1 == KVR_EPARSE || s1 == KVR_EINVAL || s1 == KVR_ETOOBIG);
        check_message(kvr_api_decoder_error(fast));
        check(all_zero(&a, out_size(kind)) && all_zero(&b, out_size(kind)));
        kvr_json_error(&resp, kvr_api_decoder_error(fast), "invalid_request_error", 400);
    } else {
        check(kvr_api_decoder_error(fast)[0] == '\0');
        check_decoded(kind, &a);
        size_t n1, n2, n3;
        const char *t1 = canon(&w1, kind, &a, &n1);
        const char *t2 = canon(&w2, kind, &b, &n2);
        check(n1 == n2 && memcmp(t1, t2, n1) == 0);
        check(decode(again, kind, t1, n1, &c) == KVR_OK);
        const char *t3 = canon(&w2, kind, &c, &n3);
        check(n1 == n3 && memcmp(t1, t3, n1) == 0);
        if (kind == K_ROUTE) {
            kvr_api_route_response_t r = {
                .request_id = a.route.has_request_id ? a.route.request_id : "generated",
                .worker = a.route.pinned,
                .overlap_blocks = a.route.n_tokens / 16,
                .cached_tokens = a.route.n_tokens,
            };
            kvr_api_encode_route_response(&resp, &r);
        } else {
            kvr_json_begin_object(&resp);
            kvr_json_end_object(&resp);
        }
    }
    const char *out;
    size_t out_len;
    check(kvr_json_writer_finish(&resp, &out, &out_len) == KVR_OK);
    check(kvr_json_utf8_valid(out, out_len));

    /* the raw bytes as a JSON string: always valid UTF-8, quotes balanced */
    kvr_json_writer_reset(&resp);
    kvr_json_begin_array(&resp);
    kvr_json_string_n(&resp, body, len);
    kvr_json_double(&resp, (double)len / 3.0);
    kvr_json_end_array(&resp);
    check(kvr_json_writer_finish(&resp, &out, &out_len) == KVR_OK);
    check(kvr_json_utf8_valid(out, out_len) && strlen(out) == out_len);
    return 0;
}
