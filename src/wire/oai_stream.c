/*
 * oai_stream.c: see oai_stream.h.
 *
 * One small yajl callback parser serves the three readers: it tracks the path of the value
 * being parsed (object keys mapped to a few known names, array indices) to a fixed depth and
 * hands each value to the reader, which compares the path with the few it wants.
 */
#include "wire/oai_stream.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "wire/json_decode.h"
#include "wire/yajl_arena.h"

/* ---- path tracking ------------------------------------------------------------------------ */

enum {
    K_NONE = 0, /* a key not (yet) known */
    K_CHOICES,
    K_TEXT,
    K_DELTA,
    K_CONTENT,
    K_USAGE,
    K_PROMPT_TOKENS,
    K_COMPLETION_TOKENS,
    K_PTD,
    K_CACHED_TOKENS,
    K_NVEXT,
    K_WORKER_ID,
    K_PREFILL_WORKER_ID,
    K_DECODE_WORKER_ID,
    K_ERROR,
    K_MESSAGE,
    K_DATA,
    K_ID,
    K_ANY_INDEX = 1000, /* in patterns: any array index */
};

static const struct {
    const char *name;
    int key;
} KEYS[] = {
    {"choices", K_CHOICES},
    {"text", K_TEXT},
    {"delta", K_DELTA},
    {"content", K_CONTENT},
    {"usage", K_USAGE},
    {"prompt_tokens", K_PROMPT_TOKENS},
    {"completion_tokens", K_COMPLETION_TOKENS},
    {"prompt_tokens_details", K_PTD},
    {"cached_tokens", K_CACHED_TOKENS},
    {"nvext", K_NVEXT},
    {"worker_id", K_WORKER_ID},
    {"prefill_worker_id", K_PREFILL_WORKER_ID},
    {"decode_worker_id", K_DECODE_WORKER_ID},
    {"error", K_ERROR},
    {"message", K_MESSAGE},
    {"data", K_DATA},
    {"id", K_ID},
};

#define PATH_DEPTH 6

/* A path element: a key (> 0, K_NONE for others) in an object, -(index + 1) in an array. */
typedef struct jpath {
    unsigned depth; /* containers open (may exceed PATH_DEPTH; deeper levels are not kept) */
    bool in_array[PATH_DEPTH];
    int elem[PATH_DEPTH];
} jpath_t;

typedef enum value_kind { V_NULL, V_BOOL, V_INT, V_DOUBLE, V_STRING, V_MAP, V_ARRAY } value_kind_t;

typedef struct jvalue {
    value_kind_t kind;
    long long i;
    const unsigned char *s;
    size_t len;
} jvalue_t;

typedef struct jparse jparse_t;
/* Called for every value (containers at their start); 0 cancels the parse (error set). */
typedef int (*on_value_fn)(jparse_t *p, const jvalue_t *v);

struct jparse {
    jpath_t path;
    on_value_fn on_value;
    void *user;
    char err[200]; /* set by a reader that cancels */
};

static int lookup_key(const unsigned char *k, size_t len)
{
    for (size_t i = 0; i < sizeof KEYS / sizeof KEYS[0]; i++)
        if (strlen(KEYS[i].name) == len && memcmp(KEYS[i].name, k, len) == 0)
            return KEYS[i].key;
    return K_NONE;
}

/* True when the current value's path is exactly pat[0..n). */
static bool path_is(const jpath_t *p, const int *pat, unsigned n)
{
    if (p->depth != n || n > PATH_DEPTH)
        return false;
    for (unsigned i = 0; i < n; i++) {
        int e = p->elem[i];
        if (pat[i] == K_ANY_INDEX) {
            if (!p->in_array[i])
                return false;
        } else if (pat[i] < 0) {
            if (!p->in_array[i] || e != pat[i])
                return false;
        } else if (p->in_array[i] || e != pat[i]) {
            return false;
        }
    }
    return true;
}
#define PATH_IS(p, ...) \
    path_is(&(p)->path, (const int[]){__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int))

/* After a value in an array: the next element's index. */
static void value_done(jpath_t *p)
{
    if (p->depth > 0 && p->depth <= PATH_DEPTH && p->in_array[p->depth - 1])
        p->elem[p->depth - 1]--;
}

static int deliver(jparse_t *p, const jvalue_t *v)
{
    return p->on_value(p, v);
}

static int cb_scalar(jparse_t *p, const jvalue_t *v)
{
    if (!deliver(p, v))
        return 0;
    value_done(&p->path);
    return 1;
}

static int cb_null(void *ctx)
{
    jvalue_t v = {.kind = V_NULL};
    return cb_scalar(ctx, &v);
}

static int cb_bool(void *ctx, int b)
{
    jvalue_t v = {.kind = V_BOOL, .i = b};
    return cb_scalar(ctx, &v);
}

static int cb_int(void *ctx, long long i)
{
    jvalue_t v = {.kind = V_INT, .i = i};
    return cb_scalar(ctx, &v);
}

static int cb_double(void *ctx, double d)
{
    (void)d;
    jvalue_t v = {.kind = V_DOUBLE};
    return cb_scalar(ctx, &v);
}

static int cb_string(void *ctx, const unsigned char *s, size_t len)
{
    jvalue_t v = {.kind = V_STRING, .s = s, .len = len};
    return cb_scalar(ctx, &v);
}

static int open_container(jparse_t *p, bool array)
{
    jvalue_t v = {.kind = array ? V_ARRAY : V_MAP};
    if (!deliver(p, &v))
        return 0;
    jpath_t *path = &p->path;
    if (path->depth < PATH_DEPTH) {
        path->in_array[path->depth] = array;
        path->elem[path->depth] = array ? -1 : K_NONE;
    }
    path->depth++;
    return 1;
}

static int close_container(jparse_t *p)
{
    p->path.depth--;
    value_done(&p->path);
    return 1;
}

static int cb_start_map(void *ctx)
{
    return open_container(ctx, false);
}

static int cb_end_map(void *ctx)
{
    return close_container(ctx);
}

static int cb_start_array(void *ctx)
{
    return open_container(ctx, true);
}

static int cb_end_array(void *ctx)
{
    return close_container(ctx);
}

static int cb_map_key(void *ctx, const unsigned char *k, size_t len)
{
    jpath_t *path = &((jparse_t *)ctx)->path;
    if (path->depth > 0 && path->depth <= PATH_DEPTH)
        path->elem[path->depth - 1] = lookup_key(k, len);
    return 1;
}

static const yajl_callbacks CALLBACKS = {
    cb_null,     cb_bool,      cb_int,         cb_double,   NULL /* number */, cb_string,
    cb_start_map, cb_map_key,  cb_end_map,     cb_start_array, cb_end_array,
};

/* Parses one JSON text with p's reader. KVR_OK, or KVR_EPARSE with why in err. */
static int parse_json(kvr_yajl_arena_t *arena, jparse_t *p, const char *text, size_t len,
                      char *err, size_t err_len)
{
    memset(&p->path, 0, sizeof p->path);
    p->err[0] = '\0';
    yajl_handle h = kvr_jd_yajl_open(arena, &CALLBACKS, p);
    if (h == NULL) {
        snprintf(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    yajl_status st = yajl_parse(h, (const unsigned char *)text, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    int rc = KVR_OK;
    if (st == yajl_status_client_canceled) {
        snprintf(err, err_len, "%s", p->err);
        rc = KVR_EPARSE;
    } else if (st != yajl_status_ok) {
        unsigned char *msg = yajl_get_error(h, 0, (const unsigned char *)text, len);
        char *m = (char *)msg;
        size_t n = msg ? strlen(m) : 0;
        while (n > 0 && (m[n - 1] == '\n' || m[n - 1] == ' '))
            n--;
        snprintf(err, err_len, "not JSON: %.*s", (int)(n > 120 ? 120 : n), msg ? m : "?");
        if (msg)
            yajl_free_error(h, msg);
        rc = KVR_EPARSE;
    }
    yajl_free(h);
    return rc;
}

static int reader_fail(jparse_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int reader_fail(jparse_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err, sizeof p->err, fmt, ap);
    va_end(ap);
    return 0;
}

static void copy_str(char *out, size_t cap, const unsigned char *s, size_t len)
{
    if (cap == 0)
        return;
    size_t n = len < cap - 1 ? len : cap - 1;
    memcpy(out, s, n);
    out[n] = '\0';
}

/* ---- chunks ----------------------------------------------------------------------------- */

typedef struct chunk {
    bool token;
    bool usage_prompt, usage_completion, usage_cached;
    uint64_t prompt, completion, cached;
    bool has_prefill, has_decode;
    uint64_t prefill, decode;
    bool error;
    bool error_msg;
    char msg[256];
} chunk_t;

/* A non-negative integer, or null (absent); anything else cancels. */
static int want_count(jparse_t *p, const jvalue_t *v, const char *name, bool *has,
                      uint64_t *out)
{
    if (v->kind == V_NULL)
        return 1;
    if (v->kind != V_INT || v->i < 0)
        return reader_fail(p, "%s: not an integer >= 0", name);
    *has = true;
    *out = (uint64_t)v->i;
    return 1;
}

static int chunk_value(jparse_t *p, const jvalue_t *v)
{
    chunk_t *c = p->user;
    const jpath_t *path = &p->path;
    if (path->depth == 0)
        return v->kind == V_MAP ? 1 : reader_fail(p, "not a JSON object");
    if (path->depth == 1 && path->elem[0] == K_ERROR && !path->in_array[0]) {
        if (v->kind == V_NULL)
            return 1;
        c->error = true;
        if (v->kind == V_STRING) {
            c->error_msg = true;
            copy_str(c->msg, sizeof c->msg, v->s, v->len);
        }
        return 1;
    }
    if (v->kind == V_STRING) {
        if (PATH_IS(p, K_CHOICES, K_ANY_INDEX, K_TEXT) ||
            PATH_IS(p, K_CHOICES, K_ANY_INDEX, K_DELTA, K_CONTENT)) {
            if (v->len > 0)
                c->token = true;
            return 1;
        }
        if (PATH_IS(p, K_ERROR, K_MESSAGE)) {
            c->error_msg = true;
            copy_str(c->msg, sizeof c->msg, v->s, v->len);
            return 1;
        }
    }
    if (path->depth < 2 || path->in_array[0])
        return 1;
    switch (path->elem[0]) {
    case K_USAGE:
        if (PATH_IS(p, K_USAGE, K_PROMPT_TOKENS))
            return want_count(p, v, "usage.prompt_tokens", &c->usage_prompt, &c->prompt);
        if (PATH_IS(p, K_USAGE, K_COMPLETION_TOKENS))
            return want_count(p, v, "usage.completion_tokens", &c->usage_completion,
                              &c->completion);
        if (PATH_IS(p, K_USAGE, K_PTD, K_CACHED_TOKENS))
            return want_count(p, v, "usage.prompt_tokens_details.cached_tokens",
                              &c->usage_cached, &c->cached);
        return 1;
    case K_NVEXT:
        if (PATH_IS(p, K_NVEXT, K_WORKER_ID) && v->kind != V_MAP) {
            int rc = want_count(p, v, "nvext.worker_id", &c->has_prefill, &c->prefill);
            if (c->has_prefill && !c->has_decode) {
                c->has_decode = true;
                c->decode = c->prefill;
            }
            return rc;
        }
        if (PATH_IS(p, K_NVEXT, K_WORKER_ID, K_PREFILL_WORKER_ID))
            return want_count(p, v, "nvext.worker_id.prefill_worker_id", &c->has_prefill,
                              &c->prefill);
        if (PATH_IS(p, K_NVEXT, K_WORKER_ID, K_DECODE_WORKER_ID))
            return want_count(p, v, "nvext.worker_id.decode_worker_id", &c->has_decode,
                              &c->decode);
        return 1;
    default:
        return 1;
    }
}

/* ---- the stream ------------------------------------------------------------------------- */

struct kvr_oai_stream {
    char *line;          /* the current, incomplete line */
    size_t line_len, line_cap;
    char *data;          /* the current event's data lines, each followed by \n */
    size_t data_len, data_cap;
    bool after_cr;       /* the last byte was \r: a following \n belongs to it */
    int status;          /* sticky */
    uint32_t new_tokens; /* token events in the current feed */
    kvr_oai_stream_info_t info;
    char err[300];
    kvr_yajl_arena_t arena;
};

kvr_oai_stream_t *kvr_oai_stream_new(void)
{
    kvr_oai_stream_t *s = calloc(1, sizeof *s);
    if (s)
        kvr_yajl_arena_init(&s->arena);
    return s;
}

void kvr_oai_stream_free(kvr_oai_stream_t *s)
{
    if (s == NULL)
        return;
    kvr_yajl_arena_deinit(&s->arena);
    free(s->line);
    free(s->data);
    free(s);
}

void kvr_oai_stream_reset(kvr_oai_stream_t *s)
{
    s->line_len = 0;
    s->data_len = 0;
    s->after_cr = false;
    s->status = KVR_OK;
    s->new_tokens = 0;
    memset(&s->info, 0, sizeof s->info);
    s->err[0] = '\0';
}

static int fail(kvr_oai_stream_t *s, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(kvr_oai_stream_t *s, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->err, sizeof s->err, fmt, ap);
    va_end(ap);
    s->status = status;
    return status;
}

static int append(kvr_oai_stream_t *s, char **buf, size_t *len, size_t *cap, const char *src,
                  size_t n)
{
    if (s->line_len + s->data_len + n > KVR_OAI_STREAM_MAX_EVENT)
        return fail(s, KVR_ETOOBIG, "event %llu: longer than %zu bytes",
                    (unsigned long long)s->info.n_events + 1, KVR_OAI_STREAM_MAX_EVENT);
    if (kvr_grow((void **)buf, cap, *len + n + 1, SIZE_MAX, 1) != KVR_OK)
        return fail(s, KVR_ENOMEM, "out of memory");
    memcpy(*buf + *len, src, n);
    *len += n;
    return KVR_OK;
}

static int dispatch(kvr_oai_stream_t *s)
{
    if (s->data_len == 0)
        return KVR_OK;
    s->data_len--; /* the last line's \n */
    s->data[s->data_len] = '\0';
    uint64_t n = ++s->info.n_events;
    size_t len = s->data_len;
    s->data_len = 0;
    if (s->info.done)
        return fail(s, KVR_EPARSE, "event %llu: data after [DONE]", (unsigned long long)n);
    if (len == 6 && memcmp(s->data, "[DONE]", 6) == 0) {
        s->info.done = true;
        return KVR_OK;
    }
    if (len == 0)
        return fail(s, KVR_EPARSE, "event %llu: empty data", (unsigned long long)n);
    chunk_t c;
    memset(&c, 0, sizeof c);
    jparse_t p = {.on_value = chunk_value, .user = &c};
    char why[240];
    int rc = parse_json(&s->arena, &p, s->data, len, why, sizeof why);
    if (rc != KVR_OK)
        return fail(s, rc, "event %llu: %s", (unsigned long long)n, why);
    kvr_oai_stream_info_t *in = &s->info;
    if (c.token) {
        in->n_token_events++;
        s->new_tokens++;
    }
    if (c.usage_prompt || c.usage_completion || c.usage_cached)
        in->has_usage = true;
    if (c.usage_prompt)
        in->prompt_tokens = c.prompt;
    if (c.usage_completion)
        in->completion_tokens = c.completion;
    if (c.usage_cached) {
        in->has_cached = true;
        in->cached_tokens = c.cached;
    }
    if (c.has_prefill || c.has_decode) {
        in->has_worker = true;
        in->worker_id = c.has_prefill ? c.prefill : c.decode;
        in->decode_worker_id = c.has_decode ? c.decode : c.prefill;
    }
    if (c.error) {
        in->error_event = true;
        snprintf(in->error, sizeof in->error, "%s", c.error_msg ? c.msg : "");
    }
    return KVR_OK;
}

/* One complete line (without its end). */
static int line_done(kvr_oai_stream_t *s)
{
    const char *l = s->line;
    size_t n = s->line_len;
    s->line_len = 0;
    if (n == 0)
        return dispatch(s);
    if (l[0] == ':')
        return KVR_OK; /* a comment */
    const char *colon = memchr(l, ':', n);
    size_t field = colon ? (size_t)(colon - l) : n;
    if (field != 4 || memcmp(l, "data", 4) != 0)
        return KVR_OK; /* event, id, retry, unknown fields */
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ')
        v++;
    size_t vl = (size_t)(l + n - v);
    int rc = append(s, &s->data, &s->data_len, &s->data_cap, v, vl);
    if (rc == KVR_OK)
        rc = append(s, &s->data, &s->data_len, &s->data_cap, "\n", 1);
    return rc;
}

int kvr_oai_stream_feed(kvr_oai_stream_t *s, const char *data, size_t len,
                        uint32_t *new_token_events)
{
    s->new_tokens = 0;
    size_t i = 0;
    while (s->status == KVR_OK && i < len) {
        if (s->after_cr) {
            s->after_cr = false;
            if (data[i] == '\n') {
                i++;
                continue;
            }
        }
        size_t j = i;
        while (j < len && data[j] != '\n' && data[j] != '\r')
            j++;
        if (j > i && append(s, &s->line, &s->line_len, &s->line_cap, data + i, j - i) != KVR_OK)
            break;
        if (j == len)
            break;
        s->after_cr = data[j] == '\r';
        line_done(s);
        i = j + 1;
    }
    if (new_token_events)
        *new_token_events = s->new_tokens;
    return s->status;
}

int kvr_oai_stream_finish(kvr_oai_stream_t *s)
{
    s->new_tokens = 0;
    if (s->status == KVR_OK && s->line_len > 0)
        line_done(s);
    if (s->status == KVR_OK)
        dispatch(s);
    if (s->status == KVR_OK && !s->info.done)
        fail(s, KVR_EPARSE, "stream ended without [DONE] after %llu events",
             (unsigned long long)s->info.n_events);
    return s->status;
}

const kvr_oai_stream_info_t *kvr_oai_stream_info(const kvr_oai_stream_t *s)
{
    return &s->info;
}

const char *kvr_oai_stream_error(const kvr_oai_stream_t *s)
{
    return s->err;
}

/* ---- whole bodies ------------------------------------------------------------------------ */

typedef struct models_ctx {
    char *out;
    size_t cap;
    bool found;
} models_ctx_t;

static int models_value(jparse_t *p, const jvalue_t *v)
{
    models_ctx_t *m = p->user;
    if (p->path.depth == 0 && v->kind != V_MAP)
        return reader_fail(p, "not a JSON object");
    if (m->found || v->kind != V_STRING || !PATH_IS(p, K_DATA, -1, K_ID))
        return 1;
    if (v->len == 0)
        return reader_fail(p, "data[0].id: empty");
    if (v->len >= m->cap)
        return reader_fail(p, "data[0].id: longer than %zu bytes", m->cap - 1);
    if (memchr(v->s, '\0', v->len))
        return reader_fail(p, "data[0].id: holds a NUL");
    copy_str(m->out, m->cap, v->s, v->len);
    m->found = true;
    return 1;
}

int kvr_oai_models_first_id(const char *body, size_t len, char *out, size_t cap, char *err,
                            size_t err_len)
{
    if (cap == 0)
        return KVR_EINVAL;
    out[0] = '\0';
    kvr_yajl_arena_t arena;
    kvr_yajl_arena_init(&arena);
    models_ctx_t m = {out, cap, false};
    jparse_t p = {.on_value = models_value, .user = &m};
    char why[240];
    int rc = parse_json(&arena, &p, body, len, why, sizeof why);
    kvr_yajl_arena_deinit(&arena);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "%s", why);
        out[0] = '\0';
        return strstr(why, "longer than") ? KVR_ETOOBIG : rc;
    }
    if (!m.found) {
        snprintf(err, err_len, "no model: data[0].id missing");
        return KVR_EPARSE;
    }
    return KVR_OK;
}

typedef struct errmsg_ctx {
    char *out;
    size_t cap;
    bool found;
} errmsg_ctx_t;

static int errmsg_value(jparse_t *p, const jvalue_t *v)
{
    errmsg_ctx_t *e = p->user;
    if (e->found || v->kind != V_STRING)
        return 1;
    if (PATH_IS(p, K_ERROR, K_MESSAGE) || PATH_IS(p, K_MESSAGE) || PATH_IS(p, K_ERROR)) {
        copy_str(e->out, e->cap, v->s, v->len);
        e->found = true;
    }
    return 1;
}

bool kvr_oai_error_message(const char *body, size_t len, char *out, size_t cap)
{
    if (cap == 0)
        return false;
    out[0] = '\0';
    kvr_yajl_arena_t arena;
    kvr_yajl_arena_init(&arena);
    errmsg_ctx_t e = {out, cap, false};
    jparse_t p = {.on_value = errmsg_value, .user = &e};
    char why[240];
    int rc = parse_json(&arena, &p, body, len, why, sizeof why);
    kvr_yajl_arena_deinit(&arena);
    if (rc != KVR_OK && !e.found) {
        out[0] = '\0';
        return false;
    }
    return e.found;
}
