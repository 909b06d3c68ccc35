/*
 * index_snapshot.c: see index_snapshot.h.
 *
 * Invariants: a writer's checksum covers every byte it handed to the sink; a reader only
 * hands out events from a buffer whose every record was checked by kvr_snap_open.
 */
#include "wire/index_snapshot.h"
#include "base/le.h"
#include "wire/parse_fail.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#define MAGIC KVR_SNAP_MAGIC
#define HEADER_BYTES 32u
#define RANK_BYTES 32u
#define EVENT_HEAD_BYTES 12u
#define TRAILER_BYTES 16u

enum { K_STORED = 1, K_REMOVED = 2, K_CLEARED = 3 };

/* ---- writing ---- */

struct kvr_snap_writer {
    kvr_snap_sink_fn sink;
    void *ud;
    XXH3_state_t *hash;
    uint32_t n_ranks;
    uint64_t n_events;
    int failed; /* the first sink error; nothing is written after it */
};

static int emit(kvr_snap_writer_t *w, const void *p, size_t n)
{
    if (w->failed != KVR_OK)
        return w->failed;
    XXH3_64bits_update(w->hash, p, n);
    int rc = w->sink(w->ud, p, n);
    if (rc != 0)
        w->failed = rc;
    return rc;
}

kvr_snap_writer_t *kvr_snap_writer_new(kvr_snap_sink_fn sink, void *ud, uint32_t block_size,
                                       uint64_t saved_unix_ms, const kvr_snap_rank_t *ranks,
                                       uint32_t n_ranks, int *status)
{
    int dummy;
    if (status == NULL)
        status = &dummy;
    if (sink == NULL || block_size == 0 || n_ranks > KVR_SNAP_MAX_RANKS ||
        (n_ranks > 0 && ranks == NULL)) {
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_snap_writer_t *w = calloc(1, sizeof *w);
    if (w == NULL || (w->hash = XXH3_createState()) == NULL) {
        free(w);
        *status = KVR_ENOMEM;
        return NULL;
    }
    XXH3_64bits_reset(w->hash);
    w->sink = sink;
    w->ud = ud;
    w->n_ranks = n_ranks;
    uint8_t h[HEADER_BYTES] = {0};
    memcpy(h, MAGIC, 8);
    kvr_put_le32(h + 8, KVR_SNAP_VERSION);
    kvr_put_le32(h + 12, block_size);
    kvr_put_le64(h + 16, saved_unix_ms);
    kvr_put_le32(h + 24, n_ranks);
    int rc = emit(w, h, sizeof h);
    for (uint32_t i = 0; rc == KVR_OK && i < n_ranks; i++) {
        uint8_t b[RANK_BYTES] = {0};
        kvr_put_le64(b, ranks[i].worker_id);
        kvr_put_le32(b + 8, ranks[i].dp_rank);
        kvr_put_le64(b + 16, ranks[i].last_seq);
        kvr_put_le64(b + 24, ranks[i].last_hash);
        rc = emit(w, b, sizeof b);
    }
    if (rc != KVR_OK) {
        kvr_snap_writer_free(w);
        *status = rc;
        return NULL;
    }
    *status = KVR_OK;
    return w;
}

int kvr_snap_write_event(kvr_snap_writer_t *w, uint32_t rank, const kvr_event_t *ev)
{
    if (w == NULL || ev == NULL || rank >= w->n_ranks || (unsigned)ev->tier >= KVR_N_TIERS)
        return KVR_EINVAL;
    uint8_t h[EVENT_HEAD_BYTES + 8] = {0};
    uint32_t n = 0;
    switch (ev->kind) {
    case KVR_EV_STORED:
        if (ev->n_blocks == 0 || ev->n_blocks > UINT32_MAX || ev->blocks == NULL)
            return KVR_EINVAL;
        h[0] = K_STORED;
        n = (uint32_t)ev->n_blocks;
        break;
    case KVR_EV_REMOVED:
        if (ev->n_removed > UINT32_MAX || (ev->n_removed > 0 && ev->removed == NULL))
            return KVR_EINVAL;
        h[0] = K_REMOVED;
        n = (uint32_t)ev->n_removed;
        break;
    case KVR_EV_CLEARED:
        h[0] = K_CLEARED;
        break;
    default:
        return KVR_EINVAL;
    }
    h[1] = (uint8_t)ev->tier;
    h[2] = ev->kind == KVR_EV_STORED && ev->has_parent;
    kvr_put_le32(h + 4, rank);
    kvr_put_le32(h + 8, n);
    size_t hl = EVENT_HEAD_BYTES;
    if (ev->kind == KVR_EV_STORED) {
        kvr_put_le64(h + hl, ev->has_parent ? ev->parent_ext : 0);
        hl += 8;
    }
    int rc = emit(w, h, hl);
    for (uint32_t i = 0; rc == KVR_OK && i < n; i++) {
        uint8_t b[16];
        if (ev->kind == KVR_EV_STORED) {
            kvr_put_le64(b, ev->blocks[i].ext);
            kvr_put_le64(b + 8, ev->blocks[i].lbh);
            rc = emit(w, b, 16);
        } else {
            kvr_put_le64(b, ev->removed[i]);
            rc = emit(w, b, 8);
        }
    }
    if (rc == KVR_OK)
        w->n_events++;
    return rc;
}

int kvr_snap_writer_finish(kvr_snap_writer_t *w)
{
    if (w == NULL)
        return KVR_EINVAL;
    uint8_t t[TRAILER_BYTES];
    kvr_put_le64(t, w->n_events);
    XXH3_64bits_update(w->hash, t, 8);
    if (w->failed != KVR_OK)
        return w->failed;
    kvr_put_le64(t + 8, XXH3_64bits_digest(w->hash));
    int rc = w->sink(w->ud, t, sizeof t);
    return rc != 0 ? rc : KVR_OK;
}

void kvr_snap_writer_free(kvr_snap_writer_t *w)
{
    if (w == NULL)
        return;
    XXH3_freeState(w->hash);
    free(w);
}

/* ---- reading ---- */


/* The size of the event record at p (within [p, end)), or 0 with err set. */
static size_t check_event(const uint8_t *base, const uint8_t *p, const uint8_t *end,
                          uint32_t n_ranks, size_t *max_n, char *err, size_t err_len)
{
    size_t off = (size_t)(p - base), left = (size_t)(end - p);
    if (left < EVENT_HEAD_BYTES) {
        kvr_parse_fail(err, err_len, "event at byte %zu: truncated header", off);
        return 0;
    }
    uint8_t kind = p[0], tier = p[1], par = p[2];
    uint32_t rank = kvr_le32(p + 4), n = kvr_le32(p + 8);
    if (kind < K_STORED || kind > K_CLEARED || tier >= KVR_N_TIERS || par > 1 || p[3] != 0 ||
        (kind != K_STORED && par != 0)) {
        kvr_parse_fail(err, err_len, "event at byte %zu: bad kind %u, tier %u or flags", off, kind, tier);
        return 0;
    }
    if (rank >= n_ranks) {
        kvr_parse_fail(err, err_len, "event at byte %zu: rank %u outside the table of %u", off, rank,
             n_ranks);
        return 0;
    }
    size_t need = EVENT_HEAD_BYTES;
    if (kind == K_STORED) {
        if (n == 0) {
            kvr_parse_fail(err, err_len, "event at byte %zu: a store of no block", off);
            return 0;
        }
        need += 8 + (size_t)n * 16;
    } else if (kind == K_REMOVED) {
        need += (size_t)n * 8;
    } else if (n != 0) {
        kvr_parse_fail(err, err_len, "event at byte %zu: a clear with a count", off);
        return 0;
    }
    if (need > left) {
        kvr_parse_fail(err, err_len, "event at byte %zu: %zu bytes past the end of the events", off,
             need - left);
        return 0;
    }
    if (n > *max_n)
        *max_n = n;
    return need;
}

int kvr_snap_open(kvr_snap_reader_t *r, const uint8_t *buf, size_t len, char *err,
                  size_t err_len)
{
    memset(r, 0, sizeof *r);
    if (buf == NULL || len < HEADER_BYTES + TRAILER_BYTES)
        return kvr_parse_fail(err, err_len, "%zu bytes: shorter than a header and trailer", len);
    if (memcmp(buf, MAGIC, 8) != 0)
        return kvr_parse_fail(err, err_len, "not a kvrouter state file (bad magic)");
    uint32_t version = kvr_le32(buf + 8);
    if (version != KVR_SNAP_VERSION)
        return kvr_parse_fail(err, err_len, "format version %u, this build reads %u", version,
                    KVR_SNAP_VERSION);
    const uint8_t *tr = buf + len - TRAILER_BYTES;
    if (XXH3_64bits(buf, len - 8) != kvr_le64(tr + 8))
        return kvr_parse_fail(err, err_len, "checksum mismatch (a truncated or damaged file)");
    uint32_t n_ranks = kvr_le32(buf + 24);
    if (kvr_le32(buf + 12) == 0 || n_ranks > KVR_SNAP_MAX_RANKS || kvr_le32(buf + 28) != 0)
        return kvr_parse_fail(err, err_len, "bad header (block size %u, %u ranks)", kvr_le32(buf + 12),
                    n_ranks);
    size_t events_at = HEADER_BYTES + (size_t)n_ranks * RANK_BYTES;
    if (events_at > len - TRAILER_BYTES)
        return kvr_parse_fail(err, err_len, "rank table of %u runs past the end", n_ranks);
    for (uint32_t i = 0; i < n_ranks; i++)
        if (kvr_le32(buf + HEADER_BYTES + (size_t)i * RANK_BYTES + 12) != 0)
            return kvr_parse_fail(err, err_len, "rank %u: unknown flags", i);
    const uint8_t *p = buf + events_at;
    uint64_t count = 0;
    size_t max_n = 1;
    while (p < tr) {
        size_t sz = check_event(buf, p, tr, n_ranks, &max_n, err, err_len);
        if (sz == 0)
            return KVR_EPARSE;
        p += sz;
        count++;
    }
    if (count != kvr_le64(tr))
        return kvr_parse_fail(err, err_len, "%llu events, the trailer says %llu",
                    (unsigned long long)count, (unsigned long long)kvr_le64(tr));
    r->blocks = malloc(max_n * sizeof *r->blocks);
    r->removed = malloc(max_n * sizeof *r->removed);
    if (r->blocks == NULL || r->removed == NULL) {
        kvr_snap_close(r);
        (void)kvr_parse_fail(err, err_len, "out of memory");
        return KVR_ENOMEM;
    }
    r->cap = max_n;
    r->buf = buf;
    r->len = len;
    r->info = (kvr_snap_info_t){.version = version,
                                .block_size = kvr_le32(buf + 12),
                                .saved_unix_ms = kvr_le64(buf + 16),
                                .n_ranks = n_ranks,
                                .n_events = count};
    r->next = buf + events_at;
    r->end = tr;
    return KVR_OK;
}

void kvr_snap_rank(const kvr_snap_reader_t *r, uint32_t i, kvr_snap_rank_t *out)
{
    const uint8_t *b = r->buf + HEADER_BYTES + (size_t)i * RANK_BYTES;
    *out = (kvr_snap_rank_t){.worker_id = kvr_le64(b),
                             .dp_rank = kvr_le32(b + 8),
                             .last_seq = kvr_le64(b + 16),
                             .last_hash = kvr_le64(b + 24)};
}

int kvr_snap_next(kvr_snap_reader_t *r, uint32_t *rank, kvr_event_t *ev)
{
    if (r->next == NULL || r->next >= r->end)
        return KVR_ENOTFOUND;
    const uint8_t *p = r->next;
    uint8_t kind = p[0];
    uint32_t n = kvr_le32(p + 8);
    *rank = kvr_le32(p + 4);
    kvr_snap_rank_t rk;
    kvr_snap_rank(r, *rank, &rk);
    *ev = (kvr_event_t){.worker = {rk.worker_id, rk.dp_rank}, .tier = (kvr_tier_t)p[1]};
    p += EVENT_HEAD_BYTES;
    if (kind == K_STORED) {
        ev->kind = KVR_EV_STORED;
        ev->has_parent = r->next[2] != 0;
        ev->parent_ext = kvr_le64(p);
        p += 8;
        for (uint32_t i = 0; i < n; i++, p += 16)
            r->blocks[i] = (kvr_block_t){.ext = kvr_le64(p), .lbh = kvr_le64(p + 8)};
        ev->blocks = r->blocks;
        ev->n_blocks = n;
    } else if (kind == K_REMOVED) {
        ev->kind = KVR_EV_REMOVED;
        for (uint32_t i = 0; i < n; i++, p += 8)
            r->removed[i] = kvr_le64(p);
        ev->removed = r->removed;
        ev->n_removed = n;
    } else {
        ev->kind = KVR_EV_CLEARED;
    }
    r->next = p;
    return KVR_OK;
}

void kvr_snap_close(kvr_snap_reader_t *r)
{
    free(r->blocks);
    free(r->removed);
    memset(r, 0, sizeof *r);
}
