/*
 * fe_body.c: the bytes the front end sends and relays besides the stream itself.
 *   - the body for the workers when the client's cannot go verbatim: its top-level members
 *     (found by wire/json_scan.c's object walk, lenient: the OpenAI decoder validated the
 *     body before) but nvext, then nvext's engine priority as the top-level "priority"
 *     vLLM and SGLang read (replacing the client's own), then the ids to run ("prompt" for
 *     completions, nvext.token_data for chat with frontend_chat_token_data); the KV-transfer
 *     members (kv_transfer_params,
 *     bootstrap_*) are never taken from a client unless frontend_trust_kv_transfer is on: they
 *     name the host an engine reads KV from or sends it to, so only the router sets them;
 *   - the nvext naming the chosen worker, spliced into a worker's JSON answer or event when
 *     the client asked for it (wire/json_splice.c, strict: the worker's bytes are untrusted).
 * Invariants: a built body fits the size computed before it is written (asserted).
 * Ownership: the built body belongs to the request (p->prompt.body_own), a leg body to its
 * caller. Threads: the HTTP thread.
 * Cost: the body is sized once from an upper bound (the client's body plus 11 bytes an id)
 * and written in one pass: one allocation, no growth.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/buffer.h>

#include "base/dec.h"
#include "frontend/fe_body.h"
#include "wire/json_splice.h"

/* The members of the object at b[i..n) (after whitespace); their count, or -1 when it is not
 * an object of at most FE_MAX_MEMBERS members. */
static int scan_members(const char *b, size_t n, size_t i, kvr_json_member_t *m)
{
    kvr_json_iter_t it;
    kvr_json_member_t extra;
    int k = 0, r;
    kvr_json_object_begin(&it, b, n, kvr_json_skip_ws(b, n, i), KVR_JSON_LENIENT);
    while ((r = kvr_json_object_next(&it, k < FE_MAX_MEMBERS ? &m[k] : &extra)) == 1)
        if (k++ == FE_MAX_MEMBERS)
            return -1;
    return r == 0 ? k : -1;
}

/* Writes into a buffer sized once for everything: appends never fail, never grow. */
typedef struct cursor {
    char *o;
} cursor_t;

static void put(cursor_t *c, const char *s, size_t n)
{
    memcpy(c->o, s, n);
    c->o += n;
}

static void put_str(cursor_t *c, const char *s) { put(c, s, strlen(s)); }

/* "[1,2,3]": at most 11 bytes an id (10 digits and a comma), 2 for the brackets */
static void put_ids(cursor_t *c, const uint32_t *t, size_t n)
{
    *c->o++ = '[';
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            *c->o++ = ',';
        c->o = kvr_dec_u64(c->o, t[i]);
    }
    *c->o++ = ']';
}

static bool dropped(const char *b, const kvr_json_member_t *m, const char *const *drop,
                    unsigned *seen)
{
    for (unsigned i = 0; drop != NULL && drop[i] != NULL; i++)
        if (kvr_json_key_is(b, m, drop[i])) {
            *seen |= 1u << i;
            return true;
        }
    return false;
}

/* The members through which a client would choose where an engine moves KV: vLLM's
 * (kv_transfer_params, read by its KV connectors) and SGLang's (the bootstrap server). */
static const char *const KVT_MEMBERS[] = {"kv_transfer_params", "bootstrap_host",
                                          "bootstrap_port",     "bootstrap_room",
                                          "bootstrap_pair_key", NULL};

bool fe_body_may_name_kvt(const char *b, size_t n)
{
    /* Every member of KVT_MEMBERS holds a '_' right after "kv" or "bootstrap", and a key spelt
     * with escapes holds a '\\': memchr finds both at memory speed. Measured on an 8,192-token
     * prompt body (46,649 bytes): 0.57 us, against 33.7 us for three memmem calls. */
    if (memchr(b, '\\', n) != NULL)
        return true;
    for (const char *p = b, *e = b + n; (p = memchr(p, '_', (size_t)(e - p))) != NULL; p++) {
        size_t i = (size_t)(p - b);
        if ((i >= 2 && n - (i - 2) >= 18 && memcmp(p - 2, "kv_transfer_params", 18) == 0) ||
            (i >= 9 && memcmp(p - 9, "bootstrap", 9) == 0))
            return true;
    }
    return false;
}

/* The forward body (see the top) without drop's members, then tail: into a new buffer. */
static int build_body(fe_req_t *p, const char *const *drop, unsigned *seen, const char *tail,
                      size_t tail_len, char **out_body, size_t *out_len)
{
    kvr_frontend_t *fe = p->fe;
    const char *b = p->prompt.client_body;
    int k = scan_members(b, p->prompt.client_body_len, 0, fe->members);
    if (k < 0)
        return KVR_ETOOBIG; /* the decoder accepted it: only the member cap can refuse it */
    /* the kept members are a part of the body; the rest is the ids and fixed text */
    size_t cap = p->prompt.client_body_len + p->prompt.n_tokens * 11 + 96 + tail_len;
    char *out = malloc(cap);
    if (out == NULL)
        return KVR_ENOMEM;
    cursor_t c = {out};
    put(&c, "{", 1);
    bool first = true;
    unsigned seen_local = 0, kvt_seen = 0;
    const char *const *kvt = fe->cfg.frontend_trust_kv_transfer ? NULL : KVT_MEMBERS;
    for (int i = 0; i < k; i++) {
        const kvr_json_member_t *m = &fe->members[i];
        if (kvr_json_key_is(b, m, "nvext") ||
            (p->prompt.drop_prompt && kvr_json_key_is(b, m, "prompt")) ||
            (p->hints.has_priority && kvr_json_key_is(b, m, "priority")) ||
            dropped(b, m, drop, &seen_local) || dropped(b, m, kvt, &kvt_seen))
            continue;
        if (!first)
            put(&c, ",", 1);
        put(&c, b + m->key, m->val_end - m->key);
        first = false;
    }
    if (p->hints.has_priority) { /* nvext's engine priority as the engines read it */
        char pr[32];
        int n = snprintf(pr, sizeof pr, "%s\"priority\":%d", first ? "" : ",",
                         (int)p->hints.priority);
        put(&c, pr, (size_t)n);
        first = false;
    }
    if (p->client.ep == KVR_OAI_COMPLETIONS) {
        if (p->prompt.drop_prompt) {
            put_str(&c, first ? "\"prompt\":" : ",\"prompt\":");
            put_ids(&c, p->prompt.tokens, p->prompt.n_tokens);
            first = false;
        }
    } else if (fe->cfg.frontend_chat_token_data) {
        put_str(&c, first ? "\"nvext\":{\"token_data\":" : ",\"nvext\":{\"token_data\":");
        put_ids(&c, p->prompt.tokens, p->prompt.n_tokens);
        put(&c, "}", 1);
        first = false;
    }
    if (tail_len > 0) {
        if (!first)
            put(&c, ",", 1);
        put(&c, tail, tail_len);
    }
    put(&c, "}", 1);
    assert((size_t)(c.o - out) <= cap);
    if (seen != NULL)
        *seen = seen_local;
    if (kvt_seen != 0 && !p->prompt.kvt_counted) { /* once a request, whichever body first */
        p->prompt.kvt_counted = true;
        fe->st.kvt_stripped++;
        kvr_log_limited(&fe->rl_proto, KVR_LOG_WARN,
                        "a client's KV-transfer fields (kv_transfer_params / bootstrap_*) were "
                        "stripped: only the router sets them (frontend_trust_kv_transfer is off)");
    }
    *out_body = out;
    *out_len = (size_t)(c.o - out);
    return KVR_OK;
}

/* The body sent to workers when the client's cannot go verbatim (see the top). KVR_OK,
 * KVR_ETOOBIG (more members than we splice) or KVR_ENOMEM. */
int fe_build_forward_body(fe_req_t *p)
{
    char *out;
    size_t len;
    int rc = build_body(p, NULL, NULL, NULL, 0, &out, &len);
    if (rc != KVR_OK)
        return rc;
    free(p->prompt.body_own);
    p->prompt.body_own = out;
    p->prompt.body = out;
    p->prompt.body_len = len;
    return KVR_OK;
}

int fe_build_leg_body(fe_req_t *p, const char *const *drop, unsigned *seen, const char *tail,
                      size_t tail_len, char **out, size_t *out_len)
{
    return build_body(p, drop, seen, tail, tail_len, out, out_len);
}

/* "nvext":{"worker_id":{...}} for the chosen workers (pf, the prefill worker, when the request
 * was prefilled elsewhere, else the one worker's). */
void fe_make_nvext(fe_req_t *p, const kvr_worker_t *pf)
{
    const kvr_worker_t *w = &p->route.worker;
    if (pf == NULL)
        pf = w;
    int n = snprintf(p->client.nvext, sizeof p->client.nvext,
                     "\"nvext\":{\"worker_id\":{\"prefill_worker_id\":%llu,\"prefill_dp_rank\":%u,"
                     "\"decode_worker_id\":%llu,\"decode_dp_rank\":%u}}",
                     (unsigned long long)pf->worker_id, pf->dp_rank,
                     (unsigned long long)w->worker_id, w->dp_rank);
    p->client.nvext_len = n > 0 && (size_t)n < sizeof p->client.nvext ? (size_t)n : 0;
}

/* Appends json (one object) to out with the worker's nvext as its last member (any nvext the
 * worker sent dropped); false (out untouched) when it is not one valid object. */
bool fe_inject_worker(const fe_req_t *p, const char *json, size_t len, struct evbuffer *out)
{
    if (p->client.nvext_len == 0)
        return false;
    struct evbuffer_iovec v;
    size_t cap = KVR_JSON_SPLICE_OUT_BYTES(len, p->client.nvext_len), n = 0;
    if (evbuffer_reserve_space(out, (ev_ssize_t)cap, &v, 1) < 1 || v.iov_len < cap)
        return false;
    if (kvr_json_splice(json, len, "nvext", p->client.nvext, p->client.nvext_len, v.iov_base,
                        v.iov_len, &n) != KVR_OK)
        return false;
    v.iov_len = n;
    return evbuffer_commit_space(out, &v, 1) == 0;
}
