/*
 * api_json.c: the JSON API body decoders and encoders (see api_json.h for the contract).
 *
 * Structure: one table of known fields (key, dotted path for messages, enclosing object, type,
 * range, the body kinds that know it) drives a yajl callback state machine. Values land in
 * per-field slots (ival/dval/bval/sval indexed by field) and growable arrays; finish() checks
 * what a kind requires and fills the caller's struct.
 *
 * Invariants: a decode either succeeds with every output consistent (counts within limits,
 * strings NUL-terminated without control characters, allowed ids ascending) or fails with
 * d->err naming the first problem and the output zeroed. The callbacks stop yajl at the first
 * problem. The fast path (token scan + yajl on the rest) is only taken when it yields
 * exactly what the slow path would: yajl must report the tokens array opening exactly where
 * the scanner starts, the scanner accepts only `ws (u32 (ws , ws u32)*)? ws ]` with canonical
 * digits, and any doubt or any error re-runs the body through yajl alone, so error messages
 * always come from the slow path (tests and the fuzz target compare the two paths).
 * Memory: the decoder owns tok_buf, ids_buf, str_buf, num_buf (grown geometrically, capped by
 * the limits, reused) and a yajl arena (wire/yajl_arena.h, reset per body), so steady-state
 * decoding allocates nothing.
 * Threads: none of its own; a decoder belongs to one thread at a time.
 * Cost: O(body bytes); a key lookup is a scan of the ~34-entry table; allowed ids are heap
 * sorted (O(n log n), skipped when already sorted); preferred taints are checked for
 * duplicates in O(n^2) over at most 64 entries.
 */
#include "wire/api_json.h"

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

enum kind {
    K_ROUTE,
    K_OUTPUT_BLOCK,
    K_QUERY,
    K_LOADS,
    K_WORKER,
    K_ROUTER,
    K_IX_REGISTER,   /* the indexer API: POST /register */
    K_IX_UNREGISTER, /* POST /unregister */
    K_IX_QUERY,      /* POST /query */
    K_IX_HASH,       /* POST /query_by_hash */
    K_IX_PEER,       /* POST /register_peer, /deregister_peer */
    K_IX_RECORD,     /* POST /record_routing_decision */
    K_BUSY,          /* POST /busy_threshold */
    K_N
};
#define KB(k) (1u << (k))
#define K_TOKENS (KB(K_ROUTE) | KB(K_QUERY) | KB(K_LOADS) | KB(K_ROUTER))

enum obj { O_TOP, O_PINNED, O_CONSTRAINTS, O_OVERRIDE, O_SESSION, O_MMR };

enum type {
    T_TOKENS,    /* array of u32 */
    T_IDS,       /* array of u64 */
    T_HASHES,    /* array of i64 or u64 (block hashes; a negative one is its two's complement) */
    T_TAINTS,    /* array of taint strings */
    T_OBJECT,    /* a known nested object (child obj in lo) */
    T_TAINT_MAP, /* {"taint": weight} */
    T_STRING,    /* length in [lo, hi]; lo == 0: "" reads as absent */
    T_METHOD,    /* /router method name */
    T_BOOL,
    T_INT,     /* integer in [lo, hi] */
    T_DOUBLE,  /* finite, range in rng */
    T_MM_LIST, /* block_mm_infos: [null | {"mm_objects": [{"mm_hash": u64 | id}]}] */
};

enum range { R_FINITE, R_NONNEG, R_UNIT };

enum field {
    F_TOKENS,
    F_REQUEST_ID,
    F_UPDATE_STATE,
    F_DISAGG,
    F_LORA_NAME,
    F_CACHE_NAMESPACE,
    F_ALLOWED,
    F_PINNED,
    F_PRIORITY_JUMP,
    F_EXPECTED_OUTPUT,
    F_CONSTRAINTS,
    F_OVERRIDE,
    F_DECAY,
    F_WORKER_ID,
    F_URL,
    F_EVENTS,
    F_REPLAY,
    F_DP_SIZE,
    F_DP_START,
    F_TAINTS,
    F_MAX_BATCHED,
    F_TOTAL_KV_BLOCKS,
    F_EAGLE,
    F_METHOD,
    F_STRICT_PRIORITY,
    F_PIN_WORKER_ID,
    F_PIN_DP_RANK,
    F_REQUIRED,
    F_PREFERRED,
    F_OV_CREDIT,
    F_OV_SCALE,
    F_OV_TEMP,
    F_OV_SHARED,
    F_OV_WEIGHT,
    F_OV_ASSUME,
    F_OV_TRACK,
    F_SESSION,
    F_SESS_ID,
    F_SESS_ACTION,
    F_W_MODEL,
    F_BUSY_PREFILL,
    F_BUSY_DECODE,
    F_W_BLOCK_SIZE,
    F_W_LORAS,
    F_W_TOKENIZER,
    F_W_ROLE,
    F_W_BOOT_HOST,
    F_W_BOOT_PORT,
    F_MM_INFOS,
    F_MMR,
    F_MMR_INFOS,
    F_IX_INSTANCE,
    F_IX_ENDPOINT,
    F_IX_MODEL,
    F_IX_GROUP,
    F_IX_TENANT,
    F_IX_BLOCK_SIZE,
    F_IX_DP_RANK,
    F_IX_REPLAY,
    F_IX_SALT,
    F_IX_SALT_ALIAS,
    F_IX_TOKEN_IDS,
    F_IX_CACHE_SALT,
    F_IX_HASHES,
    F_IX_URL,
    F_IX_LOCAL,
    F_IX_SEQ,
    F_IX_CAPACITY,
    F_N,
    F_UNKNOWN = F_N,
};

typedef struct field_def {
    const char *key;
    const char *path;   /* for messages */
    unsigned char obj;  /* enclosing object */
    unsigned char type;
    unsigned char rng;  /* T_DOUBLE */
    unsigned kinds;     /* KB() of the body kinds that know the field */
    uint64_t lo, hi;    /* T_INT range, T_STRING length, T_OBJECT child */
} field_def_t;

#define U32MAX ((uint64_t)UINT32_MAX)
#define ROUTE_ROUTER (KB(K_ROUTE) | KB(K_ROUTER))
#define NAMES (KB(K_ROUTE) | KB(K_QUERY) | KB(K_LOADS) | KB(K_ROUTER))
#define IX_ALL \
    (KB(K_IX_REGISTER) | KB(K_IX_UNREGISTER) | KB(K_IX_QUERY) | KB(K_IX_HASH) | KB(K_IX_RECORD))
#define IX_WORKER (KB(K_IX_REGISTER) | KB(K_IX_UNREGISTER) | KB(K_IX_RECORD))
#define IX_QUERIES (KB(K_IX_QUERY) | KB(K_IX_HASH))

static const field_def_t FIELDS[F_N] = {
    [F_TOKENS] = {"tokens", "tokens", O_TOP, T_TOKENS, 0, K_TOKENS, 0, 0},
    [F_REQUEST_ID] = {"request_id", "request_id", O_TOP, T_STRING, 0, ROUTE_ROUTER, 1,
                      KVR_API_MAX_REQUEST_ID_BYTES},
    [F_UPDATE_STATE] = {"update_state", "update_state", O_TOP, T_BOOL, 0, KB(K_ROUTE), 0, 0},
    [F_DISAGG] = {"disagg", "disagg", O_TOP, T_BOOL, 0, KB(K_ROUTE), 0, 0},
    [F_LORA_NAME] = {"lora_name", "lora_name", O_TOP, T_STRING, 0, NAMES | KB(K_IX_QUERY), 0,
                     KVR_API_MAX_NAME_BYTES},
    [F_CACHE_NAMESPACE] = {"cache_namespace", "cache_namespace", O_TOP, T_STRING, 0, NAMES, 0,
                           KVR_API_MAX_NAME_BYTES},
    [F_ALLOWED] = {"allowed_worker_ids", "allowed_worker_ids", O_TOP, T_IDS, 0, KB(K_ROUTE), 0, 0},
    [F_PINNED] = {"pinned_worker", "pinned_worker", O_TOP, T_OBJECT, 0, KB(K_ROUTE), O_PINNED, 0},
    [F_PRIORITY_JUMP] = {"priority_jump", "priority_jump", O_TOP, T_DOUBLE, R_FINITE, ROUTE_ROUTER,
                         0, 0},
    [F_EXPECTED_OUTPUT] = {"expected_output_tokens", "expected_output_tokens", O_TOP, T_INT, 0,
                           KB(K_ROUTE), 0, U32MAX},
    [F_CONSTRAINTS] = {"routing_constraints", "routing_constraints", O_TOP, T_OBJECT, 0,
                       ROUTE_ROUTER, O_CONSTRAINTS, 0},
    [F_OVERRIDE] = {"config_override", "config_override", O_TOP, T_OBJECT, 0, KB(K_ROUTE),
                    O_OVERRIDE, 0},
    [F_DECAY] = {"decay_fraction", "decay_fraction", O_TOP, T_DOUBLE, R_UNIT, KB(K_OUTPUT_BLOCK), 0,
                 0},
    [F_WORKER_ID] = {"worker_id", "worker_id", O_TOP, T_INT, 0, KB(K_WORKER), 0, UINT64_MAX},
    [F_URL] = {"url", "url", O_TOP, T_STRING, 0, KB(K_WORKER), 1, KVR_API_MAX_URL_BYTES},
    [F_EVENTS] = {"events", "events", O_TOP, T_STRING, 0, KB(K_WORKER), 1, KVR_API_MAX_URL_BYTES},
    [F_REPLAY] = {"replay", "replay", O_TOP, T_STRING, 0, KB(K_WORKER), 1, KVR_API_MAX_URL_BYTES},
    [F_DP_SIZE] = {"dp_size", "dp_size", O_TOP, T_INT, 0, KB(K_WORKER), 1, KVR_API_MAX_DP_SIZE},
    [F_DP_START] = {"dp_start", "dp_start", O_TOP, T_INT, 0, KB(K_WORKER), 0, U32MAX},
    [F_TAINTS] = {"taints", "taints", O_TOP, T_TAINTS, 0, KB(K_WORKER), 0, 0},
    [F_MAX_BATCHED] = {"max_num_batched_tokens", "max_num_batched_tokens", O_TOP, T_INT, 0,
                       KB(K_WORKER), 1, UINT64_MAX},
    [F_TOTAL_KV_BLOCKS] = {"total_kv_blocks", "total_kv_blocks", O_TOP, T_INT, 0, KB(K_WORKER), 1,
                           UINT64_MAX},
    [F_EAGLE] = {"eagle", "eagle", O_TOP, T_BOOL, 0, KB(K_WORKER), 0, 0},
    [F_W_MODEL] = {"model", "model", O_TOP, T_STRING, 0, KB(K_WORKER) | KB(K_ROUTE) | KB(K_BUSY), 0,
                   255},
    [F_BUSY_PREFILL] = {"active_prefill_tokens_threshold", "active_prefill_tokens_threshold", O_TOP,
                        T_DOUBLE, R_NONNEG, KB(K_BUSY), 0, 0},
    [F_BUSY_DECODE] = {"active_decode_blocks_threshold", "active_decode_blocks_threshold", O_TOP,
                       T_DOUBLE, R_NONNEG, KB(K_BUSY), 0, 0},
    [F_W_BLOCK_SIZE] = {"block_size", "block_size", O_TOP, T_INT, 0, KB(K_WORKER), 1, 65536},
    [F_W_LORAS] = {"loras", "loras", O_TOP, T_STRING, 0, KB(K_WORKER), 0, 1023},
    [F_W_TOKENIZER] = {"tokenizer", "tokenizer", O_TOP, T_STRING, 0, KB(K_WORKER), 1, 511},
    [F_W_ROLE] = {"role", "role", O_TOP, T_STRING, 0, KB(K_WORKER), 1, 16},
    [F_W_BOOT_HOST] = {"bootstrap_host", "bootstrap_host", O_TOP, T_STRING, 0, KB(K_WORKER), 1,
                       255},
    [F_W_BOOT_PORT] = {"bootstrap_port", "bootstrap_port", O_TOP, T_INT, 0, KB(K_WORKER), 1, 65535},
    [F_MM_INFOS] = {"block_mm_infos", "block_mm_infos", O_TOP, T_MM_LIST, 0, ROUTE_ROUTER, 0, 0},
    [F_MMR] = {"mm_routing_info", "mm_routing_info", O_TOP, T_OBJECT, 0, KB(K_ROUTE), O_MMR, 0},
    [F_MMR_INFOS] = {"block_mm_infos", "mm_routing_info.block_mm_infos", O_MMR, T_MM_LIST, 0,
                     KB(K_ROUTE), 0, 0},
    [F_SESSION] = {"session_control", "session_control", O_TOP, T_OBJECT, 0, KB(K_ROUTE), O_SESSION,
                   0},
    [F_SESS_ID] = {"session_id", "session_control.session_id", O_SESSION, T_STRING, 0, KB(K_ROUTE),
                   1, 128},
    [F_SESS_ACTION] = {"action", "session_control.action", O_SESSION, T_STRING, 0, KB(K_ROUTE), 1,
                       16},
    [F_METHOD] = {"method", "method", O_TOP, T_METHOD, 0, KB(K_ROUTER), 0, 0},
    [F_STRICT_PRIORITY] = {"strict_priority", "strict_priority", O_TOP, T_INT, 0,
                           KB(K_ROUTE) | KB(K_ROUTER), 0, U32MAX},
    [F_PIN_WORKER_ID] = {"worker_id", "pinned_worker.worker_id", O_PINNED, T_INT, 0, KB(K_ROUTE), 0,
                         UINT64_MAX},
    [F_PIN_DP_RANK] = {"dp_rank", "pinned_worker.dp_rank", O_PINNED, T_INT, 0, KB(K_ROUTE), 0,
                       U32MAX},
    [F_REQUIRED] = {"required_taints", "routing_constraints.required_taints", O_CONSTRAINTS,
                    T_TAINTS, 0, ROUTE_ROUTER, 0, 0},
    [F_PREFERRED] = {"preferred_taints", "routing_constraints.preferred_taints", O_CONSTRAINTS,
                     T_TAINT_MAP, 0, ROUTE_ROUTER, 0, 0},
    [F_OV_CREDIT] = {"overlap_score_credit", "config_override.overlap_score_credit", O_OVERRIDE,
                     T_DOUBLE, R_NONNEG, KB(K_ROUTE), 0, 0},
    [F_OV_SCALE] = {"prefill_load_scale", "config_override.prefill_load_scale", O_OVERRIDE,
                    T_DOUBLE, R_NONNEG, KB(K_ROUTE), 0, 0},
    [F_OV_TEMP] = {"router_temperature", "config_override.router_temperature", O_OVERRIDE, T_DOUBLE,
                   R_NONNEG, KB(K_ROUTE), 0, 0},
    [F_OV_SHARED] = {"shared_cache_multiplier", "config_override.shared_cache_multiplier",
                     O_OVERRIDE, T_DOUBLE, R_UNIT, KB(K_ROUTE), 0, 0},
    [F_OV_WEIGHT] = {"overlap_score_weight", "config_override.overlap_score_weight", O_OVERRIDE,
                     T_DOUBLE, R_NONNEG, KB(K_ROUTE), 0, 0},
    [F_OV_ASSUME] = {"assume_kv_reuse", "config_override.assume_kv_reuse", O_OVERRIDE, T_BOOL, 0,
                     KB(K_ROUTE), 0, 0},
    [F_OV_TRACK] = {"track_prefill_tokens", "config_override.track_prefill_tokens", O_OVERRIDE,
                    T_BOOL, 0, KB(K_ROUTE), 0, 0},
    [F_IX_INSTANCE] = {"instance_id", "instance_id", O_TOP, T_INT, 0, IX_WORKER, 0, UINT64_MAX},
    [F_IX_ENDPOINT] = {"endpoint", "endpoint", O_TOP, T_STRING, 0, KB(K_IX_REGISTER), 1,
                       KVR_API_MAX_URL_BYTES},
    [F_IX_MODEL] = {"model_name", "model_name", O_TOP, T_STRING, 0, IX_ALL, 1, 255},
    [F_IX_GROUP] = {"routing_group", "routing_group", O_TOP, T_STRING, 0, IX_ALL, 1, 255},
    [F_IX_TENANT] = {"tenant_id", "tenant_id", O_TOP, T_STRING, 0, IX_ALL, 0, 255},
    [F_IX_BLOCK_SIZE] = {"block_size", "block_size", O_TOP, T_INT, 0,
                         KB(K_IX_REGISTER) | KB(K_IX_RECORD), 1, 65536},
    [F_IX_DP_RANK] = {"dp_rank", "dp_rank", O_TOP, T_INT, 0, IX_WORKER, 0, U32MAX},
    [F_IX_REPLAY] = {"replay_endpoint", "replay_endpoint", O_TOP, T_STRING, 0, KB(K_IX_REGISTER), 1,
                     KVR_API_MAX_URL_BYTES},
    [F_IX_SALT] = {"additional_salt", "additional_salt", O_TOP, T_STRING, 0, KB(K_IX_REGISTER), 0,
                   KVR_API_MAX_NAME_BYTES},
    [F_IX_SALT_ALIAS] = {"additionalsalt", "additionalsalt", O_TOP, T_STRING, 0, KB(K_IX_REGISTER),
                         0, KVR_API_MAX_NAME_BYTES},
    [F_IX_TOKEN_IDS] = {"token_ids", "token_ids", O_TOP, T_TOKENS, 0, KB(K_IX_QUERY), 0, 0},
    [F_IX_CACHE_SALT] = {"cache_salt", "cache_salt", O_TOP, T_STRING, 0, IX_QUERIES, 0,
                         KVR_API_MAX_NAME_BYTES},
    [F_IX_HASHES] = {"block_hashes", "block_hashes", O_TOP, T_HASHES, 0, KB(K_IX_HASH), 0, 0},
    [F_IX_URL] = {"url", "url", O_TOP, T_STRING, 0, KB(K_IX_PEER), 1, KVR_API_MAX_URL_BYTES},
    [F_IX_LOCAL] = {"local_hashes", "local_hashes", O_TOP, T_HASHES, 0, KB(K_IX_RECORD), 0, 0},
    [F_IX_SEQ] = {"sequence_hashes", "sequence_hashes", O_TOP, T_HASHES, 0, KB(K_IX_RECORD), 0, 0},
    [F_IX_CAPACITY] = {"kv_capacity_blocks", "kv_capacity_blocks", O_TOP, T_INT, 0, KB(K_IX_RECORD),
                       1, UINT64_MAX},
};
_Static_assert(F_N <= 128, "seen and present hold a bit per field");

/* A bit per field. */
typedef struct fbits {
    uint64_t w[2];
} fbits_t;

static inline void fb_set(fbits_t *b, int f) { b->w[f >> 6] |= (uint64_t)1 << (f & 63); }
static inline bool fb_has(const fbits_t *b, int f) { return (b->w[f >> 6] >> (f & 63)) & 1; }

/* The field holding a kind's token ids or hashes (the fast scanner reads it), or F_N. */
static int tokens_field(int kind)
{
    if (kind == K_IX_QUERY)
        return F_IX_TOKEN_IDS;
    if (kind == K_IX_HASH)
        return F_IX_HASHES;
    return (FIELDS[F_TOKENS].kinds & KB(kind)) ? F_TOKENS : F_N;
}

static const char *const METHOD_NAMES[] = {"new", "potential_loads", "mark_prefill", "mark_free"};
#define N_METHODS (sizeof METHOD_NAMES / sizeof METHOD_NAMES[0])

const char *kvr_api_router_method_name(kvr_api_router_method_t m)
{
    return (unsigned)m < N_METHODS ? METHOD_NAMES[m] : "unknown";
}

/* ------------------------------------------------------------------------------------------ */
/* Decoder state. */

enum state {
    S_START,      /* before the top-level value */
    S_KEY,        /* in known object d->obj, expecting a key or its end */
    S_VALUE,      /* expecting the value of d->field */
    S_ARRAY,      /* in the array of d->field */
    S_PREF_KEY,   /* in preferred_taints, expecting a taint or the end */
    S_PREF_VALUE, /* expecting the weight of the last preferred taint */
    S_MM_LIST,    /* in block_mm_infos: a block's null or object, or the end */
    S_MM_BKEY,    /* in a block's object: "mm_objects" or another key */
    S_MM_OBJS_V,  /* expecting mm_objects' array (or null) */
    S_MM_OBJS,    /* in mm_objects: an object, or the end */
    S_MM_OKEY,    /* in an mm object: "mm_hash" or another key (offsets are not hashed) */
    S_MM_HASH,    /* expecting an mm_hash: a u64, or an identifier string */
    S_DONE,       /* after the top-level object */
};

typedef struct str_ref {
    size_t off, len;  /* in str_buf, NUL-terminated */
} str_ref_t;

struct kvr_api_decoder {
    kvr_jd_skip_t skip; /* first: the JSON skeleton's (unknown keys' values) */
    kvr_api_options_t opts;
    char err[256];

    int kind, status;
    int state, obj, field;
    fbits_t seen;    /* bit per field: key given */
    fbits_t present; /* bit per field: non-null value given */

    uint64_t ival[F_N];
    double dval[F_N];
    bool bval[F_N];
    str_ref_t sval[F_N];

    uint32_t *tok_buf;
    size_t tok_cap, n_tokens;
    uint64_t *ids_buf;
    size_t ids_cap, n_ids;
    size_t arr_off;                /* where the open hash array's values start in ids_buf */
    size_t span_off[2], span_n[2]; /* local_hashes, sequence_hashes: their part of ids_buf */
    char *str_buf;
    size_t str_cap, str_len;
    char *num_buf;
    size_t num_cap;

    str_ref_t taint[KVR_API_MAX_TAINTS];  /* required_taints or taints (no kind has both) */
    size_t n_taint;
    str_ref_t pref[KVR_API_MAX_TAINTS];
    double pref_w[KVR_API_MAX_TAINTS];
    size_t n_pref;
    const char *taint_ptr[KVR_API_MAX_TAINTS];
    kvr_taint_weight_t pref_out[KVR_API_MAX_TAINTS];

    /* block_mm_infos: per block with objects, its hashes (mm_hash values) in mmh */
    struct mm_ref {
        uint32_t block;
        size_t off, n;
    } * mm_refs;
    size_t n_mm_refs, cap_mm_refs;
    uint64_t *mmh;
    size_t n_mmh, cap_mmh;
    uint32_t mm_block;      /* the block the list is at */
    kvr_block_mm_t *mm_out; /* built at the end (mmh no longer moves) */
    size_t cap_mm_out;

    kvr_api_stats_t stats;
    kvr_yajl_arena_t arena;
    yajl_handle yh;
    size_t tok_open_at;  /* bytes yajl had consumed when the tokens array opened */
};

/* Records the first error; `return fail(...)` stops yajl (see kvr_jd_fail). */
#define fail(d, st, ...) kvr_jd_fail(&(d)->status, (d)->err, sizeof (d)->err, (st), __VA_ARGS__)

/* Reads JSON number text as a finite double; false after fail() when out of memory. */
static bool parse_double(kvr_api_decoder_t *d, const char *s, size_t n, double *out)
{
    int rc = kvr_jd_parse_double(s, n, &d->num_buf, &d->num_cap, out);
    if (rc == KVR_ENOMEM)
        fail(d, KVR_ENOMEM, "out of memory");
    return rc == KVR_OK;
}

static bool in_range(double v, int rng)
{
    switch (rng) {
    case R_NONNEG:
        return v >= 0;
    case R_UNIT:
        return v >= 0 && v <= 1;
    default:
        return true;
    }
}

static const char *range_text(int rng)
{
    switch (rng) {
    case R_NONNEG:
        return "must be a finite number >= 0";
    case R_UNIT:
        return "must be a number in [0, 1]";
    default:
        return "must be a finite number";
    }
}

/* Appends s[0..n) and a NUL to str_buf. */
static bool store_str(kvr_api_decoder_t *d, const unsigned char *s, size_t n, str_ref_t *ref)
{
    if (n > SIZE_MAX / 4 ||
        kvr_grow((void **)&d->str_buf, &d->str_cap, d->str_len + n + 1, SIZE_MAX, 1) != KVR_OK) {
        fail(d, KVR_ENOMEM, "out of memory");
        return false;
    }
    memcpy(d->str_buf + d->str_len, s, n);
    d->str_buf[d->str_len + n] = '\0';
    ref->off = d->str_len;
    ref->len = n;
    d->str_len += n + 1;
    return true;
}

/* A taint (array element or preferred key): 1..128 bytes, no control characters. where is
 * the message prefix up to the colon. Returns 1, or 0 after fail(). */
static int check_taint(kvr_api_decoder_t *d, const char *where, const unsigned char *s, size_t n)
{
    char shown[KVR_JD_CLIP_BYTES];
    kvr_jd_clip(shown, sizeof shown, s, n);
    if (n == 0 || n > KVR_API_MAX_TAINT_BYTES)
        return fail(d, KVR_EINVAL, "%s: taint '%s' must be 1 to %d bytes", where, shown,
                    KVR_API_MAX_TAINT_BYTES);
    const char *problem = kvr_jd_text_problem(s, n);
    if (problem != NULL)
        return fail(d, KVR_EINVAL, "%s: taint '%s' %s", where, shown, problem);
    return 1;
}

/* ---- block_mm_infos ---- */

static int mm_push(kvr_api_decoder_t *d, uint64_t h)
{
    if (d->n_mmh >= KVR_API_MAX_MM_HASHES)
        return fail(d, KVR_ETOOBIG, "%s: more than %d mm_hash values", FIELDS[d->field].path,
                    KVR_API_MAX_MM_HASHES);
    if (d->n_mmh == d->cap_mmh && kvr_grow((void **)&d->mmh, &d->cap_mmh, d->n_mmh + 1,
                                           KVR_API_MAX_MM_HASHES, sizeof *d->mmh) != KVR_OK)
        return fail(d, KVR_ENOMEM, "%s: out of memory", FIELDS[d->field].path);
    d->mmh[d->n_mmh++] = h;
    d->mm_refs[d->n_mm_refs - 1].n++;
    d->state = S_MM_OKEY;
    return 1;
}

/* A block's object opens: its hashes will follow in mmh. */
static int mm_block_open(kvr_api_decoder_t *d)
{
    if (d->n_mm_refs == d->cap_mm_refs &&
        kvr_grow((void **)&d->mm_refs, &d->cap_mm_refs, d->n_mm_refs + 1, SIZE_MAX,
                 sizeof *d->mm_refs) != KVR_OK)
        return fail(d, KVR_ENOMEM, "%s: out of memory", FIELDS[d->field].path);
    d->mm_refs[d->n_mm_refs++] = (struct mm_ref){d->mm_block, d->n_mmh, 0};
    d->state = S_MM_BKEY;
    return 1;
}

/* A block's object closes: kept when it had hashes; the list moves to the next block. */
static int mm_block_close(kvr_api_decoder_t *d)
{
    if (d->mm_refs[d->n_mm_refs - 1].n == 0)
        d->n_mm_refs--;
    if (d->mm_block == UINT32_MAX)
        return fail(d, KVR_ETOOBIG, "%s: too many blocks", FIELDS[d->field].path);
    d->mm_block++;
    d->state = S_MM_LIST;
    return 1;
}

/* The decoded list as kvr_block_mm_t entries (pointers into mmh, which no longer moves). */
static int mm_finish(kvr_api_decoder_t *d, const kvr_block_mm_t **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    if (d->n_mm_refs == 0)
        return KVR_OK;
    if (d->n_mm_refs > d->cap_mm_out && kvr_grow((void **)&d->mm_out, &d->cap_mm_out, d->n_mm_refs,
                                                 SIZE_MAX, sizeof *d->mm_out) != KVR_OK)
        return fail(d, KVR_ENOMEM, "block_mm_infos: out of memory"), d->status;
    for (size_t i = 0; i < d->n_mm_refs; i++)
        d->mm_out[i] =
            (kvr_block_mm_t){d->mm_refs[i].block, d->mmh + d->mm_refs[i].off, d->mm_refs[i].n};
    *out = d->mm_out;
    *n = d->n_mm_refs;
    return KVR_OK;
}

/* After a value of a known object. */
static int value_done(kvr_api_decoder_t *d)
{
    d->state = S_KEY;
    return 1;
}

/* A value of the wrong type where the current state expects something specific. */
static int unexpected(kvr_api_decoder_t *d)
{
    if (d->state == S_START)
        return fail(d, KVR_EPARSE, "expected a JSON object");
    if (d->state == S_PREF_VALUE) {
        const str_ref_t *p = &d->pref[d->n_pref - 1];
        char shown[KVR_JD_CLIP_BYTES];
        kvr_jd_clip(shown, sizeof shown, (const unsigned char *)d->str_buf + p->off, p->len);
        return fail(d, KVR_EINVAL, "routing_constraints.preferred_taints['%s']: must be a finite "
                    "number", shown);
    }
    if (d->field >= F_N)
        return fail(d, KVR_EPARSE, "internal: unexpected value in state %d", d->state);
    const field_def_t *f = &FIELDS[d->field];
    if (d->state >= S_MM_LIST && d->state <= S_MM_HASH) {
        if (d->state == S_MM_HASH)
            return fail(d, KVR_EINVAL,
                        "%s[%u]: mm_hash must be an integer in [0, 2^64) or an "
                        "identifier string",
                        f->path, d->mm_block);
        return fail(d, KVR_EINVAL, "%s[%u]: must be null or {mm_objects: [{mm_hash}]}", f->path,
                    d->mm_block);
    }
    if (d->state == S_ARRAY) {
        switch (f->type) {
        case T_TOKENS:
            return fail(d, KVR_EINVAL, "%s[%zu]: not an integer in [0, 4294967295]", f->path,
                        d->n_tokens);
        case T_IDS:
            return fail(d, KVR_EINVAL, "%s[%zu]: not an integer in [0, 18446744073709551615]",
                        f->path, d->n_ids);
        case T_HASHES:
            return fail(d, KVR_EINVAL,
                        "%s[%zu]: not an integer in [-9223372036854775808, "
                        "18446744073709551615]",
                        f->path, d->n_ids);
        default:
            return fail(d, KVR_EINVAL, "%s[%zu]: must be a string", f->path, d->n_taint);
        }
    }
    switch (f->type) {
    case T_TOKENS:
        return fail(d, KVR_EINVAL, "%s: must be an array of integers", f->path);
    case T_IDS:
    case T_HASHES:
        return fail(d, KVR_EINVAL, "%s: must be an array of integers or null", f->path);
    case T_TAINTS:
        return fail(d, KVR_EINVAL, "%s: must be an array of strings or null", f->path);
    case T_OBJECT:
    case T_TAINT_MAP:
        return fail(d, KVR_EINVAL, "%s: must be an object or null", f->path);
    case T_STRING:
        return fail(d, KVR_EINVAL, "%s: must be a string or null", f->path);
    case T_METHOD:
        return fail(d, KVR_EINVAL, "method: must be one of new, potential_loads, mark_prefill, "
                    "mark_free");
    case T_BOOL:
        return fail(d, KVR_EINVAL, "%s: must be true, false or null", f->path);
    case T_INT:
        return fail(d, KVR_EINVAL, "%s: not an integer in [%" PRIu64 ", %" PRIu64 "]", f->path,
                    f->lo, f->hi);
    case T_DOUBLE:
        return fail(d, KVR_EINVAL, "%s: %s", f->path, range_text(f->rng));
    default:
        return fail(d, KVR_EPARSE, "internal: unexpected value for %s", f->path);
    }
}

/* A skipped value's end: back where its key was (a known object, or an mm block or object). */
static int skipped(void *ctx)
{
    kvr_api_decoder_t *d = ctx;
    if (d->state == S_MM_BKEY || d->state == S_MM_OKEY)
        return 1;
    return value_done(d);
}

static int obj_depth(int obj)
{
    return obj == O_TOP ? 1 : 2;
}

static unsigned own_depth(const void *ctx)
{
    const kvr_api_decoder_t *d = ctx;
    unsigned extra = d->state == S_MM_LIST   ? 1
                     : d->state == S_MM_BKEY ? 2
                     : d->state == S_MM_OBJS ? 3
                     : d->state == S_MM_OKEY ? 4
                                             : 0;
    return (unsigned)obj_depth(d->obj) + extra;
}

static int too_deep(void *ctx)
{
    return fail((kvr_api_decoder_t *)ctx, KVR_EINVAL, "nesting deeper than %d levels", KVR_API_MAX_DEPTH);
}

static int on_null(void *ctx)
{
    kvr_api_decoder_t *d = ctx;
    switch (d->state) {
    case S_VALUE:
        return value_done(d);  /* null = absent; finish() rejects a missing required field */
    case S_MM_LIST:            /* a block without multimodal objects */
        if (d->mm_block == UINT32_MAX)
            return fail(d, KVR_ETOOBIG, "%s: too many blocks", FIELDS[d->field].path);
        d->mm_block++;
        return 1;
    case S_MM_OBJS_V:
        d->state = S_MM_BKEY;
        return 1;
    case S_MM_HASH:
        d->state = S_MM_OKEY;
        return 1;
    default:
        return unexpected(d);
    }
}

static int on_boolean(void *ctx, int v)
{
    kvr_api_decoder_t *d = ctx;
    if (d->state == S_VALUE && FIELDS[d->field].type == T_BOOL) {
        d->bval[d->field] = v != 0;
        fb_set(&d->present, d->field);
        return value_done(d);
    }
    return unexpected(d);
}

/* One block hash of block_hashes: an i64 (the reference's type; a negative one stands for its
 * two's complement) or a u64. At most max_tokens of them, a hash per block. */
static int hash_push(kvr_api_decoder_t *d, const char *s, size_t n)
{
    uint64_t mag;
    bool neg;
    if (!kvr_jd_parse_int(s, n, &mag, &neg) || (neg && mag > ((uint64_t)1 << 63)))
        return unexpected(d);
    if (d->n_ids == d->ids_cap &&
        kvr_grow((void **)&d->ids_buf, &d->ids_cap, d->n_ids + 1, d->opts.max_tokens,
                 sizeof *d->ids_buf) != KVR_OK) {
        if (d->n_ids >= d->opts.max_tokens)
            return fail(d, KVR_ETOOBIG, "%s: more than %zu hashes", FIELDS[d->field].path,
                        d->opts.max_tokens);
        return fail(d, KVR_ENOMEM, "%s: out of memory", FIELDS[d->field].path);
    }
    d->ids_buf[d->n_ids++] = neg ? (uint64_t)0 - mag : mag;
    return 1;
}

static int on_number(void *ctx, const char *s, size_t n)
{
    kvr_api_decoder_t *d = ctx;
    uint64_t v;
    double x;
    switch (d->state) {
    case S_ARRAY:
        if (FIELDS[d->field].type == T_TOKENS) {
            if (!kvr_jd_parse_u64(s, n, 0, UINT32_MAX, &v))
                return unexpected(d);
            if (d->n_tokens == d->tok_cap &&
                kvr_grow((void **)&d->tok_buf, &d->tok_cap, d->n_tokens + 1, d->opts.max_tokens,
                      sizeof *d->tok_buf) != KVR_OK) {
                if (d->n_tokens >= d->opts.max_tokens)
                    return fail(d, KVR_ETOOBIG, "%s: more than %zu tokens",
                                FIELDS[d->field].path, d->opts.max_tokens);
                return fail(d, KVR_ENOMEM, "%s: out of memory", FIELDS[d->field].path);
            }
            d->tok_buf[d->n_tokens++] = (uint32_t)v;
            return 1;
        }
        if (d->field == F_ALLOWED) {
            if (!kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v))
                return unexpected(d);
            if (d->n_ids == d->ids_cap &&
                kvr_grow((void **)&d->ids_buf, &d->ids_cap, d->n_ids + 1, d->opts.max_allowed_ids,
                      sizeof *d->ids_buf) != KVR_OK) {
                if (d->n_ids >= d->opts.max_allowed_ids)
                    return fail(d, KVR_ETOOBIG, "allowed_worker_ids: more than %zu ids",
                                d->opts.max_allowed_ids);
                return fail(d, KVR_ENOMEM, "allowed_worker_ids: out of memory");
            }
            d->ids_buf[d->n_ids++] = v;
            return 1;
        }
        if (FIELDS[d->field].type == T_HASHES)
            return hash_push(d, s, n);
        break;
    case S_MM_HASH:
        if (!kvr_jd_parse_u64(s, n, 0, UINT64_MAX, &v))
            return unexpected(d);
        return mm_push(d, v);
    case S_PREF_VALUE:
        if (!parse_double(d, s, n, &x))
            return unexpected(d);
        d->pref_w[d->n_pref - 1] = x;
        d->state = S_PREF_KEY;
        return 1;
    case S_VALUE: {
        const field_def_t *f = &FIELDS[d->field];
        if (f->type == T_INT) {
            if (!kvr_jd_parse_u64(s, n, f->lo, f->hi, &v))
                return unexpected(d);
            d->ival[d->field] = v;
        } else if (f->type == T_DOUBLE) {
            if (!parse_double(d, s, n, &x) || !in_range(x, f->rng))
                return unexpected(d);
            d->dval[d->field] = x;
        } else {
            break;
        }
        fb_set(&d->present, d->field);
        return value_done(d);
    }
    default:
        break;
    }
    return unexpected(d);
}

static int on_string(void *ctx, const unsigned char *s, size_t n)
{
    kvr_api_decoder_t *d = ctx;
    if (d->state == S_ARRAY && FIELDS[d->field].type == T_TAINTS) {
        char where[64];
        snprintf(where, sizeof where, "%s[%zu]", FIELDS[d->field].path, d->n_taint);
        if (!check_taint(d, where, s, n))
            return 0;
        if (d->n_taint >= KVR_API_MAX_TAINTS)
            return fail(d, KVR_ETOOBIG, "%s: more than %d taints", FIELDS[d->field].path,
                        KVR_API_MAX_TAINTS);
        if (!store_str(d, s, n, &d->taint[d->n_taint]))
            return 0;
        d->n_taint++;
        return 1;
    }
    if (d->state == S_MM_HASH) {
        uint64_t h;
        if (!kvr_hash_mm_identifier((const char *)s, n, true, &h)) {
            d->state = S_MM_OKEY; /* "": no identifier */
            return 1;
        }
        return mm_push(d, h);
    }
    if (d->state != S_VALUE)
        return unexpected(d);
    const field_def_t *f = &FIELDS[d->field];
    if (f->type == T_STRING) {
        if (n < f->lo || n > f->hi) {
            if (f->lo == 0)
                return fail(d, KVR_EINVAL, "%s: longer than %" PRIu64 " bytes", f->path, f->hi);
            return fail(d, KVR_EINVAL, "%s: must be %" PRIu64 " to %" PRIu64 " bytes", f->path,
                        f->lo, f->hi);
        }
        const char *problem = kvr_jd_text_problem(s, n);
        if (problem != NULL)
            return fail(d, KVR_EINVAL, "%s: %s", f->path, problem);
        if (n == 0)
            return value_done(d);  /* "" names nothing: absent */
        if (!store_str(d, s, n, &d->sval[d->field]))
            return 0;
        fb_set(&d->present, d->field);
        return value_done(d);
    }
    if (f->type == T_METHOD) {
        for (size_t m = 0; m < N_METHODS; m++) {
            if (strlen(METHOD_NAMES[m]) == n && memcmp(METHOD_NAMES[m], s, n) == 0) {
                d->ival[d->field] = m;
                fb_set(&d->present, d->field);
                return value_done(d);
            }
        }
        char shown[KVR_JD_CLIP_BYTES];
        kvr_jd_clip(shown, sizeof shown, s, n);
        return fail(d, KVR_EINVAL, "method: unknown method '%s' (expected new, potential_loads, "
                    "mark_prefill or mark_free)", shown);
    }
    return unexpected(d);
}

static int on_start_map(void *ctx)
{
    kvr_api_decoder_t *d = ctx;
    switch (d->state) {
    case S_START:
        d->state = S_KEY;
        d->obj = O_TOP;
        return 1;
    case S_MM_LIST:
        return mm_block_open(d);
    case S_MM_OBJS:
        d->state = S_MM_OKEY;
        return 1;
    case S_VALUE:
        if (FIELDS[d->field].type == T_OBJECT) {
            fb_set(&d->present, d->field);
            d->obj = (int)FIELDS[d->field].lo;
            d->state = S_KEY;
            return 1;
        }
        if (FIELDS[d->field].type == T_TAINT_MAP) {
            fb_set(&d->present, d->field);
            d->state = S_PREF_KEY;
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
    kvr_api_decoder_t *d = ctx;
    switch (d->state) {
    case S_VALUE:
        switch (FIELDS[d->field].type) {
        case T_TOKENS:
        case T_HASHES:
            d->tok_open_at = yajl_get_bytes_consumed(d->yh);
            d->arr_off = d->n_ids;
            /* fall through */
        case T_IDS:
        case T_TAINTS:
            fb_set(&d->present, d->field);
            d->state = S_ARRAY;
            return 1;
        case T_MM_LIST:
            if (fb_has(&d->seen, F_MM_INFOS) && fb_has(&d->seen, F_MMR_INFOS))
                return fail(d, KVR_EINVAL,
                            "block_mm_infos: given twice (top level and "
                            "mm_routing_info)");
            fb_set(&d->present, d->field);
            d->mm_block = 0;
            d->state = S_MM_LIST;
            return 1;
        default:
            break;
        }
        break;
    case S_MM_OBJS_V:
        d->state = S_MM_OBJS;
        return 1;
    default:
        break;
    }
    return unexpected(d);
}

/* Closes a container: yajl guarantees map/array pairing, so only the state matters. */
static int on_end(void *ctx)
{
    kvr_api_decoder_t *d = ctx;
    switch (d->state) {
    case S_KEY:
        if (d->obj == O_TOP) {
            d->state = S_DONE;
            return 1;
        }
        d->obj = O_TOP;  /* every nested known object sits in the top level */
        return 1;
    case S_ARRAY:
        if (d->field == F_IX_LOCAL || d->field == F_IX_SEQ) {
            int k = d->field == F_IX_SEQ;
            d->span_off[k] = d->arr_off;
            d->span_n[k] = d->n_ids - d->arr_off;
        }
        return value_done(d);
    case S_PREF_KEY:
        d->obj = O_CONSTRAINTS;
        return value_done(d);
    case S_MM_LIST:
        return value_done(d);
    case S_MM_BKEY:
        return mm_block_close(d);
    case S_MM_OBJS:
        d->state = S_MM_BKEY;
        return 1;
    case S_MM_OKEY:
        d->state = S_MM_OBJS;
        return 1;
    default:
        return fail(d, KVR_EPARSE, "internal: unexpected end in state %d", d->state);
    }
}

static int on_map_key(void *ctx, const unsigned char *s, size_t n)
{
    kvr_api_decoder_t *d = ctx;
    if (d->state == S_MM_BKEY || d->state == S_MM_OKEY) {
        bool block = d->state == S_MM_BKEY;
        const char *want = block ? "mm_objects" : "mm_hash";
        if (strlen(want) == n && memcmp(want, s, n) == 0)
            d->state = block ? S_MM_OBJS_V : S_MM_HASH;
        else
            kvr_jd_skip_next(&d->skip); /* offsets and the like: not hashed */
        return 1;
    }
    if (d->state == S_KEY) {
        unsigned kb = KB(d->kind);
        for (int f = 0; f < F_N; f++) {
            const field_def_t *def = &FIELDS[f];
            if (def->obj != d->obj || !(def->kinds & kb) || strlen(def->key) != n ||
                memcmp(def->key, s, n) != 0)
                continue;
            if (fb_has(&d->seen, f))
                return fail(d, KVR_EINVAL, "%s: duplicate key", def->path);
            fb_set(&d->seen, f);
            d->field = f;
            d->state = S_VALUE;
            return 1;
        }
        if (d->kind == K_ROUTE && d->obj == O_MMR && n == 17 &&
            memcmp(s, "routing_token_ids", 17) == 0)
            return fail(d, KVR_EINVAL,
                        "mm_routing_info.routing_token_ids: not supported; send the ids to hash "
                        "as tokens (with their images' placeholders) and the images as "
                        "block_mm_infos");
        kvr_jd_skip_next(&d->skip); /* not ours: the skeleton swallows its value */
        return 1;
    }
    if (d->state == S_PREF_KEY) {
        const char *where = FIELDS[F_PREFERRED].path;
        if (!check_taint(d, where, s, n))
            return 0;
        for (size_t i = 0; i < d->n_pref; i++) {
            if (d->pref[i].len == n && memcmp(d->str_buf + d->pref[i].off, s, n) == 0) {
                char shown[KVR_JD_CLIP_BYTES];
                kvr_jd_clip(shown, sizeof shown, s, n);
                return fail(d, KVR_EINVAL, "%s: duplicate taint '%s'", where, shown);
            }
        }
        if (d->n_pref >= KVR_API_MAX_TAINTS)
            return fail(d, KVR_ETOOBIG, "%s: more than %d taints", where, KVR_API_MAX_TAINTS);
        if (!store_str(d, s, n, &d->pref[d->n_pref]))
            return 0;
        d->pref_w[d->n_pref++] = 0;
        d->state = S_PREF_VALUE;
        return 1;
    }
    return fail(d, KVR_EPARSE, "internal: unexpected key in state %d", d->state);
}

static const kvr_jd_skip_ops_t SKIP_OPS = {
    .own = KVR_JD_OWN_CALLBACKS,
    .skipped = skipped,
    .depth = own_depth,
    .max_depth = KVR_API_MAX_DEPTH,
    .too_deep = too_deep,
};

/* ------------------------------------------------------------------------------------------ */
/* Decoding. */

kvr_api_decoder_t *kvr_api_decoder_new(const kvr_api_options_t *opts)
{
    kvr_api_options_t o = {
        .max_tokens = KVR_API_MAX_TOKENS,
        .max_allowed_ids = KVR_API_MAX_ALLOWED_IDS,
        .no_fast_path = false,
    };
    if (opts != NULL) {
        o = *opts;
        if (o.max_tokens > KVR_API_MAX_TOKENS || o.max_allowed_ids > KVR_API_MAX_ALLOWED_IDS)
            return NULL;
    }
    kvr_api_decoder_t *d = calloc(1, sizeof *d);
    if (d == NULL)
        return NULL;
    d->opts = o;
    kvr_yajl_arena_init(&d->arena);
    return d;
}

void kvr_api_decoder_free(kvr_api_decoder_t *d)
{
    if (d == NULL)
        return;
    free(d->tok_buf);
    free(d->ids_buf);
    free(d->str_buf);
    free(d->num_buf);
    free(d->mm_refs);
    free(d->mmh);
    free(d->mm_out);
    kvr_yajl_arena_deinit(&d->arena);
    free(d);
}

const char *kvr_api_decoder_error(const kvr_api_decoder_t *d)
{
    return d->err;
}

void kvr_api_decoder_stats(const kvr_api_decoder_t *d, kvr_api_stats_t *out)
{
    *out = d->stats;
}

static void reset(kvr_api_decoder_t *d, int kind)
{
    d->err[0] = '\0';
    d->kind = kind;
    d->status = KVR_OK;
    d->state = S_START;
    d->obj = O_TOP;
    d->field = F_UNKNOWN;
    kvr_jd_skip_reset(&d->skip, &SKIP_OPS);
    d->seen = (fbits_t){{0, 0}};
    d->present = (fbits_t){{0, 0}};
    d->n_tokens = 0;
    d->n_ids = 0;
    d->span_n[0] = d->span_n[1] = 0;
    d->str_len = 0;
    d->n_taint = 0;
    d->n_pref = 0;
    d->n_mm_refs = 0;
    d->n_mmh = 0;
    d->mm_block = 0;
    d->tok_open_at = SIZE_MAX;
}

static yajl_handle start_yajl(kvr_api_decoder_t *d)
{
    d->yh = kvr_jd_yajl_open(&d->arena, &kvr_jd_callbacks, d);
    if (d->yh == NULL)
        fail(d, KVR_ENOMEM, "out of memory");
    return d->yh;
}

static void stop_yajl(kvr_api_decoder_t *d)
{
    if (d->yh != NULL)
        yajl_free(d->yh);
    d->yh = NULL;
}

/* The whole body through yajl. */
static void parse_slow(kvr_api_decoder_t *d, const char *body, size_t len)
{
    yajl_handle h = start_yajl(d);
    if (h == NULL)
        return;
    char msg[KVR_JD_MSG_BYTES];
    yajl_status st = kvr_jd_yajl_finish(h, yajl_parse(h, (const unsigned char *)body, len), 0,
                                        len, msg, sizeof msg);
    if (st == yajl_status_error)
        fail(d, KVR_EPARSE, "%s", msg);
    stop_yajl(d);
    if (d->status == KVR_OK && st != yajl_status_ok)
        fail(d, KVR_EPARSE, "invalid JSON");  /* client_canceled always sets status first */
    if (d->status == KVR_OK && d->state != S_DONE)
        fail(d, KVR_EPARSE, "internal: parse ended in state %d", d->state);
}

/* yajl up to the tokens array, the token scan over it, yajl after it. 1 when that read the
 * body; 0 when there is no literal "tokens" key, -1 when anything else went wrong (the caller
 * then resets and parses slowly). */
static int parse_fast(kvr_api_decoder_t *d, const char *body, size_t len)
{
    int tf = tokens_field(d->kind);
    char key[32];
    int klen = snprintf(key, sizeof key, "\"%s\"", FIELDS[tf].key);
    size_t open = kvr_token_scan_find(body, len, 0, key, (size_t)klen);
    if (open == 0)
        return 0;
    yajl_handle h = start_yajl(d);
    if (h == NULL)
        return -1;
    bool ok = false, hashes = FIELDS[tf].type == T_HASHES;
    size_t close, n;
    if (yajl_parse(h, (const unsigned char *)body, open) == yajl_status_ok && d->status == KVR_OK &&
        d->state == S_ARRAY && d->field == tf && d->tok_open_at == open && d->n_tokens == 0 &&
        d->n_ids == 0 &&
        (hashes ? kvr_int64_scan(body, len, open, &d->ids_buf, &d->ids_cap, d->opts.max_tokens,
                                 &close, &n)
                : kvr_token_scan(body, len, open, &d->tok_buf, &d->tok_cap, d->opts.max_tokens,
                                 &close, &n))) {
        if (hashes)
            d->n_ids = n;
        else
            d->n_tokens = n;
        ok = yajl_parse(h, (const unsigned char *)body + close, len - close) == yajl_status_ok &&
             yajl_complete_parse(h) == yajl_status_ok && d->status == KVR_OK &&
             d->state == S_DONE;
    }
    stop_yajl(d);
    return ok ? 1 : -1;
}

/* ---- finishing: required fields and the caller's struct ---------------------------------- */

static bool has(const kvr_api_decoder_t *d, int f) { return fb_has(&d->present, f); }

static int require(kvr_api_decoder_t *d, int f)
{
    if (has(d, f))
        return KVR_OK;
    if (fb_has(&d->seen, f))
        fail(d, KVR_EINVAL, "%s: must not be null", FIELDS[f].path);
    else
        fail(d, KVR_EINVAL, "%s: missing", FIELDS[f].path);
    return d->status;
}

static const char *str_of(const kvr_api_decoder_t *d, int f, size_t *len)
{
    if (!has(d, f)) {
        *len = 0;
        return NULL;
    }
    *len = d->sval[f].len;
    return d->str_buf + d->sval[f].off;
}

static const uint32_t *tokens_of(const kvr_api_decoder_t *d)
{
    return d->n_tokens > 0 ? d->tok_buf : NULL;
}

/* Pointers into str_buf for the taint lists (valid now that str_buf no longer moves). */
static void taint_lists(kvr_api_decoder_t *d)
{
    for (size_t i = 0; i < d->n_taint; i++)
        d->taint_ptr[i] = d->str_buf + d->taint[i].off;
    for (size_t i = 0; i < d->n_pref; i++) {
        d->pref_out[i].taint = d->str_buf + d->pref[i].off;
        d->pref_out[i].weight = d->pref_w[i];
    }
}

static void copy_request_id(const kvr_api_decoder_t *d, bool *has_id, char *out)
{
    size_t n;
    const char *s = str_of(d, F_REQUEST_ID, &n);
    *has_id = s != NULL;
    memcpy(out, s != NULL ? s : "", n + 1);
}

static int finish_route(kvr_api_decoder_t *d, kvr_api_route_t *out)
{
    if (require(d, F_TOKENS) != KVR_OK)
        return d->status;
    if (has(d, F_PINNED) &&
        (require(d, F_PIN_WORKER_ID) != KVR_OK || require(d, F_PIN_DP_RANK) != KVR_OK))
        return d->status;
    taint_lists(d);
    kvr_sort_u64(d->ids_buf, d->n_ids);
    out->tokens = tokens_of(d);
    out->n_tokens = d->n_tokens;
    copy_request_id(d, &out->has_request_id, out->request_id);
    out->update_state = has(d, F_UPDATE_STATE) ? d->bval[F_UPDATE_STATE] : true;
    out->disagg = has(d, F_DISAGG) && d->bval[F_DISAGG];
    out->lora_name = str_of(d, F_LORA_NAME, &out->lora_name_len);
    out->cache_namespace = str_of(d, F_CACHE_NAMESPACE, &out->cache_namespace_len);
    out->has_allowed = has(d, F_ALLOWED);
    out->allowed_ids = d->n_ids > 0 ? d->ids_buf : NULL;
    out->n_allowed = d->n_ids;
    out->has_pinned = has(d, F_PINNED);
    if (out->has_pinned) {
        out->pinned.worker_id = d->ival[F_PIN_WORKER_ID];
        out->pinned.dp_rank = (uint32_t)d->ival[F_PIN_DP_RANK];
    }
    out->priority_jump = has(d, F_PRIORITY_JUMP) ? d->dval[F_PRIORITY_JUMP] : 0.0;
    out->strict_priority = has(d, F_STRICT_PRIORITY) ? (uint32_t)d->ival[F_STRICT_PRIORITY] : 0;
    out->has_expected_output_tokens = has(d, F_EXPECTED_OUTPUT);
    out->expected_output_tokens =
        out->has_expected_output_tokens ? (uint32_t)d->ival[F_EXPECTED_OUTPUT] : 0;
    out->required_taints = d->n_taint > 0 ? d->taint_ptr : NULL;
    out->n_required = d->n_taint;
    out->preferred_taints = d->n_pref > 0 ? d->pref_out : NULL;
    out->n_preferred = d->n_pref;
    out->has_override = has(d, F_OVERRIDE);
    kvr_select_override_t *o = &out->ovr;
#define OVR(flag, val, f)               \
    do {                                \
        o->flag = has(d, f);            \
        o->val = o->flag ? d->dval[f] : 0; \
    } while (0)
    OVR(has_overlap_score_credit, overlap_score_credit, F_OV_CREDIT);
    OVR(has_prefill_load_scale, prefill_load_scale, F_OV_SCALE);
    OVR(has_temperature, temperature, F_OV_TEMP);
    OVR(has_shared_cache_multiplier, shared_cache_multiplier, F_OV_SHARED);
    OVR(has_overlap_score_weight, overlap_score_weight, F_OV_WEIGHT);
#undef OVR
    out->has_assume_kv_reuse = has(d, F_OV_ASSUME);
    out->assume_kv_reuse = out->has_assume_kv_reuse && d->bval[F_OV_ASSUME];
    out->has_track_prefill_tokens = has(d, F_OV_TRACK);
    out->track_prefill_tokens = out->has_track_prefill_tokens && d->bval[F_OV_TRACK];
    out->model = str_of(d, F_W_MODEL, &out->model_len);
    if (mm_finish(d, &out->mm, &out->n_mm) != KVR_OK)
        return d->status;
    if (has(d, F_SESSION)) {
        if (require(d, F_SESS_ID) != KVR_OK)
            return d->status;
        size_t n;
        const char *a = str_of(d, F_SESS_ACTION, &n);
        if (a != NULL && strcmp(a, "open") != 0 && strcmp(a, "close") != 0)
            return fail(d, KVR_EINVAL, "session_control.action: must be open or close"), d->status;
        out->session_id = str_of(d, F_SESS_ID, &out->session_id_len);
        out->session_close = a != NULL && strcmp(a, "close") == 0;
    }
    return KVR_OK;
}

static int finish_output_block(kvr_api_decoder_t *d, kvr_api_output_block_t *out)
{
    out->has_decay_fraction = has(d, F_DECAY);
    out->decay_fraction = out->has_decay_fraction ? d->dval[F_DECAY] : 0.0;
    return KVR_OK;
}

static int finish_busy(kvr_api_decoder_t *d, kvr_api_busy_t *out)
{
    if (require(d, F_W_MODEL) != KVR_OK)
        return d->status;
    out->model = str_of(d, F_W_MODEL, &out->model_len);
    if (out->model == NULL)
        out->model = "";
    out->has_prefill_tokens = has(d, F_BUSY_PREFILL);
    out->prefill_tokens = out->has_prefill_tokens ? d->dval[F_BUSY_PREFILL] : 0.0;
    out->has_decode_frac = has(d, F_BUSY_DECODE);
    out->decode_frac = out->has_decode_frac ? d->dval[F_BUSY_DECODE] : 0.0;
    if (out->has_prefill_tokens && out->prefill_tokens > 1e15)
        return fail(d, KVR_EINVAL, "active_prefill_tokens_threshold: at most 1e15"), d->status;
    return KVR_OK;
}

static int finish_query(kvr_api_decoder_t *d, kvr_api_query_t *out)
{
    if (require(d, F_TOKENS) != KVR_OK)
        return d->status;
    out->tokens = tokens_of(d);
    out->n_tokens = d->n_tokens;
    out->lora_name = str_of(d, F_LORA_NAME, &out->lora_name_len);
    out->cache_namespace = str_of(d, F_CACHE_NAMESPACE, &out->cache_namespace_len);
    return KVR_OK;
}

static int finish_worker(kvr_api_decoder_t *d, kvr_api_worker_t *out)
{
    if (require(d, F_WORKER_ID) != KVR_OK)
        return d->status;
    uint64_t size = has(d, F_DP_SIZE) ? d->ival[F_DP_SIZE] : 1;
    uint64_t start = has(d, F_DP_START) ? d->ival[F_DP_START] : 0;
    if (start + size - 1 > UINT32_MAX)
        return fail(d, KVR_EINVAL, "dp_start: dp_start + dp_size must be <= 4294967296"),
               d->status;
    taint_lists(d);
    out->worker_id = d->ival[F_WORKER_ID];
    out->url = str_of(d, F_URL, &out->url_len);
    out->events = str_of(d, F_EVENTS, &out->events_len);
    out->replay = str_of(d, F_REPLAY, &out->replay_len);
    out->dp_size = (uint32_t)size;
    out->dp_start = (uint32_t)start;
    out->taints = d->n_taint > 0 ? d->taint_ptr : NULL;
    out->n_taints = d->n_taint;
    out->has_max_num_batched_tokens = has(d, F_MAX_BATCHED);
    out->max_num_batched_tokens = has(d, F_MAX_BATCHED) ? d->ival[F_MAX_BATCHED] : 0;
    out->has_total_kv_blocks = has(d, F_TOTAL_KV_BLOCKS);
    out->total_kv_blocks = has(d, F_TOTAL_KV_BLOCKS) ? d->ival[F_TOTAL_KV_BLOCKS] : 0;
    out->eagle = has(d, F_EAGLE) && d->bval[F_EAGLE];
    out->model = str_of(d, F_W_MODEL, &out->model_len);
    out->block_size = has(d, F_W_BLOCK_SIZE) ? (uint32_t)d->ival[F_W_BLOCK_SIZE] : 0;
    out->loras = str_of(d, F_W_LORAS, &out->loras_len);
    out->tokenizer = str_of(d, F_W_TOKENIZER, &out->tokenizer_len);
    size_t role_len = 0;
    const char *role = str_of(d, F_W_ROLE, &role_len);
    if (role != NULL && kvr_worker_role_parse(role, role_len, &out->role) != KVR_OK)
        return fail(d, KVR_EINVAL, "role: must be prefill, decode or both"), d->status;
    out->bootstrap_host = str_of(d, F_W_BOOT_HOST, &out->bootstrap_host_len);
    out->bootstrap_port = has(d, F_W_BOOT_PORT) ? (uint32_t)d->ival[F_W_BOOT_PORT] : 0;
    return KVR_OK;
}

static int finish_router(kvr_api_decoder_t *d, kvr_api_router_t *out)
{
    if (require(d, F_METHOD) != KVR_OK)
        return d->status;
    kvr_api_router_method_t m = (kvr_api_router_method_t)d->ival[F_METHOD];
    bool with_tokens = m == KVR_API_ROUTER_NEW || m == KVR_API_ROUTER_POTENTIAL_LOADS;
    if (with_tokens ? require(d, F_TOKENS) != KVR_OK : require(d, F_REQUEST_ID) != KVR_OK)
        return d->status;
    out->method = m;
    if (with_tokens) {
        out->tokens = tokens_of(d);
        out->n_tokens = d->n_tokens;
        out->lora_name = str_of(d, F_LORA_NAME, &out->lora_name_len);
        out->cache_namespace = str_of(d, F_CACHE_NAMESPACE, &out->cache_namespace_len);
    }
    if (m != KVR_API_ROUTER_POTENTIAL_LOADS)
        copy_request_id(d, &out->has_request_id, out->request_id);
    if (m == KVR_API_ROUTER_NEW) {
        taint_lists(d);
        out->priority_jump = has(d, F_PRIORITY_JUMP) ? d->dval[F_PRIORITY_JUMP] : 0.0;
        out->strict_priority = has(d, F_STRICT_PRIORITY) ? (uint32_t)d->ival[F_STRICT_PRIORITY] : 0;
        out->required_taints = d->n_taint > 0 ? d->taint_ptr : NULL;
        out->n_required = d->n_taint;
        out->preferred_taints = d->n_pref > 0 ? d->pref_out : NULL;
        out->n_preferred = d->n_pref;
        if (mm_finish(d, &out->mm, &out->n_mm) != KVR_OK)
            return d->status;
    }
    return KVR_OK;
}

/* ---- the indexer API's bodies ------------------------------------------------------------ */

static const char *group_of(const kvr_api_decoder_t *d, size_t *len)
{
    const char *g = str_of(d, F_IX_GROUP, len);
    if (g != NULL)
        return g;
    *len = strlen(KVR_IX_DEFAULT_GROUP);
    return KVR_IX_DEFAULT_GROUP;
}

static int finish_ix_register(kvr_api_decoder_t *d, kvr_ix_register_t *out)
{
    if (require(d, F_IX_INSTANCE) != KVR_OK || require(d, F_IX_ENDPOINT) != KVR_OK ||
        require(d, F_IX_MODEL) != KVR_OK || require(d, F_IX_BLOCK_SIZE) != KVR_OK)
        return d->status;
    if (has(d, F_IX_SALT) && has(d, F_IX_SALT_ALIAS))
        return fail(d, KVR_EINVAL, "additional_salt: given twice (and as additionalsalt)"),
               d->status;
    out->instance_id = d->ival[F_IX_INSTANCE];
    out->endpoint = str_of(d, F_IX_ENDPOINT, &out->endpoint_len);
    out->model_name = str_of(d, F_IX_MODEL, &out->model_name_len);
    out->routing_group = group_of(d, &out->routing_group_len);
    out->block_size = (uint32_t)d->ival[F_IX_BLOCK_SIZE];
    out->dp_rank = has(d, F_IX_DP_RANK) ? (uint32_t)d->ival[F_IX_DP_RANK] : 0;
    out->replay_endpoint = str_of(d, F_IX_REPLAY, &out->replay_endpoint_len);
    return KVR_OK;
}

static int finish_ix_unregister(kvr_api_decoder_t *d, kvr_ix_unregister_t *out)
{
    if (require(d, F_IX_INSTANCE) != KVR_OK || require(d, F_IX_MODEL) != KVR_OK)
        return d->status;
    out->instance_id = d->ival[F_IX_INSTANCE];
    out->model_name = str_of(d, F_IX_MODEL, &out->model_name_len);
    out->routing_group = str_of(d, F_IX_GROUP, &out->routing_group_len);
    out->has_dp_rank = has(d, F_IX_DP_RANK);
    out->dp_rank = out->has_dp_rank ? (uint32_t)d->ival[F_IX_DP_RANK] : 0;
    return KVR_OK;
}

static int finish_ix_query(kvr_api_decoder_t *d, kvr_ix_query_t *out)
{
    bool by_hash = d->kind == K_IX_HASH;
    if (require(d, by_hash ? F_IX_HASHES : F_IX_TOKEN_IDS) != KVR_OK ||
        require(d, F_IX_MODEL) != KVR_OK)
        return d->status;
    if (by_hash && has(d, F_IX_CACHE_SALT))
        return fail(d, KVR_EINVAL, "cache_salt: not accepted by /query_by_hash (block_hashes "
                                   "must already include the intended cache salt)"),
               d->status;
    out->by_hash = by_hash;
    if (by_hash) {
        out->hashes = d->n_ids > 0 ? d->ids_buf : NULL;
        out->n_hashes = d->n_ids;
    } else {
        out->tokens = tokens_of(d);
        out->n_tokens = d->n_tokens;
    }
    out->model_name = str_of(d, F_IX_MODEL, &out->model_name_len);
    out->routing_group = group_of(d, &out->routing_group_len);
    out->lora_name = str_of(d, F_LORA_NAME, &out->lora_name_len);
    out->cache_salt = str_of(d, F_IX_CACHE_SALT, &out->cache_salt_len);
    return KVR_OK;
}

/* Each sequence hash must chain from its local hash and the previous sequence hash: a pair
 * that does not was computed with another hash, salt or block size, and would poison the
 * index with blocks no query can reach. */
static int finish_ix_record(kvr_api_decoder_t *d, kvr_ix_record_t *out)
{
    if (require(d, F_IX_INSTANCE) != KVR_OK || require(d, F_IX_MODEL) != KVR_OK ||
        require(d, F_IX_LOCAL) != KVR_OK || require(d, F_IX_SEQ) != KVR_OK)
        return d->status;
    size_t n = d->span_n[0];
    if (n != d->span_n[1])
        return fail(d, KVR_EINVAL,
                    "local_hashes and sequence_hashes: %zu and %zu hashes (one pair per block)", n,
                    d->span_n[1]),
               d->status;
    if (n == 0)
        return fail(d, KVR_EINVAL, "local_hashes: empty (a decision records at least one block)"),
               d->status;
    const uint64_t *lbh = d->ids_buf + d->span_off[0], *seq = d->ids_buf + d->span_off[1];
    for (size_t i = 0; i < n; i++) {
        uint64_t want = i == 0 ? lbh[0] : kvr_hash_chain_next(seq[i - 1], lbh[i]);
        if (seq[i] != want)
            return fail(d, KVR_EINVAL,
                        "sequence_hashes[%zu]: does not chain from local_hashes[%zu]%s "
                        "(mismatched pair)",
                        i, i, i == 0 ? "" : " and the previous sequence hash"),
                   d->status;
    }
    out->instance_id = d->ival[F_IX_INSTANCE];
    out->dp_rank = has(d, F_IX_DP_RANK) ? (uint32_t)d->ival[F_IX_DP_RANK] : 0;
    out->block_size = has(d, F_IX_BLOCK_SIZE) ? (uint32_t)d->ival[F_IX_BLOCK_SIZE] : 0;
    out->kv_capacity_blocks = has(d, F_IX_CAPACITY) ? d->ival[F_IX_CAPACITY] : 0;
    out->local_hashes = lbh;
    out->sequence_hashes = seq;
    out->n = n;
    out->model_name = str_of(d, F_IX_MODEL, &out->model_name_len);
    out->routing_group = group_of(d, &out->routing_group_len);
    return KVR_OK;
}

static int finish_ix_peer(kvr_api_decoder_t *d, kvr_ix_peer_t *out)
{
    if (require(d, F_IX_URL) != KVR_OK)
        return d->status;
    out->url = str_of(d, F_IX_URL, &out->url_len);
    return KVR_OK;
}

/* Parses body as kind; KVR_OK when the decoder's slots hold a well-formed body. */
static int parse(kvr_api_decoder_t *d, int kind, const char *body, size_t len)
{
    reset(d, kind);
    if (body == NULL && len > 0)
        return fail(d, KVR_EINVAL, "no body"), d->status;
    if (kvr_jd_blank(body, len)) {
        if (kind == K_OUTPUT_BLOCK)
            return KVR_OK;
        return fail(d, KVR_EPARSE, "empty body"), d->status;
    }
    if (!d->opts.no_fast_path && tokens_field(kind) != F_N) {
        int tried = parse_fast(d, body, len);
        if (tried > 0) {
            d->stats.fast_path++;
            return KVR_OK;
        }
        d->stats.fallbacks += tried < 0;
    }
    reset(d, kind);
    parse_slow(d, body, len);
    return d->status;
}

#define DECODE(kind, finisher)                               \
    do {                                                     \
        memset(out, 0, sizeof *out);                         \
        d->stats.bodies++;                                   \
        int st_ = parse(d, kind, body, len);                 \
        if (st_ == KVR_OK)                                   \
            st_ = finisher(d, out);                          \
        if (st_ != KVR_OK) {                                 \
            memset(out, 0, sizeof *out);                     \
            d->stats.errors++;                               \
        }                                                    \
        return st_;                                          \
    } while (0)

int kvr_api_decode_route(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_route_t *out)
{
    DECODE(K_ROUTE, finish_route);
}

int kvr_api_decode_output_block(kvr_api_decoder_t *d, const char *body, size_t len,
                                kvr_api_output_block_t *out)
{
    DECODE(K_OUTPUT_BLOCK, finish_output_block);
}

int kvr_api_decode_busy(kvr_api_decoder_t *d, const char *body, size_t len, kvr_api_busy_t *out)
{
    DECODE(K_BUSY, finish_busy);
}

int kvr_api_decode_query(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_query_t *out)
{
    DECODE(K_QUERY, finish_query);
}

int kvr_api_decode_loads(kvr_api_decoder_t *d, const char *body, size_t len,
                         kvr_api_query_t *out)
{
    DECODE(K_LOADS, finish_query);
}

int kvr_api_decode_worker(kvr_api_decoder_t *d, const char *body, size_t len,
                          kvr_api_worker_t *out)
{
    DECODE(K_WORKER, finish_worker);
}

int kvr_api_decode_router(kvr_api_decoder_t *d, const char *body, size_t len,
                          kvr_api_router_t *out)
{
    DECODE(K_ROUTER, finish_router);
}

int kvr_api_decode_ix_register(kvr_api_decoder_t *d, const char *body, size_t len,
                               kvr_ix_register_t *out)
{
    DECODE(K_IX_REGISTER, finish_ix_register);
}

int kvr_api_decode_ix_unregister(kvr_api_decoder_t *d, const char *body, size_t len,
                                 kvr_ix_unregister_t *out)
{
    DECODE(K_IX_UNREGISTER, finish_ix_unregister);
}

int kvr_api_decode_ix_query(kvr_api_decoder_t *d, const char *body, size_t len, bool by_hash,
                            kvr_ix_query_t *out)
{
    DECODE(by_hash ? K_IX_HASH : K_IX_QUERY, finish_ix_query);
}

int kvr_api_decode_ix_peer(kvr_api_decoder_t *d, const char *body, size_t len,
                           kvr_ix_peer_t *out)
{
    DECODE(K_IX_PEER, finish_ix_peer);
}

int kvr_api_decode_ix_record(kvr_api_decoder_t *d, const char *body, size_t len,
                             kvr_ix_record_t *out)
{
    DECODE(K_IX_RECORD, finish_ix_record);
}

/* ------------------------------------------------------------------------------------------ */
/* Encoders. */

static void key_u64(kvr_json_writer_t *w, const char *k, uint64_t v)
{
    kvr_json_key(w, k);
    kvr_json_u64(w, v);
}

static void key_double(kvr_json_writer_t *w, const char *k, double v)
{
    kvr_json_key(w, k);
    kvr_json_double(w, v);
}

/* block_mm_infos: null for the blocks without objects, up to the last block with one. */
static void mm_list(kvr_json_writer_t *w, const kvr_block_mm_t *mm, size_t n)
{
    if (n == 0)
        return;
    kvr_json_key(w, "block_mm_infos");
    kvr_json_begin_array(w);
    uint32_t b = 0;
    for (size_t i = 0; i < n; i++) {
        for (; b < mm[i].block; b++)
            kvr_json_null(w);
        kvr_json_begin_object(w);
        kvr_json_key(w, "mm_objects");
        kvr_json_begin_array(w);
        for (size_t k = 0; k < mm[i].n_hashes; k++) {
            kvr_json_begin_object(w);
            kvr_json_key(w, "mm_hash");
            kvr_json_u64(w, mm[i].hashes[k]);
            kvr_json_end_object(w);
        }
        kvr_json_end_array(w);
        kvr_json_end_object(w);
        b = mm[i].block + 1;
    }
    kvr_json_end_array(w);
}

static void key_str(kvr_json_writer_t *w, const char *k, const char *s, size_t n)
{
    if (s == NULL)
        return;
    kvr_json_key(w, k);
    kvr_json_string_n(w, s, n);
}

static void tokens_array(kvr_json_writer_t *w, const uint32_t *tokens, size_t n)
{
    kvr_json_key(w, "tokens");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++)
        kvr_json_u64(w, tokens[i]);
    kvr_json_end_array(w);
}

static void string_array(kvr_json_writer_t *w, const char *k, const char *const *s, size_t n)
{
    kvr_json_key(w, k);
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++)
        kvr_json_string(w, s[i]);
    kvr_json_end_array(w);
}

static void constraints(kvr_json_writer_t *w, const char *const *req, size_t n_req,
                        const kvr_taint_weight_t *pref, size_t n_pref)
{
    if (n_req == 0 && n_pref == 0)
        return;
    kvr_json_key(w, "routing_constraints");
    kvr_json_begin_object(w);
    if (n_req > 0)
        string_array(w, "required_taints", req, n_req);
    if (n_pref > 0) {
        kvr_json_key(w, "preferred_taints");
        kvr_json_begin_object(w);
        for (size_t i = 0; i < n_pref; i++)
            key_double(w, pref[i].taint, pref[i].weight);
        kvr_json_end_object(w);
    }
    kvr_json_end_object(w);
}

int kvr_api_encode_route(kvr_json_writer_t *w, const kvr_api_route_t *r)
{
    kvr_json_begin_object(w);
    tokens_array(w, r->tokens, r->n_tokens);
    if (r->has_request_id)
        key_str(w, "request_id", r->request_id, strlen(r->request_id));
    kvr_json_key(w, "update_state");
    kvr_json_bool(w, r->update_state);
    if (r->disagg) {
        kvr_json_key(w, "disagg");
        kvr_json_bool(w, true);
    }
    key_str(w, "lora_name", r->lora_name, r->lora_name_len);
    key_str(w, "cache_namespace", r->cache_namespace, r->cache_namespace_len);
    if (r->has_allowed) {
        kvr_json_key(w, "allowed_worker_ids");
        kvr_json_begin_array(w);
        for (size_t i = 0; i < r->n_allowed; i++)
            kvr_json_u64(w, r->allowed_ids[i]);
        kvr_json_end_array(w);
    }
    if (r->has_pinned) {
        kvr_json_key(w, "pinned_worker");
        kvr_json_begin_object(w);
        key_u64(w, "worker_id", r->pinned.worker_id);
        key_u64(w, "dp_rank", r->pinned.dp_rank);
        kvr_json_end_object(w);
    }
    key_double(w, "priority_jump", r->priority_jump);
    if (r->has_expected_output_tokens)
        key_u64(w, "expected_output_tokens", r->expected_output_tokens);
    constraints(w, r->required_taints, r->n_required, r->preferred_taints, r->n_preferred);
    if (r->has_override) {
        const kvr_select_override_t *o = &r->ovr;
        kvr_json_key(w, "config_override");
        kvr_json_begin_object(w);
        if (o->has_overlap_score_credit)
            key_double(w, "overlap_score_credit", o->overlap_score_credit);
        if (o->has_prefill_load_scale)
            key_double(w, "prefill_load_scale", o->prefill_load_scale);
        if (o->has_temperature)
            key_double(w, "router_temperature", o->temperature);
        if (o->has_shared_cache_multiplier)
            key_double(w, "shared_cache_multiplier", o->shared_cache_multiplier);
        if (o->has_overlap_score_weight)
            key_double(w, "overlap_score_weight", o->overlap_score_weight);
        if (r->has_assume_kv_reuse) {
            kvr_json_key(w, "assume_kv_reuse");
            kvr_json_bool(w, r->assume_kv_reuse);
        }
        if (r->has_track_prefill_tokens) {
            kvr_json_key(w, "track_prefill_tokens");
            kvr_json_bool(w, r->track_prefill_tokens);
        }
        kvr_json_end_object(w);
    }
    key_str(w, "model", r->model, r->model_len);
    mm_list(w, r->mm, r->n_mm);
    if (r->session_id != NULL) {
        kvr_json_key(w, "session_control");
        kvr_json_begin_object(w);
        key_str(w, "session_id", r->session_id, r->session_id_len);
        key_str(w, "action", r->session_close ? "close" : "open", r->session_close ? 5 : 4);
        kvr_json_end_object(w);
    }
    return kvr_json_end_object(w);
}

int kvr_api_encode_output_block(kvr_json_writer_t *w, const kvr_api_output_block_t *r)
{
    kvr_json_begin_object(w);
    if (r->has_decay_fraction)
        key_double(w, "decay_fraction", r->decay_fraction);
    return kvr_json_end_object(w);
}

int kvr_api_encode_query(kvr_json_writer_t *w, const kvr_api_query_t *r)
{
    kvr_json_begin_object(w);
    tokens_array(w, r->tokens, r->n_tokens);
    key_str(w, "lora_name", r->lora_name, r->lora_name_len);
    key_str(w, "cache_namespace", r->cache_namespace, r->cache_namespace_len);
    return kvr_json_end_object(w);
}

int kvr_api_encode_worker(kvr_json_writer_t *w, const kvr_api_worker_t *r)
{
    kvr_json_begin_object(w);
    key_u64(w, "worker_id", r->worker_id);
    key_str(w, "url", r->url, r->url_len);
    key_str(w, "events", r->events, r->events_len);
    key_str(w, "replay", r->replay, r->replay_len);
    key_u64(w, "dp_size", r->dp_size);
    key_u64(w, "dp_start", r->dp_start);
    if (r->n_taints > 0)
        string_array(w, "taints", r->taints, r->n_taints);
    if (r->has_max_num_batched_tokens)
        key_u64(w, "max_num_batched_tokens", r->max_num_batched_tokens);
    if (r->has_total_kv_blocks)
        key_u64(w, "total_kv_blocks", r->total_kv_blocks);
    if (r->eagle) {
        kvr_json_key(w, "eagle");
        kvr_json_bool(w, true);
    }
    key_str(w, "model", r->model, r->model_len);
    if (r->block_size)
        key_u64(w, "block_size", r->block_size);
    key_str(w, "loras", r->loras, r->loras_len);
    key_str(w, "tokenizer", r->tokenizer, r->tokenizer_len);
    if (r->role != KVR_ROLE_BOTH) {
        kvr_json_key(w, "role");
        kvr_json_string(w, kvr_worker_role_name(r->role));
    }
    key_str(w, "bootstrap_host", r->bootstrap_host, r->bootstrap_host_len);
    if (r->bootstrap_port)
        key_u64(w, "bootstrap_port", r->bootstrap_port);
    return kvr_json_end_object(w);
}

static int copy_field(char *dst, size_t cap, const char *src, size_t len, const char *name,
                      char *err, size_t err_len)
{
    if (src == NULL)
        return KVR_OK;
    if (len >= cap) {
        snprintf(err, err_len, "%s: longer than %zu bytes", name, cap - 1);
        return KVR_EINVAL;
    }
    memcpy(dst, src, len);
    dst[len] = '\0';
    return KVR_OK;
}

int kvr_api_worker_to_spec(kvr_worker_spec_t *sp, const kvr_api_worker_t *a, char *err, size_t len)
{
    memset(sp, 0, sizeof *sp);
    sp->worker_id = a->worker_id;
    sp->dp_size = a->dp_size;
    sp->dp_start = a->dp_start;
    sp->max_num_batched_tokens = a->has_max_num_batched_tokens ? a->max_num_batched_tokens : 0;
    sp->total_kv_blocks = a->has_total_kv_blocks ? a->total_kv_blocks : 0;
    sp->eagle = a->eagle;
    if (a->n_taints > KVR_MAX_TAINTS) {
        snprintf(err, len, "taints: at most %d", KVR_MAX_TAINTS);
        return KVR_EINVAL;
    }
    for (size_t t = 0; t < a->n_taints; t++) {
        int rc = copy_field(sp->taints[t], KVR_TAINT_BYTES, a->taints[t], strlen(a->taints[t]),
                            "taints", err, len);
        if (rc != KVR_OK)
            return rc;
    }
    sp->n_taints = a->n_taints;
    int rc = copy_field(sp->url, sizeof sp->url, a->url, a->url_len, "url", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->events, sizeof sp->events, a->events, a->events_len, "events", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->replay, sizeof sp->replay, a->replay, a->replay_len, "replay", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->model, sizeof sp->model, a->model, a->model_len, "model", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->loras, sizeof sp->loras, a->loras, a->loras_len, "loras", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->tokenizer, sizeof sp->tokenizer, a->tokenizer, a->tokenizer_len,
                        "tokenizer", err, len);
    if (rc == KVR_OK)
        rc = copy_field(sp->bootstrap_host, sizeof sp->bootstrap_host, a->bootstrap_host,
                        a->bootstrap_host_len, "bootstrap_host", err, len);
    sp->block_size = a->block_size;
    sp->role = a->role;
    sp->bootstrap_port = a->bootstrap_port;
    return rc;
}

int kvr_api_encode_worker_spec(kvr_json_writer_t *w, const kvr_worker_spec_t *sp)
{
    const char *taints[KVR_MAX_TAINTS];
    for (size_t t = 0; t < sp->n_taints && t < KVR_MAX_TAINTS; t++)
        taints[t] = sp->taints[t];
    kvr_api_worker_t a = {.worker_id = sp->worker_id,
                          .url = sp->url[0] ? sp->url : NULL,
                          .url_len = strlen(sp->url),
                          .events = sp->events[0] ? sp->events : NULL,
                          .events_len = strlen(sp->events),
                          .replay = sp->replay[0] ? sp->replay : NULL,
                          .replay_len = strlen(sp->replay),
                          .dp_size = sp->dp_size,
                          .dp_start = sp->dp_start,
                          .taints = taints,
                          .n_taints = sp->n_taints < KVR_MAX_TAINTS ? sp->n_taints : KVR_MAX_TAINTS,
                          .has_max_num_batched_tokens = sp->max_num_batched_tokens != 0,
                          .max_num_batched_tokens = sp->max_num_batched_tokens,
                          .has_total_kv_blocks = sp->total_kv_blocks != 0,
                          .total_kv_blocks = sp->total_kv_blocks,
                          .eagle = sp->eagle,
                          .model = sp->model[0] ? sp->model : NULL,
                          .model_len = strlen(sp->model),
                          .block_size = sp->block_size,
                          .loras = sp->loras[0] ? sp->loras : NULL,
                          .loras_len = strlen(sp->loras),
                          .tokenizer = sp->tokenizer[0] ? sp->tokenizer : NULL,
                          .tokenizer_len = strlen(sp->tokenizer),
                          .role = sp->role,
                          .bootstrap_host = sp->bootstrap_host[0] ? sp->bootstrap_host : NULL,
                          .bootstrap_host_len = strlen(sp->bootstrap_host),
                          .bootstrap_port = sp->bootstrap_port};
    return kvr_api_encode_worker(w, &a);
}

int kvr_api_encode_router(kvr_json_writer_t *w, const kvr_api_router_t *r)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "method");
    kvr_json_string(w, kvr_api_router_method_name(r->method));
    if (r->method == KVR_API_ROUTER_NEW || r->method == KVR_API_ROUTER_POTENTIAL_LOADS) {
        tokens_array(w, r->tokens, r->n_tokens);
        key_str(w, "lora_name", r->lora_name, r->lora_name_len);
        key_str(w, "cache_namespace", r->cache_namespace, r->cache_namespace_len);
    }
    if (r->method != KVR_API_ROUTER_POTENTIAL_LOADS && r->has_request_id)
        key_str(w, "request_id", r->request_id, strlen(r->request_id));
    if (r->method == KVR_API_ROUTER_NEW) {
        key_double(w, "priority_jump", r->priority_jump);
        key_u64(w, "strict_priority", r->strict_priority);
        constraints(w, r->required_taints, r->n_required, r->preferred_taints, r->n_preferred);
        mm_list(w, r->mm, r->n_mm);
    }
    return kvr_json_end_object(w);
}

int kvr_api_encode_route_response(kvr_json_writer_t *w, const kvr_api_route_response_t *r)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "request_id");
    kvr_json_string(w, r->request_id);
    key_u64(w, "worker_id", r->worker.worker_id);
    key_u64(w, "dp_rank", r->worker.dp_rank);
    key_u64(w, "overlap_blocks", r->overlap_blocks);
    key_u64(w, "cached_tokens", r->cached_tokens);
    return kvr_json_end_object(w);
}
