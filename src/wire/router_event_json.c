/*
 * router_event_json.c: the reference's RouterEvent in JSON, written and read (shapes, rules
 * and costs in router_event_json.h). Reading walks the text with the strict scanner
 * (wire/json_scan.h) instead of yajl callbacks: a dump is a fixed, shallow shape, and finding
 * members by key keeps each level a small function.
 */
#include "wire/router_event_json.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "wire/json_decode.h"
#include "wire/json_scan.h"

static const char *const TIER_NAMES[KVR_N_TIERS] = {"device", "host_pinned", "disk", "external"};

/* ---- writing ----------------------------------------------------------------------------- */

/* "stored": {...}: the reference's members (start_position, mm_extra_info, always null here)
 * only in its shape. */
static void stored_data(kvr_json_writer_t *w, const kvr_event_t *ev, bool reference)
{
    kvr_json_key(w, "stored");
    kvr_json_begin_object(w);
    kvr_json_key(w, "parent_hash");
    if (ev->has_parent)
        kvr_json_u64(w, ev->parent_ext);
    else
        kvr_json_null(w);
    if (reference) {
        kvr_json_key(w, "start_position");
        kvr_json_null(w);
    }
    kvr_json_key(w, "blocks");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < ev->n_blocks; i++) {
        kvr_json_begin_object(w);
        kvr_json_key(w, "block_hash");
        kvr_json_u64(w, ev->blocks[i].ext);
        kvr_json_key(w, "tokens_hash");
        kvr_json_u64(w, ev->blocks[i].lbh);
        if (reference) {
            kvr_json_key(w, "mm_extra_info");
            kvr_json_null(w);
        }
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    kvr_json_end_object(w);
}

static void removed_data(kvr_json_writer_t *w, const kvr_event_t *ev)
{
    kvr_json_key(w, "removed");
    kvr_json_begin_object(w);
    kvr_json_key(w, "block_hashes");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < ev->n_removed; i++)
        kvr_json_u64(w, ev->removed[i]);
    kvr_json_end_array(w);
    kvr_json_end_object(w);
}

int kvr_dump_event_encode(kvr_json_writer_t *w, const kvr_event_t *ev)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "worker_id");
    kvr_json_u64(w, ev->worker.worker_id);
    kvr_json_key(w, "dp_rank");
    kvr_json_u64(w, ev->worker.dp_rank);
    kvr_json_key(w, "storage_tier");
    kvr_json_string(w, TIER_NAMES[ev->tier & 3]);
    kvr_json_key(w, "event_id");
    kvr_json_u64(w, ev->event_id);
    if (ev->kind == KVR_EV_STORED)
        stored_data(w, ev, false);
    else
        removed_data(w, ev);
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

int kvr_rev_encode(kvr_json_writer_t *w, const kvr_event_t *ev)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "worker_id");
    kvr_json_u64(w, ev->worker.worker_id);
    kvr_json_key(w, "storage_tier");
    kvr_json_string(w, TIER_NAMES[ev->tier & 3]);
    kvr_json_key(w, "event");
    kvr_json_begin_object(w);
    kvr_json_key(w, "event_id");
    kvr_json_u64(w, ev->event_id);
    kvr_json_key(w, "data");
    if (ev->kind == KVR_EV_CLEARED) {
        kvr_json_string(w, "cleared");
    } else {
        kvr_json_begin_object(w);
        if (ev->kind == KVR_EV_STORED)
            stored_data(w, ev, true);
        else
            removed_data(w, ev);
        kvr_json_end_object(w);
    }
    kvr_json_key(w, "dp_rank");
    kvr_json_u64(w, ev->worker.dp_rank);
    kvr_json_end_object(w);
    kvr_json_end_object(w);
    return kvr_json_writer_status(w);
}

/* ---- reading ----------------------------------------------------------------------------- */

typedef struct rd {
    const char *b;
    size_t n;
    int status;
    char *err;
    size_t err_len;
    char where[160]; /* "<partition>" or "<partition>: events[i]" */
    const char *sep; /* between where and the message: ": " or "." */
    kvr_block_t *blocks;
    size_t blocks_cap;
    uint64_t *removed;
    size_t removed_cap;
} rd_t;

__attribute__((format(printf, 3, 4))) static int rfail(rd_t *r, int st, const char *fmt, ...)
{
    if (r->status != KVR_OK)
        return r->status;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = st;
    if (r->err_len > 0)
        snprintf(r->err, r->err_len, "%s%s%s", r->where, r->where[0] ? r->sep : "", msg);
    return st;
}

/* The member of the object at b[i] named name: its value's span, or false. */
static bool member(rd_t *r, size_t i, const char *name, size_t *val, size_t *val_end)
{
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, r->b, r->n, i, KVR_JSON_STRICT);
    int got;
    while ((got = kvr_json_object_next(&it, &m)) > 0) {
        if (kvr_json_key_is(r->b, &m, name)) {
            *val = m.val;
            *val_end = m.val_end;
            return true;
        }
    }
    return false;
}

static bool is_null(const rd_t *r, size_t v, size_t e)
{
    return e - v == 4 && memcmp(r->b + v, "null", 4) == 0;
}

/* A hash: u64, or i64 read as its two's complement. */
static bool read_hash(const rd_t *r, size_t v, size_t e, uint64_t *out)
{
    uint64_t mag;
    bool neg;
    if (!kvr_jd_parse_int(r->b + v, e - v, &mag, &neg) || (neg && mag > ((uint64_t)1 << 63)))
        return false;
    *out = neg ? (uint64_t)0 - mag : mag;
    return true;
}

static int need_hash(rd_t *r, size_t obj, const char *key, const char *path, uint64_t *out)
{
    size_t v, e;
    if (!member(r, obj, key, &v, &e))
        return rfail(r, KVR_EINVAL, "%s.%s: missing", path, key);
    if (!read_hash(r, v, e, out))
        return rfail(r, KVR_EINVAL, "%s.%s: not an integer in [-2^63, 2^64)", path, key);
    return KVR_OK;
}

/* Calls fn on each element of the array at b[i]; false when it is not an array. */
typedef int (*elem_fn)(rd_t *r, size_t idx, size_t v, size_t e, void *ud);
static int each_elem(rd_t *r, size_t i, const char *path, elem_fn fn, void *ud)
{
    if (r->b[i] != '[')
        return rfail(r, KVR_EINVAL, "%s: must be an array", path);
    size_t p = kvr_json_skip_ws(r->b, r->n, i + 1);
    if (p < r->n && r->b[p] == ']')
        return KVR_OK;
    for (size_t idx = 0;; idx++) {
        size_t e = kvr_json_skip_value(r->b, r->n, p, KVR_JSON_STRICT);
        if (e == KVR_JSON_BAD)
            return rfail(r, KVR_EPARSE, "%s[%zu]: invalid JSON at byte %zu", path, idx, p);
        if (fn(r, idx, p, e, ud) != KVR_OK)
            return r->status;
        p = kvr_json_skip_ws(r->b, r->n, e);
        if (p < r->n && r->b[p] == ']')
            return KVR_OK;
        if (p >= r->n || r->b[p] != ',')
            return rfail(r, KVR_EPARSE, "%s: invalid JSON at byte %zu", path, p);
        p = kvr_json_skip_ws(r->b, r->n, p + 1);
    }
}

static int block_elem(rd_t *r, size_t idx, size_t v, size_t e, void *ud)
{
    (void)e;
    size_t *n = ud;
    char path[64];
    snprintf(path, sizeof path, "event.data.stored.blocks[%zu]", idx);
    if (r->b[v] != '{')
        return rfail(r, KVR_EINVAL, "%s: must be an object", path);
    if (kvr_grow((void **)&r->blocks, &r->blocks_cap, idx + 1, SIZE_MAX, sizeof *r->blocks) !=
        KVR_OK)
        return rfail(r, KVR_ENOMEM, "out of memory");
    if (need_hash(r, v, "block_hash", path, &r->blocks[idx].ext) != KVR_OK ||
        need_hash(r, v, "tokens_hash", path, &r->blocks[idx].lbh) != KVR_OK)
        return r->status;
    *n = idx + 1;
    return KVR_OK;
}

static int removed_elem(rd_t *r, size_t idx, size_t v, size_t e, void *ud)
{
    size_t *n = ud;
    if (kvr_grow((void **)&r->removed, &r->removed_cap, idx + 1, SIZE_MAX, sizeof *r->removed) !=
        KVR_OK)
        return rfail(r, KVR_ENOMEM, "out of memory");
    if (!read_hash(r, v, e, &r->removed[idx]))
        return rfail(r, KVR_EINVAL,
                     "event.data.removed.block_hashes[%zu]: not an integer in [-2^63, 2^64)", idx);
    *n = idx + 1;
    return KVR_OK;
}

static int read_stored(rd_t *r, size_t v, kvr_event_t *ev)
{
    size_t pv, pe;
    ev->kind = KVR_EV_STORED;
    if (member(r, v, "parent_hash", &pv, &pe) && !is_null(r, pv, pe)) {
        if (!read_hash(r, pv, pe, &ev->parent_ext))
            return rfail(r, KVR_EINVAL,
                         "event.data.stored.parent_hash: not an integer in [-2^63, 2^64)");
        ev->has_parent = true;
    }
    size_t bv, be, n = 0;
    if (!member(r, v, "blocks", &bv, &be))
        return rfail(r, KVR_EINVAL, "event.data.stored.blocks: missing");
    if (each_elem(r, bv, "event.data.stored.blocks", block_elem, &n) != KVR_OK)
        return r->status;
    if (n == 0)
        return rfail(r, KVR_EINVAL, "event.data.stored.blocks: empty");
    ev->blocks = r->blocks;
    ev->n_blocks = n;
    return KVR_OK;
}

static int read_data(rd_t *r, size_t v, size_t e, kvr_event_t *ev)
{
    if (e - v == 9 && memcmp(r->b + v, "\"cleared\"", 9) == 0) {
        ev->kind = KVR_EV_CLEARED;
        return KVR_OK;
    }
    if (r->b[v] != '{')
        return rfail(r, KVR_EINVAL, "event.data: must be \"cleared\" or an object");
    size_t sv, se;
    if (member(r, v, "stored", &sv, &se)) {
        if (r->b[sv] != '{')
            return rfail(r, KVR_EINVAL, "event.data.stored: must be an object");
        return read_stored(r, sv, ev);
    }
    if (member(r, v, "removed", &sv, &se)) {
        size_t hv, he, n = 0;
        if (r->b[sv] != '{' || !member(r, sv, "block_hashes", &hv, &he))
            return rfail(r, KVR_EINVAL, "event.data.removed.block_hashes: missing");
        if (each_elem(r, hv, "event.data.removed.block_hashes", removed_elem, &n) != KVR_OK)
            return r->status;
        ev->kind = KVR_EV_REMOVED;
        ev->removed = r->removed;
        ev->n_removed = n;
        return KVR_OK;
    }
    return rfail(r, KVR_EINVAL, "event.data: none of stored, removed, \"cleared\"");
}

static int read_tier(rd_t *r, size_t obj, kvr_tier_t *out)
{
    size_t v, e;
    *out = KVR_TIER_DEVICE;
    if (!member(r, obj, "storage_tier", &v, &e) || is_null(r, v, e))
        return KVR_OK;
    for (int t = 0; t < KVR_N_TIERS; t++) {
        size_t len = strlen(TIER_NAMES[t]);
        if (e - v == len + 2 && r->b[v] == '"' &&
            strncasecmp(r->b + v + 1, TIER_NAMES[t], len) == 0) {
            *out = (kvr_tier_t)t;
            return KVR_OK;
        }
    }
    return rfail(r, KVR_EINVAL, "storage_tier: not one of device, host_pinned, disk, external");
}

static int u64_member(rd_t *r, size_t obj, const char *key, const char *path, bool required,
                      uint64_t max, uint64_t *out)
{
    size_t v, e;
    *out = 0;
    if (!member(r, obj, key, &v, &e) || is_null(r, v, e))
        return required ? rfail(r, KVR_EINVAL, "%s: missing", path) : KVR_OK;
    if (!kvr_jd_parse_u64(r->b + v, e - v, 0, max, out))
        return rfail(r, KVR_EINVAL, "%s: not an integer in [0, %llu]", path,
                     (unsigned long long)max);
    return KVR_OK;
}

typedef struct part_ctx {
    const kvr_rev_sink_t *sink;
    kvr_rev_report_t *rep;
    const char *label;
} part_ctx_t;

static int event_elem(rd_t *r, size_t idx, size_t v, size_t e, void *ud)
{
    (void)e;
    part_ctx_t *pc = ud;
    snprintf(r->where, sizeof r->where, "%s: events[%zu]", pc->label, idx);
    r->sep = ".";
    if (r->b[v] != '{')
        return rfail(r, KVR_EINVAL, "must be an object");
    kvr_event_t ev = {0};
    size_t evv, eve;
    if (u64_member(r, v, "worker_id", "worker_id", true, UINT64_MAX, &ev.worker.worker_id) !=
            KVR_OK ||
        read_tier(r, v, &ev.tier) != KVR_OK)
        return r->status;
    if (!member(r, v, "event", &evv, &eve) || r->b[evv] != '{')
        return rfail(r, KVR_EINVAL, "event: missing or not an object");
    uint64_t rank;
    if (u64_member(r, evv, "event_id", "event.event_id", false, UINT64_MAX, &ev.event_id) !=
            KVR_OK ||
        u64_member(r, evv, "dp_rank", "event.dp_rank", false, UINT32_MAX, &rank) != KVR_OK)
        return r->status;
    ev.worker.dp_rank = (uint32_t)rank;
    size_t dv, de;
    if (!member(r, evv, "data", &dv, &de))
        return rfail(r, KVR_EINVAL, "event.data: missing");
    if (read_data(r, dv, de, &ev) != KVR_OK)
        return r->status;
    int rc = pc->sink->event(pc->sink->ud, &ev);
    if (rc != 0)
        return rfail(r, rc < 0 ? rc : KVR_EINVAL, "refused: %s", kvr_strerror(rc));
    pc->rep->events++;
    return KVR_OK;
}

static int read_partition(rd_t *r, const kvr_json_member_t *m, const kvr_rev_sink_t *sink,
                          kvr_rev_report_t *rep)
{
    size_t klen = m->key_end - m->key - 2;
    const char *key = r->b + m->key + 1;
    char label[80];
    kvr_jd_clip(label, sizeof label, (const unsigned char *)key, klen);
    snprintf(r->where, sizeof r->where, "%s", label);
    r->sep = ": ";
    if (memchr(key, '\\', klen) != NULL || memchr(key, ':', klen) == NULL)
        return rfail(r, KVR_EINVAL, "partition key: must read <model>:<group> without escapes");
    if (r->b[m->val] != '{')
        return rfail(r, KVR_EINVAL, "must be an object");
    size_t v, e;
    if (member(r, m->val, "error", &v, &e)) {
        rep->partitions_failed++;
        return KVR_OK;
    }
    uint64_t bs;
    if (u64_member(r, m->val, "block_size", "block_size", true, 65536, &bs) != KVR_OK)
        return r->status;
    if (bs == 0)
        return rfail(r, KVR_EINVAL, "block_size: must be at least 1");
    int rc = sink->partition(sink->ud, key, klen, (uint32_t)bs);
    if (rc != 0)
        return rfail(r, rc < 0 ? rc : KVR_EINVAL, "refused: %s", kvr_strerror(rc));
    rep->partitions++;
    if (!member(r, m->val, "events", &v, &e))
        return rfail(r, KVR_EINVAL, "events: missing");
    part_ctx_t pc = {sink, rep, label};
    return each_elem(r, v, "events", event_elem, &pc);
}

int kvr_rev_decode_dump(const char *text, size_t len, const kvr_rev_sink_t *sink,
                        kvr_rev_report_t *rep, char *err, size_t err_len)
{
    kvr_rev_report_t r0;
    rep = rep ? rep : &r0;
    memset(rep, 0, sizeof *rep);
    if (err_len > 0)
        err[0] = '\0';
    rd_t r = {.b = text, .n = text ? len : 0, .err = err, .err_len = err_len};
    size_t i = kvr_json_skip_ws(r.b, r.n, 0);
    size_t end = i < r.n ? kvr_json_skip_value(r.b, r.n, i, KVR_JSON_STRICT) : KVR_JSON_BAD;
    if (end == KVR_JSON_BAD || r.b[i] != '{' || kvr_json_skip_ws(r.b, r.n, end) != r.n) {
        rfail(&r, KVR_EPARSE, "dump: not one JSON object");
    } else {
        kvr_json_iter_t it;
        kvr_json_member_t m;
        kvr_json_object_begin(&it, r.b, r.n, i, KVR_JSON_STRICT);
        int got;
        while (r.status == KVR_OK && (got = kvr_json_object_next(&it, &m)) > 0)
            (void)read_partition(&r, &m, sink, rep);
    }
    free(r.blocks);
    free(r.removed);
    return r.status;
}
