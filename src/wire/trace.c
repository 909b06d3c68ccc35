/*
 * trace.c: the Mooncake trace reader and token generator (see trace.h for the format and the
 * contract; the hit-ratio ceilings of a trace are sim/ceilings.c).
 *
 * Parsing: one yajl pass per line, driven by callbacks (a small state machine: the top-level
 * object, its four known keys, the hash_ids array, and unknown values skipped at any depth).
 * Numbers are read from their text, so ids above 2^53 are exact and 1.0 / 1e3 are not
 * integers. The first problem stops the parse; the message names the line (1-based, blank
 * lines counted) and the field. Rows go into one growing array and ids into another; a row
 * records its ids' offset while parsing and gets its pointer once the id array stops moving.
 * Invariants after KVR_OK: every row has input_length in [1, KVR_TRACE_MAX_INPUT],
 * output_length >= 1, n_hash_ids == ceil(input_length / 512), timestamps non-decreasing,
 * hash_ids pointing into ids, and sum of n_hash_ids == n_ids.
 * Memory: the trace owns rows and ids; parsing also uses one yajl arena (freed before return).
 *
 * Tokens: block `id` of a row is the stream splitmix64(id * K1 ^ seed * K2 ^ K3) mapped into
 * [KVR_TRACE_TOKEN_LO, KVR_TRACE_TOKEN_HI) by a multiply-shift (Lemire), token j of the block
 * being the stream's j-th value; a row takes min(512, what is left) tokens of each of its ids.
 * Anything that reads the same trace with the same seed (replay, sim, tests) sees the same
 * tokens, and rows that share leading ids share exactly those tokens.
 *
 * Threads: none of their own; a trace is read-only after parsing, so any number of threads may
 * generate tokens from it at once.
 */
#include "wire/trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/grow.h"
#include "base/rng.h"
#include "kvrouter.h"
#include "wire/json_decode.h"
#include "wire/token_scan.h"
#include "wire/yajl_arena.h"

#define MAX_IDS_PER_ROW ((KVR_TRACE_MAX_INPUT + KVR_TRACE_BLOCK_TOKENS - 1) / KVR_TRACE_BLOCK_TOKENS)

/* ------------------------------------------------------------------------------------------ */
/* Line decoder. */

enum state { S_START, S_TOP_KEY, S_VALUE, S_IDS, S_DONE };

enum field { F_TIMESTAMP, F_INPUT_LENGTH, F_OUTPUT_LENGTH, F_HASH_IDS, F_N_KNOWN,
             F_UNKNOWN = F_N_KNOWN };

static const char *const FIELD_NAMES[F_N_KNOWN] = {"timestamp", "input_length", "output_length",
                                                   "hash_ids"};

/* Row storage while parsing: hash_ids is not yet a pointer (the id array may still move). */
typedef struct parser {
    kvr_jd_skip_t skip;    /* first: the skeleton's (unknown keys' values) */
    kvr_trace_row_t *rows;
    size_t n_rows, cap_rows;
    size_t *id_off;        /* per row: offset of its first id in ids */
    size_t cap_off;
    uint64_t *ids;
    size_t n_ids, cap_ids;

    /* the current line */
    size_t line;
    enum state state;
    int field;
    unsigned seen;
    kvr_trace_row_t row;
    size_t row_off;
    int status;
    char *err;
    size_t err_len;
} parser_t;

static int fail(parser_t *p, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Records the first error as "line N: ..."; returns 0 so callbacks can stop yajl with it. */
static int fail(parser_t *p, int status, const char *fmt, ...)
{
    if (p->status != KVR_OK)
        return 0;
    p->status = status;
    if (p->err != NULL && p->err_len > 0) {
        int n = snprintf(p->err, p->err_len, "line %zu: ", p->line);
        if (n >= 0 && (size_t)n < p->err_len) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(p->err + n, p->err_len - (size_t)n, fmt, ap);
            va_end(ap);
        }
    }
    return 0;
}

static const char *field_rule(int f)
{
    switch (f) {
    case F_TIMESTAMP:
        return "must be an integer >= 0";
    case F_INPUT_LENGTH:
        return "must be an integer in [1, 4194304]";
    case F_OUTPUT_LENGTH:
        return "must be an integer in [1, 4294967295]";
    default:
        return "must be an array of integers";
    }
}

static int unexpected(parser_t *p)
{
    if (p->state == S_START)
        return fail(p, KVR_EPARSE, "expected a JSON object");
    if (p->state == S_VALUE && p->field < F_N_KNOWN)
        return fail(p, KVR_EPARSE, "%s: %s", FIELD_NAMES[p->field], field_rule(p->field));
    if (p->state == S_IDS)
        return fail(p, KVR_EPARSE, "hash_ids[%zu]: not an integer in [0, 18446744073709551615]",
                    p->n_ids - p->row_off);
    return fail(p, KVR_EPARSE, "internal: unexpected value in state %d", (int)p->state);
}

static int value_done(parser_t *p)
{
    p->state = S_TOP_KEY;
    return 1;
}

static int skipped(void *ctx) { return value_done(ctx); }

static int on_null(void *ctx) { return unexpected(ctx); }

static int on_boolean(void *ctx, int v)
{
    (void)v;
    return unexpected(ctx);
}

static int on_string(void *ctx, const unsigned char *str, size_t n)
{
    (void)str;
    (void)n;
    return unexpected(ctx);
}

static int on_number(void *ctx, const char *s, size_t n)
{
    parser_t *p = ctx;
    uint64_t v = 0;
    if (p->state == S_IDS) {
        size_t k = p->n_ids - p->row_off;
        if (!kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v))
            return fail(p, KVR_EPARSE, "hash_ids[%zu]: not an integer in [0, 18446744073709551615]",
                        k);
        if (k >= MAX_IDS_PER_ROW)
            return fail(p, KVR_EINVAL, "hash_ids: more than %u ids",
                        (unsigned)MAX_IDS_PER_ROW);
        if (kvr_grow((void **)&p->ids, &p->cap_ids, p->n_ids + 1, SIZE_MAX, sizeof *p->ids) != KVR_OK)
            return fail(p, KVR_ENOMEM, "hash_ids: out of memory");
        p->ids[p->n_ids++] = v;
        return 1;
    }
    if (p->state != S_VALUE || p->field >= F_N_KNOWN || p->field == F_HASH_IDS)
        return unexpected(p);
    bool ok = kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v);
    switch (p->field) {
    case F_TIMESTAMP:
        if (!ok)
            return fail(p, KVR_EINVAL, "timestamp: %s", field_rule(F_TIMESTAMP));
        p->row.timestamp_ms = v;
        break;
    case F_INPUT_LENGTH:
        if (!ok || v < 1 || v > KVR_TRACE_MAX_INPUT)
            return fail(p, KVR_EINVAL, "input_length: %s", field_rule(F_INPUT_LENGTH));
        p->row.input_length = (uint32_t)v;
        break;
    default: /* F_OUTPUT_LENGTH */
        if (!ok || v < 1 || v > UINT32_MAX)
            return fail(p, KVR_EINVAL, "output_length: %s", field_rule(F_OUTPUT_LENGTH));
        p->row.output_length = (uint32_t)v;
        break;
    }
    return value_done(p);
}

static int on_start_map(void *ctx)
{
    parser_t *p = ctx;
    if (p->state == S_START) {
        p->state = S_TOP_KEY;
        return 1;
    }
    return unexpected(p);
}

static int on_start_array(void *ctx)
{
    parser_t *p = ctx;
    if (p->state == S_VALUE && p->field == F_HASH_IDS) {
        p->state = S_IDS;
        return 1;
    }
    return unexpected(p);
}

static int on_end(void *ctx)
{
    parser_t *p = ctx;
    switch (p->state) {
    case S_TOP_KEY:
        p->state = S_DONE;
        return 1;
    case S_IDS:
        p->state = S_TOP_KEY;
        return 1;
    default:
        return fail(p, KVR_EPARSE, "internal: unexpected end in state %d", (int)p->state);
    }
}

static int on_map_key(void *ctx, const unsigned char *s, size_t n)
{
    parser_t *p = ctx;
    if (p->state != S_TOP_KEY)
        return fail(p, KVR_EPARSE, "internal: unexpected key in state %d", (int)p->state);
    for (int f = 0; f < F_N_KNOWN; f++) {
        if (strlen(FIELD_NAMES[f]) == n && memcmp(FIELD_NAMES[f], s, n) == 0) {
            if (p->seen & (1u << f))
                return fail(p, KVR_EPARSE, "%s: duplicate key", FIELD_NAMES[f]);
            p->seen |= 1u << f;
            p->field = f;
            p->state = S_VALUE;
            return 1;
        }
    }
    kvr_jd_skip_next(&p->skip); /* not ours: the skeleton swallows its value */
    return 1;
}

static const kvr_jd_skip_ops_t SKIP_OPS = {
    .own = KVR_JD_OWN_CALLBACKS,
    .skipped = skipped,
};

/* After a line's object: required keys, the id count, the timestamp order; then keeps it. */
static int finish_row(parser_t *p)
{
    for (int f = 0; f < F_N_KNOWN; f++)
        if (!(p->seen & (1u << f)))
            return fail(p, KVR_EPARSE, "%s: missing", FIELD_NAMES[f]), p->status;
    size_t n_ids = p->n_ids - p->row_off;
    size_t want = (p->row.input_length + KVR_TRACE_BLOCK_TOKENS - 1) / KVR_TRACE_BLOCK_TOKENS;
    if (n_ids != want)
        return fail(p, KVR_EINVAL, "hash_ids: %zu ids for input_length %u (expected %zu)", n_ids,
                    (unsigned)p->row.input_length, want),
               p->status;
    if (p->n_rows > 0 && p->row.timestamp_ms < p->rows[p->n_rows - 1].timestamp_ms)
        return fail(p, KVR_EINVAL, "timestamp goes back (%llu after %llu)",
                    (unsigned long long)p->row.timestamp_ms,
                    (unsigned long long)p->rows[p->n_rows - 1].timestamp_ms),
               p->status;
    if (kvr_grow((void **)&p->rows, &p->cap_rows, p->n_rows + 1, SIZE_MAX, sizeof *p->rows) != KVR_OK ||
        kvr_grow((void **)&p->id_off, &p->cap_off, p->n_rows + 1, SIZE_MAX, sizeof *p->id_off) != KVR_OK)
        return fail(p, KVR_ENOMEM, "out of memory"), p->status;
    p->row.n_hash_ids = (uint32_t)n_ids;
    p->row.hash_ids = NULL;
    p->id_off[p->n_rows] = p->row_off;
    p->rows[p->n_rows++] = p->row;
    return KVR_OK;
}

static int parse_line(parser_t *p, kvr_yajl_arena_t *arena, const char *s, size_t n)
{
    p->state = S_START;
    p->field = F_UNKNOWN;
    kvr_jd_skip_reset(&p->skip, &SKIP_OPS);
    p->seen = 0;
    memset(&p->row, 0, sizeof p->row);
    p->row_off = p->n_ids;
    yajl_handle h = kvr_jd_yajl_open(arena, &kvr_jd_callbacks, p);
    if (h == NULL)
        return fail(p, KVR_ENOMEM, "out of memory"), p->status;
    char msg[KVR_JD_MSG_BYTES];
    yajl_status st = kvr_jd_yajl_finish(h, yajl_parse(h, (const unsigned char *)s, n), 0, n, msg,
                                        sizeof msg);
    if (st == yajl_status_error)
        fail(p, KVR_EPARSE, "%s", msg);
    yajl_free(h);
    if (p->status == KVR_OK && st != yajl_status_ok)
        fail(p, KVR_EPARSE, "invalid JSON");
    if (p->status == KVR_OK && p->state != S_DONE)
        fail(p, KVR_EPARSE, "internal: line ended in state %d", (int)p->state);
    if (p->status != KVR_OK)
        return p->status;
    return finish_row(p);
}

int kvr_trace_parse(const char *text, size_t len, size_t max_rows, kvr_trace_t *out, char *err,
                    size_t err_len)
{
    if (out == NULL)
        return KVR_EINVAL;
    memset(out, 0, sizeof *out);
    if (err != NULL && err_len > 0)
        err[0] = '\0';
    parser_t p = {.err = err, .err_len = err_len};
    if (text == NULL && len > 0)
        return fail(&p, KVR_EINVAL, "no input"), p.status;
    kvr_yajl_arena_t arena;
    kvr_yajl_arena_init(&arena);
    size_t i = 0;
    while (i < len && (max_rows == 0 || p.n_rows < max_rows)) {
        size_t start = i;
        const char *nl = memchr(text + i, '\n', len - i);
        size_t end = nl != NULL ? (size_t)(nl - text) : len;
        i = nl != NULL ? end + 1 : len;
        p.line++;
        if (kvr_jd_blank(text + start, end - start))  /* a line holds no '\n' */
            continue;
        if (parse_line(&p, &arena, text + start, end - start) != KVR_OK)
            break;
    }
    kvr_yajl_arena_deinit(&arena);
    if (p.status != KVR_OK) {
        free(p.rows);
        free(p.id_off);
        free(p.ids);
        return p.status;
    }
    for (size_t r = 0; r < p.n_rows; r++)
        p.rows[r].hash_ids = p.ids + p.id_off[r];
    free(p.id_off);
    out->rows = p.rows;
    out->n_rows = p.n_rows;
    out->ids = p.ids;
    out->n_ids = p.n_ids;
    return KVR_OK;
}

int kvr_trace_load(const char *path, size_t max_rows, kvr_trace_t *out, char *err,
                   size_t err_len)
{
    if (out == NULL)
        return KVR_EINVAL;
    memset(out, 0, sizeof *out);
    FILE *f = path != NULL ? fopen(path, "rb") : NULL;
    if (f == NULL) {
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s: cannot open: %s", path ? path : "(null)",
                     strerror(errno));
        return KVR_EIO;
    }
    size_t cap = (size_t)1 << 20, n = 0;
    char *buf = malloc(cap);
    bool failed = buf == NULL;
    while (!failed) {
        if (n == cap) {
            char *nb = cap <= SIZE_MAX / 2 ? realloc(buf, cap * 2) : NULL;
            if (nb == NULL) {
                failed = true;
                break;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    bool read_error = ferror(f) != 0;
    fclose(f);
    if (failed || read_error) {
        free(buf);
        if (err != NULL && err_len > 0)
            snprintf(err, err_len, "%s: %s", path, failed ? "out of memory" : "read error");
        return failed ? KVR_ENOMEM : KVR_EIO;
    }
    char perr[256] = "";
    int rc = kvr_trace_parse(buf, n, max_rows, out, perr, sizeof perr);
    free(buf);
    if (rc != KVR_OK && err != NULL && err_len > 0)
        snprintf(err, err_len, "%s: %s", path, perr);
    return rc;
}

void kvr_trace_free(kvr_trace_t *t)
{
    if (t == NULL)
        return;
    free(t->rows);
    free(t->ids);
    memset(t, 0, sizeof *t);
}

int kvr_trace_write(FILE *f, const kvr_trace_t *t)
{
    for (size_t i = 0; i < t->n_rows; i++) {
        const kvr_trace_row_t *r = &t->rows[i];
        fprintf(f, "{\"timestamp\":%llu,\"input_length\":%u,\"output_length\":%u,\"hash_ids\":[",
                (unsigned long long)r->timestamp_ms, r->input_length, r->output_length);
        for (uint32_t k = 0; k < r->n_hash_ids; k++)
            fprintf(f, k ? ",%llu" : "%llu", (unsigned long long)r->hash_ids[k]);
        fputs("]}\n", f);
    }
    return fflush(f) == 0 && !ferror(f) ? KVR_OK : KVR_EIO;
}

/* ------------------------------------------------------------------------------------------ */
/* Tokens. */

int kvr_trace_tokens(const kvr_trace_row_t *row, uint64_t seed, uint32_t *out, size_t cap)
{
    if (row == NULL || (out == NULL && row->input_length > 0) ||
        (row->hash_ids == NULL && row->n_hash_ids > 0))
        return KVR_EINVAL;
    if (cap < row->input_length)
        return KVR_ETOOBIG;
    const uint64_t span = KVR_TRACE_TOKEN_HI - KVR_TRACE_TOKEN_LO;
    size_t left = row->input_length, pos = 0;
    for (uint32_t b = 0; b < row->n_hash_ids && left > 0; b++) {
        uint64_t s = row->hash_ids[b] * UINT64_C(0x9E3779B97F4A7C15) ^
                     seed * UINT64_C(0xD1B54A32D192ED03) ^ UINT64_C(0x6B7A1E5C3D2F4A19);
        size_t n = left < KVR_TRACE_BLOCK_TOKENS ? left : KVR_TRACE_BLOCK_TOKENS;
        for (size_t j = 0; j < n; j++)
            out[pos + j] = KVR_TRACE_TOKEN_LO + (uint32_t)(((kvr_splitmix64(&s) >> 32) * span) >> 32);
        pos += n;
        left -= n;
    }
    /* a parsed row always has enough ids; a hand-made one with too few gets the rest from an
     * id-less stream, so the output is always fully written */
    uint64_t s = seed ^ UINT64_C(0xA0761D6478BD642F);
    for (; left > 0; left--)
        out[pos++] = KVR_TRACE_TOKEN_LO + (uint32_t)(((kvr_splitmix64(&s) >> 32) * span) >> 32);
    return KVR_OK;
}
