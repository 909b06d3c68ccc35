/*
 * openai.c: the OpenAI request decoder (see openai.h for the contract; the encoders and the
 * chat template are in openai_encode.c).
 *
 * Structure: a table of known fields (key, enclosing object, type, range, the endpoints that
 * know it) drives a yajl callback state machine, as in wire/api_json.c, with two more levels
 * of known objects (messages[i] and messages[i].content[j]) and a small state for the shapes
 * of "prompt". Scalars land in per-field slots, strings in one buffer by offset (it may move
 * while it grows), ids in growable arrays; finish() checks what the endpoint requires and
 * fills the caller's struct with pointers into the buffers.
 *
 * Invariants: a decode either succeeds with every output consistent (counts within limits,
 * strings valid UTF-8 and NUL-terminated, allowed ids ascending) or fails with d->err naming
 * the first problem and the output zeroed. The fast path feeds yajl the body in pieces, cut
 * where a token array ("prompt" or "token_data") seems to open; when the parser state shows
 * yajl is exactly at the start of that array, wire/token_scan.c reads it and yajl resumes at
 * its ']'. A scan that fails changes nothing (yajl then reads the array); an error anywhere
 * in a body that was cut re-runs it through yajl in one piece, so error messages (byte
 * offsets included) always come from one path.
 * Memory: the decoder owns its buffers (grown geometrically, capped by the limits, reused)
 * and a yajl arena (reset per body). Threads: none of its own.
 * Cost: O(body bytes); key lookup scans the 22-entry table; at most 16 cut attempts per body
 * (so crafted bodies full of "prompt" literals cost no more than yajl alone).
 */
#include "wire/openai.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/grow.h"
#include "base/sort.h"
#include "wire/json_decode.h"
#include "wire/token_scan.h"
#include "wire/yajl_arena.h"

/* ------------------------------------------------------------------------------------------ */
/* The field table. */

#define EB(e) (1u << (e))
#define E_CC (EB(KVR_OAI_COMPLETIONS) | EB(KVR_OAI_CHAT))
#define E_ALL (E_CC | EB(KVR_OAI_TOKENIZE))

enum obj { O_TOP, O_STREAM_OPTIONS, O_NVEXT, O_MESSAGE, O_PART, O_HINTS, O_SESSION, O_IMAGE };

enum type {
    T_STRING,   /* length in [lo, hi], no control characters; lo == 0: "" reads as absent */
    T_PROMPT,   /* string | ids | [string] | [ids] */
    T_MESSAGES, /* array of message objects */
    T_TOKENS,   /* array of u32 */
    T_IDS,      /* array of u64 */
    T_STRINGS,  /* array of strings (extra_fields) */
    T_OBJECT,   /* a known nested object (child obj in lo) */
    T_BOOL,
    T_INT,       /* integer in [lo, hi] */
    T_I32,       /* integer in [INT32_MIN, INT32_MAX] */
    T_DOUBLE,    /* finite */
    T_ONE,       /* n: the integer 1 */
    T_CONTENT,   /* string | array of parts | null */
    T_PART_TYPE, /* "text" or "image_url" */
    T_IMAGE_URL, /* an image part's url: hashed (kvr_hash_mm_identifier), not kept */
    T_TEXT,      /* a content part's text */
};

enum field {
    F_MODEL,
    F_PROMPT,
    F_MESSAGES,
    F_MAX_TOKENS,
    F_MAX_COMPLETION,
    F_STREAM,
    F_STREAM_OPTIONS,
    F_N,
    F_NVEXT,
    F_INCLUDE_USAGE,
    F_TOKEN_DATA,
    F_BACKEND_ID,
    F_PREFILL_ID,
    F_DECODE_ID,
    F_DP_RANK,
    F_PREFILL_DP_RANK,
    F_LORA,
    F_PRIORITY,
    F_EXPECTED,
    F_ALLOWED,
    F_EXTRA,
    F_PRIORITY_JUMP,
    F_HINTS,
    F_H_LATENCY,
    F_H_OSL,
    F_H_PRIORITY,
    F_SESSION,
    F_S_ID,
    F_S_ACTION,
    F_ROLE,
    F_CONTENT,
    F_PART_TYPE,
    F_PART_TEXT,
    F_PART_IMAGE,
    F_IMAGE_URL,
    F_N_FIELDS,
    F_UNKNOWN = F_N_FIELDS,
};

typedef struct field_def {
    const char *key;
    const char *path;   /* for messages (message and part fields get their indices) */
    unsigned char obj;  /* enclosing object */
    unsigned char type;
    unsigned endpoints; /* EB() of the endpoints that know the field */
    uint64_t lo, hi;    /* T_INT range, T_STRING length, T_OBJECT child */
} field_def_t;

#define U32MAX ((uint64_t)UINT32_MAX)

static const field_def_t FIELDS[F_N_FIELDS] = {
    [F_MODEL] = {"model", "model", O_TOP, T_STRING, E_ALL, 0, KVR_OAI_MAX_NAME_BYTES},
    [F_PROMPT] = {"prompt", "prompt", O_TOP, T_PROMPT,
                  EB(KVR_OAI_COMPLETIONS) | EB(KVR_OAI_TOKENIZE), 0, 0},
    [F_MESSAGES] = {"messages", "messages", O_TOP, T_MESSAGES,
                    EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), 0, 0},
    [F_MAX_TOKENS] = {"max_tokens", "max_tokens", O_TOP, T_INT, E_CC, 1, U32MAX},
    [F_MAX_COMPLETION] = {"max_completion_tokens", "max_completion_tokens", O_TOP, T_INT,
                          EB(KVR_OAI_CHAT), 1, U32MAX},
    [F_STREAM] = {"stream", "stream", O_TOP, T_BOOL, E_CC, 0, 0},
    [F_STREAM_OPTIONS] = {"stream_options", "stream_options", O_TOP, T_OBJECT, E_CC,
                          O_STREAM_OPTIONS, 0},
    [F_N] = {"n", "n", O_TOP, T_ONE, E_CC, 1, 1},
    [F_NVEXT] = {"nvext", "nvext", O_TOP, T_OBJECT, E_CC, O_NVEXT, 0},
    [F_INCLUDE_USAGE] = {"include_usage", "stream_options.include_usage", O_STREAM_OPTIONS, T_BOOL,
                         E_CC, 0, 0},
    [F_TOKEN_DATA] = {"token_data", "nvext.token_data", O_NVEXT, T_TOKENS, E_CC, 0, 0},
    [F_PREFILL_ID] = {"prefill_worker_id", "nvext.prefill_worker_id", O_NVEXT, T_INT, E_CC, 0,
                      UINT64_MAX},
    [F_DECODE_ID] = {"decode_worker_id", "nvext.decode_worker_id", O_NVEXT, T_INT, E_CC, 0,
                     UINT64_MAX},
    [F_BACKEND_ID] = {"backend_instance_id", "nvext.backend_instance_id", O_NVEXT, T_INT, E_CC, 0,
                      UINT64_MAX},
    [F_DP_RANK] = {"dp_rank", "nvext.dp_rank", O_NVEXT, T_INT, E_CC, 0, U32MAX},
    [F_PREFILL_DP_RANK] = {"prefill_dp_rank", "nvext.prefill_dp_rank", O_NVEXT, T_INT, E_CC, 0,
                           U32MAX},
    [F_LORA] = {"lora_name", "nvext.lora_name", O_NVEXT, T_STRING, E_CC, 0, KVR_OAI_MAX_NAME_BYTES},
    [F_PRIORITY] = {"priority", "nvext.priority", O_NVEXT, T_I32, E_CC, 0, 0},
    [F_PRIORITY_JUMP] = {"priority_jump", "nvext.priority_jump", O_NVEXT, T_DOUBLE, E_CC, 0, 0},
    [F_HINTS] = {"agent_hints", "nvext.agent_hints", O_NVEXT, T_OBJECT, E_CC, O_HINTS, 0},
    [F_H_LATENCY] = {"latency_sensitivity", "nvext.agent_hints.latency_sensitivity", O_HINTS,
                     T_DOUBLE, E_CC, 0, 0},
    [F_H_OSL] = {"osl", "nvext.agent_hints.osl", O_HINTS, T_INT, E_CC, 0, U32MAX},
    [F_H_PRIORITY] = {"priority", "nvext.agent_hints.priority", O_HINTS, T_I32, E_CC, 0, 0},
    [F_SESSION] = {"session_control", "nvext.session_control", O_NVEXT, T_OBJECT, E_CC, O_SESSION,
                   0},
    [F_S_ID] = {"session_id", "nvext.session_control.session_id", O_SESSION, T_STRING, E_CC, 1,
                KVR_OAI_MAX_SESSION_BYTES},
    [F_S_ACTION] = {"action", "nvext.session_control.action", O_SESSION, T_STRING, E_CC, 1, 16},
    [F_EXPECTED] = {"expected_output_tokens", "nvext.expected_output_tokens", O_NVEXT, T_INT, E_CC,
                    0, U32MAX},
    [F_ALLOWED] = {"allowed_worker_ids", "nvext.allowed_worker_ids", O_NVEXT, T_IDS, E_CC, 0, 0},
    [F_EXTRA] = {"extra_fields", "nvext.extra_fields", O_NVEXT, T_STRINGS, E_CC, 0, 0},
    [F_ROLE] = {"role", "role", O_MESSAGE, T_STRING, EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), 1,
                KVR_OAI_MAX_ROLE_BYTES},
    [F_CONTENT] = {"content", "content", O_MESSAGE, T_CONTENT,
                   EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), 0, 0},
    [F_PART_TYPE] = {"type", "type", O_PART, T_PART_TYPE, EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE),
                     0, 0},
    [F_PART_TEXT] = {"text", "text", O_PART, T_TEXT, EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), 0, 0},
    [F_PART_IMAGE] = {"image_url", "image_url", O_PART, T_OBJECT,
                      EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), O_IMAGE, 0},
    [F_IMAGE_URL] = {"url", "url", O_IMAGE, T_IMAGE_URL, EB(KVR_OAI_CHAT) | EB(KVR_OAI_TOKENIZE), 0,
                     0},
};

#define BIT(f) ((uint64_t)1 << (f))
#define MESSAGE_BITS (BIT(F_ROLE) | BIT(F_CONTENT))
#define PART_BITS (BIT(F_PART_TYPE) | BIT(F_PART_TEXT) | BIT(F_PART_IMAGE) | BIT(F_IMAGE_URL))

const char *kvr_oai_endpoint_name(kvr_oai_endpoint_t e)
{
    switch (e) {
    case KVR_OAI_COMPLETIONS:
        return "completions";
    case KVR_OAI_CHAT:
        return "chat";
    case KVR_OAI_TOKENIZE:
        return "tokenize";
    default:
        return "unknown";
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Decoder state. */

enum state {
    S_START,      /* before the top-level value */
    S_KEY,        /* in known object d->obj, expecting a key or its end */
    S_VALUE,      /* expecting the value of d->field */
    S_PROMPT_ARR, /* in prompt's array, its shape not known yet (prompt_elems elements seen) */
    S_TOKENS,     /* in a token array: prompt's (d->field F_PROMPT) or token_data's */
    S_IDS,        /* in allowed_worker_ids */
    S_STRINGS,    /* in extra_fields */
    S_MESSAGES,   /* in messages, expecting a message object or the end */
    S_PARTS,      /* in messages[i].content, expecting a part object or the end */
    S_DONE,       /* after the top-level object */
};

enum shape { P_NONE, P_TEXT, P_TOKENS };

typedef struct str_ref {
    size_t off, len;  /* in str_buf, NUL-terminated */
} str_ref_t;

typedef struct msg_ref {
    str_ref_t role, content;
    unsigned n_texts; /* text parts read (joined by "\n", as vLLM joins them) */
} msg_ref_t;

struct kvr_oai_decoder {
    kvr_jd_skip_t skip; /* first: the JSON skeleton's (unknown keys' values) */
    kvr_oai_options_t opts;
    char err[256];

    int endpoint, status;
    int state, obj, field;
    uint64_t seen;    /* bit per field: key given (message and part bits per object) */
    uint64_t present; /* bit per field: non-null value given */
    bool part_image;  /* the content part being read is an image */
    uint64_t *img;    /* the images' hashes, in order of appearance */
    size_t n_img, img_cap;

    uint64_t ival[F_N_FIELDS];
    double dval[F_N_FIELDS];
    bool bval[F_N_FIELDS];
    str_ref_t sval[F_N_FIELDS];

    int prompt_shape;
    unsigned prompt_elems;
    bool tok_nested;    /* S_TOKENS of prompt: inside [[...]] */
    size_t tok_open_at; /* body offset just after the '[' of the last token array opened */
    size_t base;        /* body offset of the piece yajl is parsing */

    uint32_t *ptok;     /* prompt ids */
    size_t ptok_cap, n_ptok;
    uint32_t *ttok;     /* nvext.token_data */
    size_t ttok_cap, n_ttok;
    uint64_t *ids;
    size_t ids_cap, n_ids;
    size_t n_extra;
    bool want_worker_id, want_timing;
    char *str_buf;
    size_t str_cap, str_len;
    char *num_buf;
    size_t num_cap;

    msg_ref_t *msgs;
    size_t msgs_cap, n_msgs;
    kvr_oai_message_t *msg_out;
    size_t msg_out_cap;
    size_t part_idx;       /* index of the current part in messages[n_msgs].content */
    size_t content_total;  /* bytes of all contents so far */

    kvr_oai_stats_t stats;
    kvr_yajl_arena_t arena;
    yajl_handle yh;
};

/* Records the first error; `return fail(...)` stops yajl (see kvr_jd_fail). */
#define fail(d, st, ...) kvr_jd_fail(&(d)->status, (d)->err, sizeof (d)->err, (st), __VA_ARGS__)

/* The field's name in messages: message and part fields with their indices. */
static const char *where(const kvr_oai_decoder_t *d, int f, char *buf, size_t n)
{
    switch (FIELDS[f].obj) {
    case O_MESSAGE:
        snprintf(buf, n, "messages[%zu].%s", d->n_msgs, FIELDS[f].key);
        return buf;
    case O_PART:
        snprintf(buf, n, "messages[%zu].content[%zu].%s", d->n_msgs, d->part_idx,
                 FIELDS[f].key);
        return buf;
    case O_IMAGE:
        snprintf(buf, n, "messages[%zu].content[%zu].image_url.%s", d->n_msgs, d->part_idx,
                 FIELDS[f].key);
        return buf;
    default:
        return FIELDS[f].path;
    }
}

/* Reads JSON number text as a finite double; false after fail() when out of memory. */
static bool parse_double(kvr_oai_decoder_t *d, const char *s, size_t n, double *out)
{
    int rc = kvr_jd_parse_double(s, n, &d->num_buf, &d->num_cap, out);
    if (rc == KVR_ENOMEM)
        fail(d, KVR_ENOMEM, "out of memory");
    return rc == KVR_OK;
}

/* Appends s[0..n) to str_buf (no NUL). */
static bool append(kvr_oai_decoder_t *d, const unsigned char *s, size_t n)
{
    if (n > SIZE_MAX / 4 ||
        kvr_grow((void **)&d->str_buf, &d->str_cap, d->str_len + n + 1, SIZE_MAX, 1) != KVR_OK) {
        fail(d, KVR_ENOMEM, "out of memory");
        return false;
    }
    if (n > 0)
        memcpy(d->str_buf + d->str_len, s, n);
    d->str_len += n;
    return true;
}

/* Appends s[0..n) and a NUL to str_buf; *ref names it. */
static bool store_str(kvr_oai_decoder_t *d, const unsigned char *s, size_t n, str_ref_t *ref)
{
    size_t off = d->str_len;
    if (!append(d, s, n) || !append(d, (const unsigned char *)"", 1))
        return false;
    ref->off = off;
    ref->len = n;
    return true;
}

static void mark(kvr_oai_decoder_t *d, int f)
{
    d->present |= BIT(f);
}

static bool has(const kvr_oai_decoder_t *d, int f)
{
    return (d->present & BIT(f)) != 0;
}

/* After a value of a known object. */
static int value_done(kvr_oai_decoder_t *d)
{
    d->state = S_KEY;
    return 1;
}

static const char *PROMPT_TYPE =
    "prompt: must be a string, an array of token ids, or a one-element array of either";

/* A value of the wrong type where the current state expects something specific. */
static int unexpected(kvr_oai_decoder_t *d)
{
    char w[96];
    switch (d->state) {
    case S_START:
        return fail(d, KVR_EPARSE, "expected a JSON object");
    case S_PROMPT_ARR:
        if (d->prompt_elems > 0)
            return fail(d, KVR_EINVAL, "prompt: batched prompts are not supported");
        return fail(d, KVR_EINVAL, "prompt[0]: must be a string or an array of token ids");
    case S_TOKENS:
        if (d->field == F_PROMPT)
            return fail(d, KVR_EINVAL, "prompt%s[%zu]: not an integer in [0, 4294967295]",
                        d->tok_nested ? "[0]" : "", d->n_ptok);
        return fail(d, KVR_EINVAL, "nvext.token_data[%zu]: not an integer in [0, 4294967295]",
                    d->n_ttok);
    case S_IDS:
        return fail(d, KVR_EINVAL,
                    "nvext.allowed_worker_ids[%zu]: not an integer in [0, 18446744073709551615]",
                    d->n_ids);
    case S_STRINGS:
        return fail(d, KVR_EINVAL, "nvext.extra_fields[%zu]: must be a string", d->n_extra);
    case S_MESSAGES:
        return fail(d, KVR_EINVAL, "messages[%zu]: must be an object", d->n_msgs);
    case S_PARTS:
        return fail(d, KVR_EINVAL, "messages[%zu].content[%zu]: must be an object", d->n_msgs,
                    d->part_idx);
    case S_VALUE:
        break;
    default:
        return fail(d, KVR_EPARSE, "internal: unexpected value in state %d", d->state);
    }
    if (d->field >= F_N_FIELDS)
        return fail(d, KVR_EPARSE, "internal: unexpected value for an unknown key");
    const field_def_t *f = &FIELDS[d->field];
    const char *p = where(d, d->field, w, sizeof w);
    switch (f->type) {
    case T_STRING:
        return fail(d, KVR_EINVAL, "%s: must be a string or null", p);
    case T_PROMPT:
        if (d->endpoint == KVR_OAI_TOKENIZE)
            return fail(d, KVR_EINVAL, "prompt: must be a string");
        return fail(d, KVR_EINVAL, "%s", PROMPT_TYPE);
    case T_MESSAGES:
        return fail(d, KVR_EINVAL, "messages: must be an array of message objects");
    case T_TOKENS:
        return fail(d, KVR_EINVAL, "%s: must be an array of integers or null", p);
    case T_IDS:
        return fail(d, KVR_EINVAL, "%s: must be an array of integers or null", p);
    case T_STRINGS:
        return fail(d, KVR_EINVAL, "%s: must be an array of strings or null", p);
    case T_OBJECT:
        return fail(d, KVR_EINVAL, "%s: must be an object or null", p);
    case T_BOOL:
        return fail(d, KVR_EINVAL, "%s: must be true, false or null", p);
    case T_INT:
        return fail(d, KVR_EINVAL, "%s: not an integer in [%" PRIu64 ", %" PRIu64 "]", p, f->lo,
                    f->hi);
    case T_I32:
        return fail(d, KVR_EINVAL, "%s: not an integer in [%d, %d]", p, INT32_MIN, INT32_MAX);
    case T_DOUBLE:
        return fail(d, KVR_EINVAL, "%s: must be a finite number", p);
    case T_ONE:
        return fail(d, KVR_EINVAL, "%s: only 1 is supported", p);
    case T_CONTENT:
        return fail(d, KVR_EINVAL, "%s: must be a string, an array of content parts or null", p);
    case T_PART_TYPE:
    case T_TEXT:
    case T_IMAGE_URL:
        return fail(d, KVR_EINVAL, "%s: must be a string or null", p);
    default:
        return fail(d, KVR_EPARSE, "internal: unexpected value for %s", p);
    }
}

static int skipped(void *ctx) { return value_done(ctx); }

/* Nesting of the known object the parser is in (the top-level object is 1). */
static unsigned obj_depth(int obj)
{
    switch (obj) {
    case O_TOP:
        return 1;
    case O_STREAM_OPTIONS:
    case O_NVEXT:
        return 2;
    case O_MESSAGE:
    case O_HINTS:
    case O_SESSION:
        return 3;
    case O_IMAGE:
        return 6; /* {"messages": [{"content": [{"image_url": { */
    default:
        return 5;  /* {"messages": [{"content": [{ */
    }
}

static unsigned own_depth(const void *ctx)
{
    const kvr_oai_decoder_t *d = ctx;
    return obj_depth(d->obj);
}

static int too_deep(void *ctx)
{
    return fail((kvr_oai_decoder_t *)ctx, KVR_EINVAL, "nesting deeper than %d levels",
                KVR_OAI_MAX_DEPTH);
}

static int push_token(kvr_oai_decoder_t *d, uint64_t v)
{
    bool prompt = d->field == F_PROMPT;
    uint32_t **buf = prompt ? &d->ptok : &d->ttok;
    size_t *cap = prompt ? &d->ptok_cap : &d->ttok_cap, *n = prompt ? &d->n_ptok : &d->n_ttok;
    if (*n == *cap && kvr_grow((void **)buf, cap, *n + 1, d->opts.max_tokens, sizeof **buf) != KVR_OK) {
        if (*n >= d->opts.max_tokens)
            return fail(d, KVR_ETOOBIG, "%s: more than %zu tokens", FIELDS[d->field].path,
                        d->opts.max_tokens);
        return fail(d, KVR_ENOMEM, "%s: out of memory", FIELDS[d->field].path);
    }
    (*buf)[(*n)++] = (uint32_t)v;
    return 1;
}

static int on_null(void *ctx)
{
    kvr_oai_decoder_t *d = ctx;
    if (d->state == S_VALUE)
        return value_done(d);  /* null = absent; finish() rejects a missing required field */
    return unexpected(d);
}

static int on_boolean(void *ctx, int v)
{
    kvr_oai_decoder_t *d = ctx;
    if (d->state == S_VALUE && FIELDS[d->field].type == T_BOOL) {
        d->bval[d->field] = v != 0;
        mark(d, d->field);
        return value_done(d);
    }
    return unexpected(d);
}

static int on_number(void *ctx, const char *s, size_t n)
{
    kvr_oai_decoder_t *d = ctx;
    uint64_t v;
    double x;
    switch (d->state) {
    case S_PROMPT_ARR:
        if (d->prompt_elems > 0)
            break;
        d->prompt_shape = P_TOKENS;  /* [1, 2, ...]: the array is the ids */
        d->tok_nested = false;
        d->state = S_TOKENS;
        /* fall through */
    case S_TOKENS:
        if (!kvr_jd_parse_u64(s, n, 0, UINT32_MAX, &v))
            return unexpected(d);
        return push_token(d, v);
    case S_IDS:
        if (!kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v))
            return unexpected(d);
        if (d->n_ids == d->ids_cap &&
            kvr_grow((void **)&d->ids, &d->ids_cap, d->n_ids + 1, d->opts.max_allowed_ids,
                  sizeof *d->ids) != KVR_OK) {
            if (d->n_ids >= d->opts.max_allowed_ids)
                return fail(d, KVR_ETOOBIG, "nvext.allowed_worker_ids: more than %zu ids",
                            d->opts.max_allowed_ids);
            return fail(d, KVR_ENOMEM, "nvext.allowed_worker_ids: out of memory");
        }
        d->ids[d->n_ids++] = v;
        return 1;
    case S_VALUE: {
        const field_def_t *f = &FIELDS[d->field];
        if (f->type == T_INT || f->type == T_ONE) {
            if (!kvr_jd_parse_u64(s, n, f->lo, f->hi, &v))
                return unexpected(d);
            d->ival[d->field] = v;
        } else if (f->type == T_I32) {
            bool neg;
            if (!kvr_jd_parse_int(s, n, &v, &neg) ||
                v > (neg ? (uint64_t)INT32_MAX + 1 : INT32_MAX))
                return unexpected(d);
            d->ival[d->field] = neg ? (uint64_t)(-(int64_t)v) : v;
        } else if (f->type == T_DOUBLE) {
            if (!parse_double(d, s, n, &x))
                return d->status != KVR_OK ? 0 : unexpected(d);
            d->dval[d->field] = x;
        } else {
            break;
        }
        mark(d, d->field);
        return value_done(d);
    }
    default:
        break;
    }
    return unexpected(d);
}

/* The prompt as a string (top level, or the one element of its array). */
static int prompt_text(kvr_oai_decoder_t *d, const unsigned char *s, size_t n)
{
    if (n > d->opts.max_text_bytes)
        return fail(d, KVR_ETOOBIG, "prompt: longer than %zu bytes", d->opts.max_text_bytes);
    if (!kvr_jd_utf8_ok(s, n))
        return fail(d, KVR_EINVAL, "prompt: is not valid UTF-8");
    if (!store_str(d, s, n, &d->sval[F_PROMPT]))
        return 0;
    d->prompt_shape = P_TEXT;
    return 1;
}

/* Message content text (a string, or one part's text): checked and appended. */
static int content_text(kvr_oai_decoder_t *d, const char *path, const unsigned char *s, size_t n)
{
    if (n > d->opts.max_text_bytes - d->content_total)
        return fail(d, KVR_ETOOBIG, "messages: contents longer than %zu bytes in total",
                    d->opts.max_text_bytes);
    if (!kvr_jd_utf8_ok(s, n))
        return fail(d, KVR_EINVAL, "%s: is not valid UTF-8", path);
    d->content_total += n;
    return append(d, s, n) ? 1 : 0;
}

static int on_string(void *ctx, const unsigned char *s, size_t n)
{
    kvr_oai_decoder_t *d = ctx;
    char w[96];
    switch (d->state) {
    case S_PROMPT_ARR:
        if (d->prompt_elems > 0)
            return unexpected(d);
        d->prompt_elems = 1;
        return prompt_text(d, s, n);
    case S_STRINGS:
        if (n == 9 && memcmp(s, "worker_id", 9) == 0)
            d->want_worker_id = true;
        else if (n == 6 && memcmp(s, "timing", 6) == 0)
            d->want_timing = true;
        d->n_extra++;
        return 1;
    case S_VALUE:
        break;
    default:
        return unexpected(d);
    }
    int fi = d->field;
    const field_def_t *f = &FIELDS[fi];
    const char *p = where(d, fi, w, sizeof w);
    switch (f->type) {
    case T_STRING: {
        if (n < f->lo || n > f->hi) {
            if (f->lo == 0)
                return fail(d, KVR_EINVAL, "%s: longer than %" PRIu64 " bytes", p, f->hi);
            return fail(d, KVR_EINVAL, "%s: must be %" PRIu64 " to %" PRIu64 " bytes", p, f->lo,
                        f->hi);
        }
        const char *problem = kvr_jd_text_problem(s, n);
        if (problem != NULL)
            return fail(d, KVR_EINVAL, "%s: %s", p, problem);
        if (n == 0)
            return value_done(d);  /* "" names nothing: absent */
        if (!store_str(d, s, n, &d->sval[fi]))
            return 0;
        break;
    }
    case T_PROMPT:
        if (!prompt_text(d, s, n))
            return 0;
        break;
    case T_CONTENT: {
        msg_ref_t *m = &d->msgs[d->n_msgs];
        m->content.off = d->str_len;
        if (!content_text(d, p, s, n) || !append(d, (const unsigned char *)"", 1))
            return 0;
        m->content.len = n;
        break;
    }
    case T_PART_TYPE:
        d->part_image = n == 9 && memcmp(s, "image_url", 9) == 0;
        if (!d->part_image && (n != 4 || memcmp(s, "text", 4) != 0)) {
            char shown[KVR_JD_CLIP_BYTES];
            kvr_jd_clip(shown, sizeof shown, s, n);
            return fail(d, KVR_EINVAL,
                        "%s: unsupported content part type '%s' (text or "
                        "image_url)",
                        p, shown);
        }
        break;
    case T_IMAGE_URL:
        if (n == 0)
            return fail(d, KVR_EINVAL, "%s: must not be empty", p);
        if (d->n_img == d->img_cap && kvr_grow((void **)&d->img, &d->img_cap, d->n_img + 1,
                                               KVR_OAI_MAX_IMAGES, sizeof *d->img) != KVR_OK)
            return fail(d, d->n_img >= KVR_OAI_MAX_IMAGES ? KVR_ETOOBIG : KVR_ENOMEM,
                        "messages: more than %d images", KVR_OAI_MAX_IMAGES);
        (void)kvr_hash_mm_identifier((const char *)s, n, true, &d->img[d->n_img++]);
        break;
    case T_TEXT: {
        msg_ref_t *m = &d->msgs[d->n_msgs];
        if (m->n_texts++ > 0 && !content_text(d, p, (const unsigned char *)"\n", 1))
            return 0;
        if (!content_text(d, p, s, n))
            return 0;
        break;
    }
    default:
        return unexpected(d);
    }
    mark(d, fi);
    return value_done(d);
}

/* A message object opens in messages. */
static int message_begin(kvr_oai_decoder_t *d)
{
    if (d->n_msgs >= d->opts.max_messages)
        return fail(d, KVR_ETOOBIG, "messages: more than %zu messages", d->opts.max_messages);
    if (d->n_msgs == d->msgs_cap &&
        kvr_grow((void **)&d->msgs, &d->msgs_cap, d->n_msgs + 1, d->opts.max_messages,
              sizeof *d->msgs) != KVR_OK)
        return fail(d, KVR_ENOMEM, "messages: out of memory");
    memset(&d->msgs[d->n_msgs], 0, sizeof d->msgs[d->n_msgs]);
    d->seen &= ~MESSAGE_BITS;
    d->present &= ~MESSAGE_BITS;
    d->obj = O_MESSAGE;
    d->state = S_KEY;
    return 1;
}

/* "f: missing" or "f: must not be null" for a required field not given. */
static int missing(kvr_oai_decoder_t *d, int f)
{
    char w[96];
    const char *p = where(d, f, w, sizeof w);
    if (d->seen & BIT(f))
        return fail(d, KVR_EINVAL, "%s: must not be null", p);
    return fail(d, KVR_EINVAL, "%s: missing", p);
}

static int message_end(kvr_oai_decoder_t *d)
{
    if (!has(d, F_ROLE))
        return missing(d, F_ROLE);
    msg_ref_t *m = &d->msgs[d->n_msgs];
    m->role = d->sval[F_ROLE];
    if (!has(d, F_CONTENT)) {  /* null or absent: "" */
        m->content.off = d->str_len;
        m->content.len = 0;
        if (!append(d, (const unsigned char *)"", 1))
            return 0;
    }
    d->n_msgs++;
    d->obj = O_TOP;
    d->state = S_MESSAGES;
    return 1;
}

static int part_end(kvr_oai_decoder_t *d)
{
    if (!has(d, F_PART_TYPE))
        return missing(d, F_PART_TYPE);
    if (d->part_image ? !has(d, F_IMAGE_URL) : !has(d, F_PART_TEXT))
        return missing(d, d->part_image ? F_IMAGE_URL : F_PART_TEXT);
    if (d->part_image && has(d, F_PART_TEXT))
        return fail(d, KVR_EINVAL, "messages[%zu].content[%zu]: an image_url part has no text",
                    d->n_msgs, d->part_idx);
    d->part_image = false;
    d->part_idx++;
    d->obj = O_MESSAGE;
    d->state = S_PARTS;
    return 1;
}

static int on_start_map(void *ctx)
{
    kvr_oai_decoder_t *d = ctx;
    switch (d->state) {
    case S_START:
        d->state = S_KEY;
        d->obj = O_TOP;
        return 1;
    case S_MESSAGES:
        return message_begin(d);
    case S_PARTS:
        d->seen &= ~PART_BITS;
        d->present &= ~PART_BITS;
        d->obj = O_PART;
        d->state = S_KEY;
        return 1;
    case S_VALUE:
        if (FIELDS[d->field].type == T_OBJECT) {
            mark(d, d->field);
            d->obj = (int)FIELDS[d->field].lo;
            d->state = S_KEY;
            return 1;
        }
        break;
    default:
        break;
    }
    return unexpected(d);
}

static int on_start_array(void *ctx)
{
    kvr_oai_decoder_t *d = ctx;
    switch (d->state) {
    case S_PROMPT_ARR:
        if (d->prompt_elems > 0)
            return unexpected(d);
        d->prompt_elems = 1;
        d->prompt_shape = P_TOKENS;
        d->tok_nested = true;
        d->tok_open_at = d->base + yajl_get_bytes_consumed(d->yh);
        d->state = S_TOKENS;
        return 1;
    case S_VALUE:
        break;
    default:
        return unexpected(d);
    }
    switch (FIELDS[d->field].type) {
    case T_PROMPT:
        if (d->endpoint == KVR_OAI_TOKENIZE)
            return unexpected(d);
        d->prompt_elems = 0;
        d->tok_open_at = d->base + yajl_get_bytes_consumed(d->yh);
        d->state = S_PROMPT_ARR;
        break;
    case T_TOKENS:
        d->tok_nested = false;
        d->tok_open_at = d->base + yajl_get_bytes_consumed(d->yh);
        d->state = S_TOKENS;
        break;
    case T_IDS:
        d->state = S_IDS;
        break;
    case T_STRINGS:
        d->state = S_STRINGS;
        break;
    case T_MESSAGES:
        d->state = S_MESSAGES;
        break;
    case T_CONTENT:
        d->msgs[d->n_msgs].content.off = d->str_len;
        d->part_idx = 0;
        d->state = S_PARTS;
        break;
    default:
        return unexpected(d);
    }
    mark(d, d->field);
    return 1;
}

/* Closes a container: yajl guarantees map/array pairing, so only the state matters. */
static int on_end(void *ctx)
{
    kvr_oai_decoder_t *d = ctx;
    switch (d->state) {
    case S_KEY:
        switch (d->obj) {
        case O_TOP:
            d->state = S_DONE;
            return 1;
        case O_MESSAGE:
            return message_end(d);
        case O_PART:
            return part_end(d);
        case O_IMAGE:
            d->obj = O_PART; /* image_url sits in its content part */
            return 1;
        case O_HINTS:
        case O_SESSION:
            d->obj = O_NVEXT; /* agent_hints and session_control sit in nvext */
            return 1;
        default:
            d->obj = O_TOP;  /* stream_options and nvext sit in the top level */
            return 1;
        }
    case S_PROMPT_ARR:
        if (d->prompt_elems == 0)
            d->prompt_shape = P_TOKENS;  /* [] */
        return value_done(d);
    case S_TOKENS:
        if (d->field == F_PROMPT && d->tok_nested) {
            d->state = S_PROMPT_ARR;
            return 1;
        }
        return value_done(d);
    case S_IDS:
    case S_STRINGS:
    case S_MESSAGES:
        return value_done(d);
    case S_PARTS: {
        msg_ref_t *m = &d->msgs[d->n_msgs];
        m->content.len = d->str_len - m->content.off;
        if (!append(d, (const unsigned char *)"", 1))
            return 0;
        return value_done(d);
    }
    default:
        return fail(d, KVR_EPARSE, "internal: unexpected end in state %d", d->state);
    }
}

/* The reference's routing hints this router does not act on: a request naming one is refused
 * (400, the hint and what to do instead named), never served as if it were not there. */
typedef struct refused_key {
    unsigned char obj;
    const char *key, *path, *why;
} refused_key_t;

static const refused_key_t REFUSED[] = {
    {O_NVEXT, "routing_constraints", "nvext.routing_constraints",
     "taint constraints are taken by POST /v1/route (routing_constraints), not through the "
     "OpenAI front end; restrict the workers with nvext.allowed_worker_ids instead"},
    {O_NVEXT, "router_config_override", "nvext.router_config_override",
     "per-request cost overrides are taken by POST /v1/route (router_config_override), not "
     "through the OpenAI front end"},
    {O_TOP, "router_config_override", "router_config_override",
     "per-request cost overrides are taken by POST /v1/route (router_config_override), not "
     "through the OpenAI front end"},
    {O_NVEXT, "annotations", "nvext.annotations",
     "annotations are not supported (for query_instance_id, the choice without running the "
     "request, call POST /v1/query)"},
    {O_HINTS, "strict_priority", "nvext.agent_hints.strict_priority",
     "strict priority is not supported by the front end's queue (POST /router takes it); "
     "nvext.priority_jump gives a head start"},
};

static const refused_key_t *refused(int obj, const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < sizeof REFUSED / sizeof REFUSED[0]; i++)
        if (REFUSED[i].obj == obj && strlen(REFUSED[i].key) == n &&
            memcmp(REFUSED[i].key, s, n) == 0)
            return &REFUSED[i];
    return NULL;
}

static int on_map_key(void *ctx, const unsigned char *s, size_t n)
{
    kvr_oai_decoder_t *d = ctx;
    if (d->state != S_KEY)
        return fail(d, KVR_EPARSE, "internal: unexpected key in state %d", d->state);
    unsigned eb = EB(d->endpoint);
    for (int f = 0; f < F_N_FIELDS; f++) {
        const field_def_t *def = &FIELDS[f];
        if (def->obj != d->obj || !(def->endpoints & eb) || strlen(def->key) != n ||
            memcmp(def->key, s, n) != 0)
            continue;
        if (d->seen & BIT(f)) {
            char w[96];
            return fail(d, KVR_EINVAL, "%s: duplicate key", where(d, f, w, sizeof w));
        }
        d->seen |= BIT(f);
        d->field = f;
        d->state = S_VALUE;
        return 1;
    }
    const refused_key_t *r = d->endpoint != KVR_OAI_TOKENIZE ? refused(d->obj, s, n) : NULL;
    if (r != NULL)
        return fail(d, KVR_EINVAL, "%s: %s", r->path, r->why);
    kvr_jd_skip_next(&d->skip); /* not ours: the skeleton swallows its value */
    return 1;
}

static const kvr_jd_skip_ops_t SKIP_OPS = {
    .own = KVR_JD_OWN_CALLBACKS,
    .skipped = skipped,
    .depth = own_depth,
    .max_depth = KVR_OAI_MAX_DEPTH,
    .too_deep = too_deep,
};

/* ------------------------------------------------------------------------------------------ */
/* Decoding. */

kvr_oai_decoder_t *kvr_oai_decoder_new(const kvr_oai_options_t *opts)
{
    kvr_oai_options_t o = {
        .max_tokens = KVR_OAI_MAX_TOKENS,
        .max_text_bytes = KVR_OAI_MAX_TEXT_BYTES,
        .max_messages = KVR_OAI_MAX_MESSAGES,
        .max_allowed_ids = KVR_OAI_MAX_ALLOWED_IDS,
        .no_fast_path = false,
    };
    if (opts != NULL) {
        o = *opts;
        if (o.max_tokens > KVR_OAI_MAX_TOKENS || o.max_text_bytes > KVR_OAI_MAX_TEXT_BYTES ||
            o.max_messages > KVR_OAI_MAX_MESSAGES ||
            o.max_allowed_ids > KVR_OAI_MAX_ALLOWED_IDS)
            return NULL;
    }
    kvr_oai_decoder_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->opts = o;
    kvr_yajl_arena_init(&d->arena);
    return d;
}

void kvr_oai_decoder_free(kvr_oai_decoder_t *d)
{
    if (d == NULL)
        return;
    free(d->ptok);
    free(d->ttok);
    free(d->ids);
    free(d->str_buf);
    free(d->num_buf);
    free(d->msgs);
    free(d->msg_out);
    free(d->img);
    kvr_yajl_arena_deinit(&d->arena);
    free(d);
}

const char *kvr_oai_decoder_error(const kvr_oai_decoder_t *d)
{
    return d->err;
}

void kvr_oai_decoder_stats(const kvr_oai_decoder_t *d, kvr_oai_stats_t *out)
{
    *out = d->stats;
}

static void reset(kvr_oai_decoder_t *d, int endpoint)
{
    d->err[0] = '\0';
    d->endpoint = endpoint;
    d->status = KVR_OK;
    d->state = S_START;
    d->obj = O_TOP;
    d->field = F_UNKNOWN;
    kvr_jd_skip_reset(&d->skip, &SKIP_OPS);
    d->seen = 0;
    d->present = 0;
    d->prompt_shape = P_NONE;
    d->prompt_elems = 0;
    d->tok_nested = false;
    d->tok_open_at = SIZE_MAX;
    d->base = 0;
    d->n_ptok = 0;
    d->n_ttok = 0;
    d->n_ids = 0;
    d->n_extra = 0;
    d->want_worker_id = false;
    d->want_timing = false;
    d->str_len = 0;
    d->n_msgs = 0;
    d->part_idx = 0;
    d->n_img = 0;
    d->part_image = false;
    d->content_total = 0;
}

static yajl_handle start_yajl(kvr_oai_decoder_t *d)
{
    d->yh = kvr_jd_yajl_open(&d->arena, &kvr_jd_callbacks, d);
    if (d->yh == NULL)
        fail(d, KVR_ENOMEM, "out of memory");
    return d->yh;
}

static void stop_yajl(kvr_oai_decoder_t *d)
{
    if (d->yh != NULL)
        yajl_free(d->yh);
    d->yh = NULL;
}

/* body[from..to) through yajl; false on an error (d->status set, or yajl's own). */
static bool feed(kvr_oai_decoder_t *d, const char *body, size_t from, size_t to,
                 yajl_status *st)
{
    d->base = from;
    *st = yajl_parse(d->yh, (const unsigned char *)body + from, to - from);
    return *st == yajl_status_ok && d->status == KVR_OK;
}

/* The end of a parse: yajl's final check and the error message for the whole body. */
static void finish_parse(kvr_oai_decoder_t *d, yajl_status st, size_t len)
{
    char msg[KVR_JD_MSG_BYTES];
    st = kvr_jd_yajl_finish(d->yh, st, d->base, len, msg, sizeof msg);
    if (st == yajl_status_error)
        fail(d, KVR_EPARSE, "%s", msg);
    if (d->status == KVR_OK && st != yajl_status_ok)
        fail(d, KVR_EPARSE, "invalid JSON");  /* client_canceled always sets status first */
    if (d->status == KVR_OK && d->state != S_DONE)
        fail(d, KVR_EPARSE, "internal: parse ended in state %d", d->state);
}

#define FAST_MAX_CUTS 16
#define NONE SIZE_MAX

/* The next candidate array of key at or after from (NONE when there is none). */
static size_t next_candidate(const char *b, size_t len, size_t from, const char *key,
                             size_t key_len)
{
    size_t open = kvr_token_scan_find(b, len, from, key, key_len);
    return open == 0 ? NONE : open;
}

/* At a candidate prompt array opening at open (just after '['): yajl must be exactly there,
 * in prompt's array with nothing read, or in its inner array for [[...]]. */
static bool at_prompt_array(const kvr_oai_decoder_t *d, size_t open)
{
    if (d->tok_open_at != open || d->n_ptok != 0)
        return false;
    if (d->state == S_PROMPT_ARR)
        return d->prompt_elems == 0;
    return d->state == S_TOKENS && d->field == F_PROMPT && d->tok_nested;
}

static bool at_token_data(const kvr_oai_decoder_t *d, size_t open)
{
    return d->tok_open_at == open && d->state == S_TOKENS && d->field == F_TOKEN_DATA &&
           d->n_ttok == 0;
}

/*
 * Parses body. With the fast path, yajl gets the body in pieces cut where a token array seems
 * to open; when the state confirms it, the scanner reads the array and yajl resumes at its
 * ']'. Returns 1 when that read the body (*scanned: arrays the scanner read), -1 when a body
 * that was cut failed (the caller re-parses it whole, for the message), 0 when it was parsed
 * in one piece (the status is the answer).
 */
static int parse(kvr_oai_decoder_t *d, const char *body, size_t len, bool fast, int *scanned)
{
    *scanned = 0;
    if (start_yajl(d) == NULL)
        return 0;
    size_t pos = 0;
    int cuts = 0;
    yajl_status st = yajl_status_ok;
    bool want_prompt = fast && d->endpoint == KVR_OAI_COMPLETIONS;
    bool want_data = fast && d->endpoint != KVR_OAI_TOKENIZE;
    size_t c_prompt = want_prompt ? next_candidate(body, len, 0, "\"prompt\"", 8) : NONE;
    size_t c_data = want_data ? next_candidate(body, len, 0, "\"token_data\"", 12) : NONE;
    while (cuts < FAST_MAX_CUTS && (c_prompt != NONE || c_data != NONE)) {
        bool is_prompt = c_prompt < c_data;
        size_t open = is_prompt ? c_prompt : c_data;
        if (is_prompt) {  /* [[ ... ]]: the inner array holds the ids */
            size_t q = open;
            while (q < len && kvr_jd_is_ws(body[q]))
                q++;
            if (q < len && body[q] == '[')
                open = q + 1;
        }
        cuts++;
        if (!feed(d, body, pos, open, &st)) {
            pos = open;
            break;
        }
        pos = open;
        size_t close, n;
        if (is_prompt && at_prompt_array(d, open) &&
            kvr_token_scan(body, len, open, &d->ptok, &d->ptok_cap, d->opts.max_tokens, &close,
                           &n)) {
            d->n_ptok = n;
            d->prompt_shape = P_TOKENS;
            if (d->state == S_PROMPT_ARR) {
                d->state = S_TOKENS;
                d->tok_nested = false;
            }
            pos = close;
            ++*scanned;
        } else if (!is_prompt && at_token_data(d, open) &&
                   kvr_token_scan(body, len, open, &d->ttok, &d->ttok_cap, d->opts.max_tokens,
                                  &close, &n)) {
            d->n_ttok = n;
            pos = close;
            ++*scanned;
        }
        if (c_prompt != NONE && c_prompt <= pos)
            c_prompt = next_candidate(body, len, pos, "\"prompt\"", 8);
        if (c_data != NONE && c_data <= pos)
            c_data = next_candidate(body, len, pos, "\"token_data\"", 12);
    }
    if (st == yajl_status_ok && d->status == KVR_OK)
        feed(d, body, pos, len, &st);
    finish_parse(d, st, len);
    stop_yajl(d);
    if (d->status != KVR_OK && cuts > 0)
        return -1;
    return d->status == KVR_OK && cuts > 0 ? 1 : 0;
}

/* ---- finishing: what the endpoint requires, and the caller's struct ---------------------- */

static const char *str_of(const kvr_oai_decoder_t *d, int f, size_t *len)
{
    if (!has(d, f)) {
        *len = 0;
        return NULL;
    }
    *len = d->sval[f].len;
    return d->str_buf + d->sval[f].off;
}

/* The prompt as given (prompt or messages) into out->given_kind and its fields. */
static void given_prompt(kvr_oai_decoder_t *d, kvr_oai_request_t *out)
{
    if (has(d, F_PROMPT) && d->prompt_shape == P_TEXT) {
        out->given_kind = KVR_OAI_PROMPT_TEXT;
        out->text = str_of(d, F_PROMPT, &out->text_len);
    } else if (has(d, F_PROMPT) && d->prompt_shape == P_TOKENS) {
        out->given_kind = KVR_OAI_PROMPT_TOKENS;
        out->prompt_ids = d->n_ptok > 0 ? d->ptok : NULL;
        out->n_prompt_ids = d->n_ptok;
    } else if (has(d, F_MESSAGES)) {
        out->given_kind = KVR_OAI_PROMPT_MESSAGES;
        for (size_t i = 0; i < d->n_msgs; i++) {
            const msg_ref_t *m = &d->msgs[i];
            kvr_oai_message_t *o = &d->msg_out[i];
            o->role = d->str_buf + m->role.off;
            o->role_len = m->role.len;
            o->content = d->str_buf + m->content.off;
            o->content_len = m->content.len;
        }
        out->messages = d->n_msgs > 0 ? d->msg_out : NULL;
        out->n_messages = d->n_msgs;
    }
}

/* Of a field and its agent_hints alias, the one given (-1: neither). */
static int pick_alias(const kvr_oai_decoder_t *d, int f, int alias)
{
    return has(d, f) ? f : has(d, alias) ? alias : -1;
}

/* A field and its agent_hints alias may both be given only with the same value. */
static bool aliases_agree(kvr_oai_decoder_t *d)
{
    static const int pairs[][2] = {
        {F_PRIORITY, F_H_PRIORITY}, {F_PRIORITY_JUMP, F_H_LATENCY}, {F_EXPECTED, F_H_OSL}};
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        int a = pairs[i][0], b = pairs[i][1];
        if (!has(d, a) || !has(d, b))
            continue;
        bool same =
            FIELDS[a].type == T_DOUBLE ? d->dval[a] == d->dval[b] : d->ival[a] == d->ival[b];
        if (!same)
            return fail(d, KVR_EINVAL, "%s: differs from %s (give one, or both equal)",
                        FIELDS[b].path, FIELDS[a].path),
                   false;
    }
    return true;
}

/* session_control: a session_id, and an action of "open" (the default) or "close". */
static bool session_ok(kvr_oai_decoder_t *d)
{
    if (!has(d, F_SESSION))
        return true;
    if (!has(d, F_S_ID))
        return missing(d, F_S_ID), false;
    size_t n;
    const char *a = str_of(d, F_S_ACTION, &n);
    if (a != NULL && strcmp(a, "open") != 0 && strcmp(a, "close") != 0)
        return fail(d, KVR_EINVAL, "nvext.session_control.action: must be open or close"), false;
    return true;
}

static int finish(kvr_oai_decoder_t *d, kvr_oai_request_t *out)
{
    int e = d->endpoint;
    bool data = has(d, F_TOKEN_DATA);
    if (!aliases_agree(d) || !session_ok(d))
        return d->status;
    if (e == KVR_OAI_TOKENIZE) {
        if (has(d, F_PROMPT) && has(d, F_MESSAGES))
            return fail(d, KVR_EINVAL, "prompt: give either prompt or messages, not both"),
                   d->status;
        if (!has(d, F_PROMPT) && !has(d, F_MESSAGES))
            return missing(d, F_PROMPT), d->status;
    } else if (!data) {
        int req = e == KVR_OAI_CHAT ? F_MESSAGES : F_PROMPT;
        if (!has(d, req))
            return missing(d, req), d->status;
    }
    if (d->n_msgs > d->msg_out_cap &&
        kvr_grow((void **)&d->msg_out, &d->msg_out_cap, d->n_msgs, d->opts.max_messages,
              sizeof *d->msg_out) != KVR_OK)
        return fail(d, KVR_ENOMEM, "messages: out of memory"), d->status;
    given_prompt(d, out);
    if (data) {
        out->prompt_kind = KVR_OAI_PROMPT_TOKENS;
        out->tokens = d->n_ttok > 0 ? d->ttok : NULL;
        out->n_tokens = d->n_ttok;
    } else {
        out->prompt_kind = (kvr_oai_prompt_kind_t)out->given_kind;
        out->tokens = out->prompt_ids;
        out->n_tokens = out->n_prompt_ids;
    }
    if (e != KVR_OAI_TOKENIZE) {  /* something to prefill */
        bool empty = out->prompt_kind == KVR_OAI_PROMPT_TOKENS ? out->n_tokens == 0
                     : out->prompt_kind == KVR_OAI_PROMPT_TEXT ? out->text_len == 0
                                                               : out->n_messages == 0;
        if (empty)
            return fail(d, KVR_EINVAL, "%s: must not be empty",
                        data ? "nvext.token_data" : e == KVR_OAI_CHAT ? "messages" : "prompt"),
                   d->status;
    }
    out->endpoint = (kvr_oai_endpoint_t)e;
    out->model = str_of(d, F_MODEL, &out->model_len);
    if (has(d, F_MAX_COMPLETION)) {
        out->has_max_tokens = true;
        out->max_tokens = (uint32_t)d->ival[F_MAX_COMPLETION];
    } else if (has(d, F_MAX_TOKENS)) {
        out->has_max_tokens = true;
        out->max_tokens = (uint32_t)d->ival[F_MAX_TOKENS];
    }
    out->stream = has(d, F_STREAM) && d->bval[F_STREAM];
    out->include_usage = has(d, F_INCLUDE_USAGE) && d->bval[F_INCLUDE_USAGE];
    out->has_nvext = has(d, F_NVEXT);
    out->images = d->n_img > 0 ? d->img : NULL;
    out->n_images = d->n_img;
    kvr_oai_nvext_t *x = &out->nvext;
    x->has_token_data = data;
    x->token_data = d->n_ttok > 0 ? d->ttok : NULL;
    x->n_token_data = d->n_ttok;
    x->has_backend_instance_id = has(d, F_BACKEND_ID);
    x->backend_instance_id = has(d, F_BACKEND_ID) ? d->ival[F_BACKEND_ID] : 0;
    x->has_prefill_worker_id = has(d, F_PREFILL_ID);
    x->prefill_worker_id = has(d, F_PREFILL_ID) ? d->ival[F_PREFILL_ID] : 0;
    x->has_decode_worker_id = has(d, F_DECODE_ID);
    x->decode_worker_id = has(d, F_DECODE_ID) ? d->ival[F_DECODE_ID] : 0;
    x->has_prefill_dp_rank = has(d, F_PREFILL_DP_RANK);
    x->prefill_dp_rank = has(d, F_PREFILL_DP_RANK) ? (uint32_t)d->ival[F_PREFILL_DP_RANK] : 0;
    x->has_dp_rank = has(d, F_DP_RANK);
    x->dp_rank = has(d, F_DP_RANK) ? (uint32_t)d->ival[F_DP_RANK] : 0;
    x->lora_name = str_of(d, F_LORA, &x->lora_name_len);
    int f = pick_alias(d, F_PRIORITY, F_H_PRIORITY);
    x->has_priority = f >= 0;
    x->priority = f >= 0 ? (int32_t)(int64_t)d->ival[f] : 0;
    f = pick_alias(d, F_PRIORITY_JUMP, F_H_LATENCY);
    x->has_priority_jump = f >= 0;
    x->priority_jump = f >= 0 ? d->dval[f] : 0.0;
    x->session_id = str_of(d, F_S_ID, &x->session_id_len);
    size_t n_act;
    const char *act = str_of(d, F_S_ACTION, &n_act);
    x->session_close = act != NULL && strcmp(act, "close") == 0;
    f = pick_alias(d, F_EXPECTED, F_H_OSL);
    x->has_expected_output_tokens = f >= 0;
    x->expected_output_tokens = f >= 0 ? (uint32_t)d->ival[f] : 0;
    x->has_allowed_worker_ids = has(d, F_ALLOWED);
    kvr_sort_u64(d->ids, d->n_ids);
    x->allowed_worker_ids = d->n_ids > 0 ? d->ids : NULL;
    x->n_allowed_worker_ids = d->n_ids;
    x->want_worker_id = d->want_worker_id;
    x->want_timing = d->want_timing;
    return KVR_OK;
}

int kvr_oai_decode(kvr_oai_decoder_t *d, kvr_oai_endpoint_t endpoint, const char *body,
                   size_t len, kvr_oai_request_t *out)
{
    memset(out, 0, sizeof *out);
    d->stats.bodies++;
    reset(d, (int)endpoint);
    if ((unsigned)endpoint > KVR_OAI_TOKENIZE)
        fail(d, KVR_EINVAL, "unknown endpoint");
    else if (body == NULL && len > 0)
        fail(d, KVR_EINVAL, "no body");
    else if (kvr_jd_blank(body, len))
        fail(d, KVR_EPARSE, "empty body");
    else {
        int scanned;
        int r = parse(d, body, len, !d->opts.no_fast_path, &scanned);
        if (r < 0) {
            reset(d, (int)endpoint);
            parse(d, body, len, false, &scanned);
        } else if (scanned > 0) {
            d->stats.fast_path++;
        }
        if (d->status == KVR_OK)
            finish(d, out);
    }
    if (d->status != KVR_OK) {
        memset(out, 0, sizeof *out);
        d->stats.errors++;
    }
    return d->status;
}
