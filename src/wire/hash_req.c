/*
 * hash_req.c: the hash request decoder (see hash_req.h for the format and the contract).
 *
 * Invariants: a parse either succeeds with every output consistent (tokens within
 * limits.max_tokens, opts.mm strictly ascending by block, each entry's hashes ascending) or
 * fails with r->err naming the first problem; the callbacks stop yajl at the first problem.
 * Memory: the decoder owns tok_buf, mm_buf, mmh_buf, the name buffers and a yajl arena
 * (wire/yajl_arena.h, reset per line). Each grows geometrically up to the limits and is
 * reused, so steady-state parsing allocates nothing.
 * Threads: none of its own; a decoder belongs to one thread at a time.
 * Cost: O(line bytes) for yajl and the callbacks, O(m log m) to sort m mm entries/hashes
 * (in place, heap sort, skipped when already in order).
 */
#include "wire/hash_req.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/grow.h"
#include "base/sort.h"
#include "wire/json_decode.h"
#include "wire/token_scan.h"
#include "wire/yajl_arena.h"

/* ------------------------------------------------------------------------------------------ */
/* Decoder state. */

enum state {
    S_START,     /* before the top-level value */
    S_TOP_KEY,   /* in the top-level object, expecting a key or its end */
    S_VALUE,     /* expecting the value of r->field */
    S_TOKENS,    /* in the tokens array */
    S_MM_KEY,    /* in block_mm_hashes, expecting a key or its end */
    S_MM_VALUE,  /* expecting the array of the current mm entry */
    S_MM_ARRAY,  /* in the array of the current mm entry */
    S_DONE,      /* after the top-level object */
};

enum field {
    F_TOKENS,
    F_BLOCK_SIZE,
    F_LORA_NAME,
    F_CACHE_NAMESPACE,
    F_IS_EAGLE,
    F_BLOCK_MM_HASHES,
    F_N_KNOWN,
    F_UNKNOWN = F_N_KNOWN,
};

static const char *const FIELD_NAMES[F_N_KNOWN] = {
    "tokens", "block_size", "lora_name", "cache_namespace", "is_eagle", "block_mm_hashes",
};

/* Records the first error; `return fail(...)` stops yajl (see kvr_jd_fail). */
#define fail(r, st, ...) kvr_jd_fail(&(r)->status, (r)->err, sizeof (r)->err, (st), __VA_ARGS__)

static int copy_name(kvr_hash_req_t *r, char **buf, size_t *cap, const unsigned char *s,
                     size_t n, const char **out, size_t *out_len)
{
    if (kvr_grow((void **)buf, cap, n + 1, SIZE_MAX, 1) != KVR_OK)
        return fail(r, KVR_ENOMEM, "%s: out of memory", FIELD_NAMES[r->field]);
    memcpy(*buf, s, n);
    (*buf)[n] = '\0';
    *out = *buf;
    *out_len = n;
    return 1;
}

/* After a value of the top-level object. */
static int value_done(kvr_hash_req_t *r)
{
    r->state = S_TOP_KEY;
    return 1;
}

/* A value of the wrong type where the current state expects something specific. */
static int unexpected(kvr_hash_req_t *r)
{
    const kvr_hash_req_t *q = r;
    switch (q->state) {
    case S_START:
        return fail(r, KVR_EPARSE, "expected a JSON object");
    case S_VALUE:
        switch (q->field) {
        case F_TOKENS:
            return fail(r, KVR_EPARSE, "tokens: must be an array of integers");
        case F_BLOCK_SIZE:
            return fail(r, KVR_EPARSE, "block_size: not an integer");
        case F_LORA_NAME:
        case F_CACHE_NAMESPACE:
            return fail(r, KVR_EPARSE, "%s: must be a string or null", FIELD_NAMES[q->field]);
        case F_IS_EAGLE:
            return fail(r, KVR_EPARSE, "is_eagle: must be true, false or null");
        case F_BLOCK_MM_HASHES:
            return fail(r, KVR_EPARSE, "block_mm_hashes: must be an object or null");
        default:
            break;
        }
        break;
    case S_TOKENS:
        return fail(r, KVR_EPARSE, "tokens[%zu]: not an integer in [0, 4294967295]", q->n_tokens);
    case S_MM_VALUE:
        return fail(r, KVR_EPARSE, "block_mm_hashes['%u']: must be an array of integers or null",
                    (unsigned)q->mm_buf[q->n_mm - 1].block);
    case S_MM_ARRAY:
        return fail(r, KVR_EPARSE,
                    "block_mm_hashes['%u'][%zu]: not an integer in [0, 18446744073709551615]",
                    (unsigned)q->mm_buf[q->n_mm - 1].block, q->mm_buf[q->n_mm - 1].n_hashes);
    default:
        break;
    }
    return fail(r, KVR_EPARSE, "internal: unexpected value in state %d", q->state);
}

static int skipped(void *ctx) { return value_done(ctx); }

static int on_null(void *ctx)
{
    kvr_hash_req_t *r = ctx;
    if (r->state == S_VALUE) {
        switch (r->field) {
        case F_LORA_NAME:
            r->opts.lora_name = NULL;
            r->opts.lora_name_len = 0;
            return value_done(r);
        case F_CACHE_NAMESPACE:
            r->opts.cache_namespace = NULL;
            r->opts.cache_namespace_len = 0;
            return value_done(r);
        case F_IS_EAGLE:
            r->opts.is_eagle = false;
            return value_done(r);
        case F_BLOCK_MM_HASHES:
            return value_done(r);
        case F_BLOCK_SIZE:
            return fail(r, KVR_EPARSE, "block_size: missing (null)");
        case F_TOKENS:
            return fail(r, KVR_EPARSE, "tokens: missing (null)");
        default:
            break;
        }
    }
    if (r->state == S_MM_VALUE) {
        r->state = S_MM_KEY;  /* no hashes for this block */
        return 1;
    }
    return unexpected(r);
}

static int on_boolean(void *ctx, int v)
{
    kvr_hash_req_t *r = ctx;
    if (r->state == S_VALUE && r->field == F_IS_EAGLE) {
        r->opts.is_eagle = v != 0;
        return value_done(r);
    }
    return unexpected(r);
}

static int on_number(void *ctx, const char *s, size_t n)
{
    kvr_hash_req_t *r = ctx;
    uint64_t v;
    switch (r->state) {
    case S_TOKENS:
        if (!kvr_jd_parse_u64(s, n, 0, UINT32_MAX, &v))
            return fail(r, KVR_ERANGE, "tokens[%zu]: not an integer in [0, 4294967295]",
                        r->n_tokens);
        if (r->n_tokens >= r->limits.max_tokens)
            return fail(r, KVR_ETOOBIG, "tokens: more than %zu tokens", r->limits.max_tokens);
        if (r->n_tokens == r->tok_cap &&
            kvr_grow((void **)&r->tok_buf, &r->tok_cap, r->n_tokens + 1, SIZE_MAX, sizeof *r->tok_buf) != KVR_OK)
            return fail(r, KVR_ENOMEM, "tokens: out of memory");
        r->tok_buf[r->n_tokens++] = (uint32_t)v;
        return 1;
    case S_MM_ARRAY: {
        kvr_block_mm_t *e = &r->mm_buf[r->n_mm - 1];
        if (!kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v))
            return fail(r, KVR_ERANGE,
                        "block_mm_hashes['%u'][%zu]: not an integer in [0, 18446744073709551615]",
                        (unsigned)e->block, e->n_hashes);
        if (r->n_mmh >= r->limits.max_mm_hashes)
            return fail(r, KVR_ETOOBIG, "block_mm_hashes: more than %zu hashes in total",
                        r->limits.max_mm_hashes);
        if (r->n_mmh == r->mmh_cap &&
            kvr_grow((void **)&r->mmh_buf, &r->mmh_cap, r->n_mmh + 1, SIZE_MAX, sizeof *r->mmh_buf) != KVR_OK)
            return fail(r, KVR_ENOMEM, "block_mm_hashes: out of memory");
        r->mmh_buf[r->n_mmh++] = v;
        e->n_hashes++;
        return 1;
    }
    case S_VALUE:
        if (r->field == F_BLOCK_SIZE) {
            bool neg;
            if (!kvr_jd_parse_int(s, n, &v, &neg)) {
                /* a fraction or exponent, or a magnitude beyond u64 */
                bool integral = memchr(s, '.', n) == NULL && memchr(s, 'e', n) == NULL &&
                                memchr(s, 'E', n) == NULL;
                if (!integral)
                    return fail(r, KVR_EPARSE, "block_size: not an integer");
                neg = s[0] == '-';
                v = UINT64_MAX;
            }
            if (neg || v == 0)
                return fail(r, KVR_ERANGE, "block_size: must be >= 1");
            if (v > KVR_HASH_REQ_MAX_BLOCK_SIZE)
                return fail(r, KVR_ERANGE, "block_size: must be <= %u",
                            (unsigned)KVR_HASH_REQ_MAX_BLOCK_SIZE);
            r->block_size = (uint32_t)v;
            return value_done(r);
        }
        break;
    default:
        break;
    }
    return unexpected(r);
}

static int on_string(void *ctx, const unsigned char *s, size_t n)
{
    kvr_hash_req_t *r = ctx;
    if (r->state == S_VALUE && r->field == F_LORA_NAME) {
        if (!copy_name(r, &r->lora_buf, &r->lora_cap, s, n, &r->opts.lora_name,
                       &r->opts.lora_name_len))
            return 0;
        return value_done(r);
    }
    if (r->state == S_VALUE && r->field == F_CACHE_NAMESPACE) {
        if (!copy_name(r, &r->ns_buf, &r->ns_cap, s, n, &r->opts.cache_namespace,
                       &r->opts.cache_namespace_len))
            return 0;
        return value_done(r);
    }
    return unexpected(r);
}

static int on_start_map(void *ctx)
{
    kvr_hash_req_t *r = ctx;
    switch (r->state) {
    case S_START:
        r->state = S_TOP_KEY;
        return 1;
    case S_VALUE:
        if (r->field == F_BLOCK_MM_HASHES) {
            r->state = S_MM_KEY;
            return 1;
        }
        break;
    default:
        break;
    }
    return unexpected(r);
}

static int on_start_array(void *ctx)
{
    kvr_hash_req_t *r = ctx;
    switch (r->state) {
    case S_VALUE:
        if (r->field == F_TOKENS) {
            r->state = S_TOKENS;
            return 1;
        }
        break;
    case S_MM_VALUE:
        r->state = S_MM_ARRAY;
        return 1;
    default:
        break;
    }
    return unexpected(r);
}

/* Closes a container: yajl guarantees map/array pairing, so only the state matters. */
static int on_end(void *ctx)
{
    kvr_hash_req_t *r = ctx;
    switch (r->state) {
    case S_TOP_KEY:
        r->state = S_DONE;
        return 1;
    case S_TOKENS:
    case S_MM_KEY:
        r->state = S_TOP_KEY;
        return 1;
    case S_MM_ARRAY:
        r->state = S_MM_KEY;
        return 1;
    default:
        return fail(r, KVR_EPARSE, "internal: unexpected end in state %d", r->state);
    }
}

/* A block_mm_hashes key: "0" or [1-9][0-9]* up to UINT32_MAX. */
static bool parse_block_index(const unsigned char *s, size_t n, uint32_t *out)
{
    if (n == 0 || n > 10 || (n > 1 && s[0] == '0'))
        return false;
    uint64_t v;
    if (!kvr_jd_parse_u64((const char *)s, n, 0, UINT32_MAX, &v))
        return false;
    *out = (uint32_t)v;
    return true;
}

static int on_map_key(void *ctx, const unsigned char *s, size_t n)
{
    kvr_hash_req_t *r = ctx;
    if (r->state == S_TOP_KEY) {
        for (int f = 0; f < F_N_KNOWN; f++) {
            if (strlen(FIELD_NAMES[f]) == n && memcmp(FIELD_NAMES[f], s, n) == 0) {
                if (r->seen & (1u << f))
                    return fail(r, KVR_EPARSE, "%s: duplicate key", FIELD_NAMES[f]);
                r->seen |= 1u << f;
                r->field = f;
                r->state = S_VALUE;
                return 1;
            }
        }
        kvr_jd_skip_next(&r->skip); /* not ours: the skeleton swallows its value */
        return 1;
    }
    if (r->state == S_MM_KEY) {
        uint32_t block;
        if (!parse_block_index(s, n, &block)) {
            char shown[KVR_JD_CLIP_BYTES];
            kvr_jd_clip(shown, sizeof shown, s, n);
            return fail(r, KVR_EPARSE, "block_mm_hashes: key '%s' is not a block index", shown);
        }
        if (r->n_mm >= r->limits.max_mm_blocks)
            return fail(r, KVR_ETOOBIG, "block_mm_hashes: more than %zu entries",
                        r->limits.max_mm_blocks);
        if (r->n_mm == r->mm_cap &&
            kvr_grow((void **)&r->mm_buf, &r->mm_cap, r->n_mm + 1, SIZE_MAX, sizeof *r->mm_buf) != KVR_OK)
            return fail(r, KVR_ENOMEM, "block_mm_hashes: out of memory");
        /* hashes is set when the parse ends (mmh_buf may move until then); each entry's
         * hashes follow the previous entry's in mmh_buf */
        r->mm_buf[r->n_mm++] = (kvr_block_mm_t){.block = block, .hashes = NULL, .n_hashes = 0};
        r->state = S_MM_VALUE;
        return 1;
    }
    return fail(r, KVR_EPARSE, "internal: unexpected key in state %d", r->state);
}

static const kvr_jd_skip_ops_t SKIP_OPS = {
    .own = KVR_JD_OWN_CALLBACKS,
    .skipped = skipped,
};

/* ------------------------------------------------------------------------------------------ */



static void sift_mm(kvr_block_mm_t *a, size_t root, size_t n)
{
    for (;;) {
        size_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && a[child + 1].block > a[child].block)
            child++;
        if (a[root].block >= a[child].block)
            return;
        kvr_block_mm_t t = a[root];
        a[root] = a[child];
        a[child] = t;
        root = child;
    }
}

static void sort_mm(kvr_block_mm_t *a, size_t n)
{
    size_t i = 1;
    while (i < n && a[i - 1].block <= a[i].block)
        i++;
    if (i >= n)
        return;
    for (size_t k = n / 2; k-- > 0;)
        sift_mm(a, k, n);
    for (size_t end = n; end-- > 1;) {
        kvr_block_mm_t t = a[0];
        a[0] = a[end];
        a[end] = t;
        sift_mm(a, 0, end);
    }
}

/* ------------------------------------------------------------------------------------------ */

void kvr_hash_req_init(kvr_hash_req_t *r)
{
    memset(r, 0, sizeof *r);
    r->limits.max_tokens = KVR_HASH_REQ_MAX_TOKENS;
    r->limits.max_mm_blocks = KVR_HASH_REQ_MAX_MM_BLOCKS;
    r->limits.max_mm_hashes = KVR_HASH_REQ_MAX_MM_HASHES;
}

void kvr_hash_req_deinit(kvr_hash_req_t *r)
{
    if (r == NULL)
        return;
    free(r->tok_buf);
    free(r->mm_buf);
    free(r->mmh_buf);
    free(r->lora_buf);
    free(r->ns_buf);
    kvr_yajl_arena_deinit(r->arena);
    free(r->arena);
    kvr_hash_req_limits_t limits = r->limits;
    kvr_hash_req_init(r);
    r->limits = limits;
}

static void reset_outputs(kvr_hash_req_t *r)
{
    r->tokens = NULL;
    r->n_tokens = 0;
    r->block_size = 0;
    memset(&r->opts, 0, sizeof r->opts);
    r->err[0] = '\0';
    r->n_mm = 0;
    r->n_mmh = 0;
    r->state = S_START;
    r->field = F_UNKNOWN;
    kvr_jd_skip_reset(&r->skip, &SKIP_OPS);
    r->seen = 0;
    r->status = KVR_OK;
}

/* Checks the whole request once yajl is done and fixes up the mm pointers. */
static int finish(kvr_hash_req_t *r)
{
    if (r->state != S_DONE)
        return fail(r, KVR_EPARSE, "internal: parse ended in state %d", r->state), r->status;
    if (!(r->seen & (1u << F_TOKENS)))
        return fail(r, KVR_EPARSE, "tokens: missing"), r->status;
    if (!(r->seen & (1u << F_BLOCK_SIZE)))
        return fail(r, KVR_EPARSE, "block_size: missing"), r->status;

    size_t off = 0;
    for (size_t i = 0; i < r->n_mm; i++) {
        kvr_block_mm_t *e = &r->mm_buf[i];
        if (e->n_hashes == 0)
            continue;
        e->hashes = r->mmh_buf + off;
        kvr_sort_u64(r->mmh_buf + off, e->n_hashes);
        off += e->n_hashes;
    }
    sort_mm(r->mm_buf, r->n_mm);
    for (size_t i = 1; i < r->n_mm; i++) {
        if (r->mm_buf[i].block == r->mm_buf[i - 1].block)
            return fail(r, KVR_EPARSE, "block_mm_hashes: duplicate block index %u",
                        (unsigned)r->mm_buf[i].block), r->status;
    }

    r->tokens = r->n_tokens > 0 ? r->tok_buf : NULL;
    r->opts.mm = r->n_mm > 0 ? r->mm_buf : NULL;
    r->opts.n_mm = r->n_mm;
    return KVR_OK;
}

int kvr_hash_req_parse(kvr_hash_req_t *r, const char *line, size_t len)
{
    reset_outputs(r);
    if (line == NULL && len > 0)
        return fail(r, KVR_EINVAL, "no input"), r->status;

    if (r->arena == NULL) {
        kvr_yajl_arena_t *a = malloc(sizeof *a);
        if (a == NULL)
            return fail(r, KVR_ENOMEM, "out of memory"), r->status;
        kvr_yajl_arena_init(a);
        r->arena = a;
    }
    yajl_handle h = kvr_jd_yajl_open(r->arena, &kvr_jd_callbacks, r);
    if (h == NULL)
        return fail(r, KVR_ENOMEM, "out of memory"), r->status;

    char msg[KVR_JD_MSG_BYTES];
    yajl_status st = kvr_jd_yajl_finish(h, yajl_parse(h, (const unsigned char *)line, len), 0,
                                        len, msg, sizeof msg);
    if (st == yajl_status_error)
        fail(r, KVR_EPARSE, "%s",
             r->state == S_START && kvr_jd_blank(line, len) ? "empty input" : msg);
    yajl_free(h);

    if (r->status == KVR_OK && st != yajl_status_ok)
        fail(r, KVR_EPARSE, "invalid JSON");  /* client_canceled always sets status first */
    if (r->status == KVR_OK)
        finish(r);
    if (r->status != KVR_OK) {
        r->tokens = NULL;
        r->n_tokens = 0;
        memset(&r->opts, 0, sizeof r->opts);
        return r->status;
    }
    return KVR_OK;
}
