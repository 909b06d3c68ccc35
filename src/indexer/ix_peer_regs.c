/*
 * ix_peer_regs.c: a peer's GET /workers answer read back as registrations (what is read and
 * refused, ownership and cost in ix_peer_regs.h). Each array entry is walked once to find its
 * members, then its "endpoints" object gives one registration per rank and its
 * "replay_endpoints" object fills the replay addresses of those same ranks.
 */
#include "indexer/ix_peer_regs.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kvrouter.h"
#include "wire/json_scan.h"

/* One entry's members, as found. */
typedef struct inst {
    uint64_t id;
    uint32_t block_size;
    const char *model, *group;
    size_t model_len, group_len;
    size_t endpoints, replays; /* where those objects open ('{'); 0 = absent */
    unsigned seen;             /* SEEN_* bits: a known member given twice is refused */
    const char *why;           /* the entry cannot be taken as given */
} inst_t;

enum { SEEN_ID = 1, SEEN_MODEL = 2, SEEN_GROUP = 4, SEEN_BS = 8, SEEN_EP = 16, SEEN_RP = 32,
       SEEN_SOURCE = 64 };

typedef struct reader {
    const char *b;
    size_t len, max;
    kvr_ix_peer_reg_t *out;
    size_t n, cap;
    char *err;
    size_t err_len;
    size_t entry; /* the entry being read, for messages */
} reader_t;

static int fail(reader_t *rd, const char *what)
{
    snprintf(rd->err, rd->err_len, "GET /workers: entry %zu: %s", rd->entry, what);
    return KVR_EPARSE;
}

/* Decimal digits b[i..e) (no sign, no leading zero) as a number <= max. */
static bool uint_of(const char *b, size_t i, size_t e, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (i >= e || (b[i] == '0' && e - i > 1))
        return false;
    for (; i < e; i++) {
        if (b[i] < '0' || b[i] > '9')
            return false;
        uint64_t d = (uint64_t)(b[i] - '0');
        if (v > (max - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* The string value of m (without its quotes): false when it is not a string; *why set when it
 * holds escapes (its bytes are not its value). */
static bool str_of(const char *b, const kvr_json_member_t *m, const char **s, size_t *n,
                   const char **why)
{
    if (b[m->val] != '"')
        return false;
    *s = b + m->val + 1;
    *n = m->val_end - m->val - 2;
    if (memchr(*s, '\\', *n) != NULL)
        *why = "a name or an address with escapes";
    return true;
}

/* The rank a member's key names (a decimal dp_rank). */
static bool rank_of(const char *b, const kvr_json_member_t *m, uint32_t *rank)
{
    uint64_t v;
    if (!uint_of(b, m->key + 1, m->key_end - 1, UINT32_MAX, &v))
        return false;
    *rank = (uint32_t)v;
    return true;
}

static bool once(inst_t *in, unsigned bit)
{
    if (in->seen & bit)
        return false;
    in->seen |= bit;
    return true;
}

/* One member of an entry into *in: 0, or a status (err set). */
static int take_member(reader_t *rd, inst_t *in, const kvr_json_member_t *m)
{
    const char *b = rd->b;
    uint64_t v;
    if (kvr_json_key_is(b, m, "instance_id")) {
        if (!once(in, SEEN_ID) || !uint_of(b, m->val, m->val_end, UINT64_MAX, &in->id))
            return fail(rd, "instance_id: an unsigned integer, once");
    } else if (kvr_json_key_is(b, m, "block_size")) {
        if (!once(in, SEEN_BS) || !uint_of(b, m->val, m->val_end, 65536, &v) || v == 0)
            return fail(rd, "block_size: an integer in [1, 65536], once");
        in->block_size = (uint32_t)v;
    } else if (kvr_json_key_is(b, m, "model_name")) {
        if (!once(in, SEEN_MODEL) || !str_of(b, m, &in->model, &in->model_len, &in->why))
            return fail(rd, "model_name: a string, once");
    } else if (kvr_json_key_is(b, m, "routing_group")) {
        if (!once(in, SEEN_GROUP) || !str_of(b, m, &in->group, &in->group_len, &in->why))
            return fail(rd, "routing_group: a string, once");
    } else if (kvr_json_key_is(b, m, "source")) {
        const char *s;
        size_t n;
        if (!once(in, SEEN_SOURCE) || !str_of(b, m, &s, &n, &in->why))
            return fail(rd, "source: a string, once");
        if (n != 3 || memcmp(s, "zmq", 3) != 0)
            in->why = "its source is not ZeroMQ (\"zmq\"): nothing to subscribe to";
    } else if (kvr_json_key_is(b, m, "endpoints") || kvr_json_key_is(b, m, "replay_endpoints")) {
        bool ep = kvr_json_key_is(b, m, "endpoints");
        if (!once(in, ep ? SEEN_EP : SEEN_RP) || b[m->val] != '{')
            return fail(rd, ep ? "endpoints: an object {\"<dp_rank>\": address}, once"
                               : "replay_endpoints: an object {\"<dp_rank>\": address}, once");
        *(ep ? &in->endpoints : &in->replays) = m->val;
    }
    return 0;
}

/* The entry of instance in's rank among out[first..n), or NULL. */
static kvr_ix_peer_reg_t *rank_entry(reader_t *rd, size_t first, uint32_t rank)
{
    for (size_t i = first; i < rd->n; i++)
        if (rd->out[i].r.dp_rank == rank)
            return &rd->out[i];
    return NULL;
}

/* One registration per member of the endpoints object. */
static int take_endpoints(reader_t *rd, const inst_t *in, size_t first)
{
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int got;
    kvr_json_object_begin(&it, rd->b, rd->len, in->endpoints, KVR_JSON_STRICT);
    while ((got = kvr_json_object_next(&it, &m)) > 0) {
        uint32_t rank;
        const char *why = in->why, *s;
        size_t n;
        if (!rank_of(rd->b, &m, &rank) || rank_entry(rd, first, rank) != NULL ||
            !str_of(rd->b, &m, &s, &n, &why))
            return fail(rd, "endpoints: each rank once, a decimal dp_rank naming a string");
        if (rd->n >= rd->max || rd->n - first >= KVR_IX_PART_MAX_RANKS) {
            snprintf(rd->err, rd->err_len,
                     "GET /workers: more than %zu registrations, or %d ranks in entry %zu",
                     rd->max, KVR_IX_PART_MAX_RANKS, rd->entry);
            return KVR_EFULL;
        }
        if (kvr_grow((void **)&rd->out, &rd->cap, rd->n + 1, rd->max, sizeof *rd->out) != KVR_OK)
            return KVR_ENOMEM;
        kvr_ix_peer_reg_t *e = &rd->out[rd->n++];
        *e = (kvr_ix_peer_reg_t){.r = {.instance_id = in->id,
                                       .endpoint = s,
                                       .endpoint_len = n,
                                       .model_name = in->model,
                                       .model_name_len = in->model_len,
                                       .routing_group = in->group,
                                       .routing_group_len = in->group_len,
                                       .block_size = in->block_size,
                                       .dp_rank = rank},
                                 .why = why};
    }
    if (got < 0 || rd->n == first)
        return fail(rd, "endpoints: at least one rank");
    return 0;
}

/* The replay address of each rank replay_endpoints names (a rank endpoints has). */
static int take_replays(reader_t *rd, const inst_t *in, size_t first)
{
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int got;
    kvr_json_object_begin(&it, rd->b, rd->len, in->replays, KVR_JSON_STRICT);
    while ((got = kvr_json_object_next(&it, &m)) > 0) {
        uint32_t rank;
        kvr_ix_peer_reg_t *e = rank_of(rd->b, &m, &rank) ? rank_entry(rd, first, rank) : NULL;
        const char *s;
        size_t n;
        if (e == NULL || e->r.replay_endpoint != NULL || !str_of(rd->b, &m, &s, &n, &e->why))
            return fail(rd, "replay_endpoints: each rank once, one of endpoints', naming a "
                            "string");
        e->r.replay_endpoint = s;
        e->r.replay_endpoint_len = n;
    }
    return got < 0 ? fail(rd, "replay_endpoints: not an object") : 0;
}

/* The entry whose object opens at b[i]; *close: where it closes. */
static int take_entry(reader_t *rd, size_t i, size_t *close)
{
    inst_t in = {.group = KVR_IX_DEFAULT_GROUP, .group_len = strlen(KVR_IX_DEFAULT_GROUP)};
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int got = 0, rc = 0;
    kvr_json_object_begin(&it, rd->b, rd->len, i, KVR_JSON_STRICT);
    while (rc == 0 && (got = kvr_json_object_next(&it, &m)) > 0)
        if (!kvr_json_member_is_null(rd->b, &m)) /* null is absent */
            rc = take_member(rd, &in, &m);
    if (rc != 0)
        return rc;
    if (got < 0)
        return fail(rd, "not a JSON object");
    if ((in.seen & (SEEN_ID | SEEN_MODEL | SEEN_BS | SEEN_EP)) !=
        (SEEN_ID | SEEN_MODEL | SEEN_BS | SEEN_EP))
        return fail(rd, "instance_id, model_name, block_size and endpoints are required");
    *close = it.close;
    size_t first = rd->n;
    rc = take_endpoints(rd, &in, first);
    return rc == 0 && in.replays != 0 ? take_replays(rd, &in, first) : rc;
}

int kvr_ix_peer_regs_read(const char *b, size_t len, size_t max, kvr_ix_peer_reg_t **out,
                          size_t *n, char *err, size_t err_len)
{
    reader_t rd = {.b = b, .len = len, .max = max, .err = err, .err_len = err_len};
    *out = NULL;
    *n = 0;
    if (err_len > 0)
        err[0] = '\0';
    size_t i = kvr_json_skip_ws(b, len, 0);
    int rc = i < len && b[i] == '[' ? 0 : KVR_EPARSE;
    i = rc == 0 ? kvr_json_skip_ws(b, len, i + 1) : len;
    while (rc == 0 && i < len && b[i] != ']') { /* entries, one comma between two */
        size_t close = len; /* take_entry sets it when it succeeds */
        rc = b[i] == '{' ? take_entry(&rd, i, &close) : fail(&rd, "not a JSON object");
        i = rc == 0 ? kvr_json_skip_ws(b, len, close + 1) : len;
        if (i < len && b[i] == ',') {
            i = kvr_json_skip_ws(b, len, i + 1);
            rc = i < len && b[i] == '{' ? rc : KVR_EPARSE;
        } else if (i < len && b[i] != ']') {
            rc = KVR_EPARSE;
        }
        rd.entry++;
    }
    if (rc == 0 && (i >= len || kvr_json_skip_ws(b, len, i + 1) != len))
        rc = KVR_EPARSE;
    if (rc == KVR_EPARSE && err_len > 0 && err[0] == '\0')
        snprintf(err, err_len, "GET /workers: not an array of registrations");
    if (rc == KVR_ENOMEM)
        snprintf(err, err_len, "GET /workers: out of memory reading the registrations");
    if (rc != 0) {
        free(rd.out);
        return rc;
    }
    *out = rd.out;
    *n = rd.n;
    return KVR_OK;
}
