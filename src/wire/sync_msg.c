/*
 * sync_msg.c: see sync_msg.h. The reader checks a message in one pass over its events (the
 * same walk kvr_sync_next does), so what open() accepted next() reads without a check left.
 */
#include "wire/sync_msg.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "base/le.h"
#include "wire/parse_fail.h"

#define MAGIC "KVRS"
#define EVENT_HEAD 4u
#define ADD_FIXED 48u /* origin .. n_seq */
#define OPT_HAS_EXPECTED 1u
#define OPT_PREFILL_DONE (1u << 5)
#define OPT_KNOWN 0x3fu
#define MAX_MESSAGE ((size_t)1 << 30)


/* Reads the event at r->pos into ev (pointers into the message); a problem named in err. */
static int read_event(kvr_sync_reader_t *r, kvr_sync_event_t *ev, char *err, size_t err_len)
{
    const uint8_t *p = r->buf + r->pos;
    size_t left = r->len - r->pos;
    if (left < EVENT_HEAD)
        return kvr_parse_fail(err, err_len, "truncated event header");
    unsigned kind = p[0], opts = p[1];
    size_t id_len = kvr_le16(p + 2);
    if (kind < KVR_SYNC_ADD || kind > KVR_SYNC_FREE)
        return kvr_parse_fail(err, err_len, "unknown event kind %u", kind);
    if ((opts & ~OPT_KNOWN) != 0 || ((opts >> 1) & 3) == 3 || ((opts >> 3) & 3) == 3)
        return kvr_parse_fail(err, err_len, "unknown option bits 0x%02x", opts);
    if (id_len == 0 || id_len > KVR_SYNC_MAX_ID)
        return kvr_parse_fail(err, err_len, "request id of %zu bytes (1 to %u)", id_len, KVR_SYNC_MAX_ID);
    if (left - EVENT_HEAD < id_len)
        return kvr_parse_fail(err, err_len, "truncated request id");
    *ev = (kvr_sync_event_t){.kind = (kvr_sync_kind_t)kind,
                             .id = (const char *)p + EVENT_HEAD,
                             .id_len = id_len};
    size_t used = EVENT_HEAD + id_len;
    if (kind == KVR_SYNC_ADD) {
        if (left - used < ADD_FIXED)
            return kvr_parse_fail(err, err_len, "truncated add");
        const uint8_t *a = p + used;
        ev->origin = kvr_le64(a);
        ev->worker.worker_id = kvr_le64(a + 8);
        ev->worker.dp_rank = kvr_le32(a + 16);
        ev->block_size = kvr_le32(a + 20);
        ev->isl_tokens = kvr_le64(a + 24);
        ev->cached_tokens = kvr_le64(a + 32);
        ev->expected_output_tokens = kvr_le32(a + 40);
        ev->n_seq = kvr_le32(a + 44);
        ev->has_expected_output_tokens = (opts & OPT_HAS_EXPECTED) != 0;
        ev->assume_kv_reuse = (kvr_load_opt_t)((opts >> 1) & 3);
        ev->track_prefill_tokens = (kvr_load_opt_t)((opts >> 3) & 3);
        ev->prefill_done = (opts & OPT_PREFILL_DONE) != 0;
        used += ADD_FIXED;
        if (ev->n_seq > KVR_SYNC_MAX_SEQ)
            return kvr_parse_fail(err, err_len, "%zu hashes in one add (at most %u)", ev->n_seq,
                        KVR_SYNC_MAX_SEQ);
        if ((left - used) / 8 < ev->n_seq)
            return kvr_parse_fail(err, err_len, "truncated hashes (%zu announced)", ev->n_seq);
        ev->seq_bytes = p + used;
        used += ev->n_seq * 8;
    } else if (opts != 0) {
        return kvr_parse_fail(err, err_len, "options on a %s event", kind == KVR_SYNC_FREE ? "free" :
                                                           "prefill-done");
    }
    r->pos += used;
    return KVR_OK;
}

int kvr_sync_open(kvr_sync_reader_t *r, const void *buf, size_t len, char *err, size_t err_len)
{
    memset(r, 0, sizeof *r);
    const uint8_t *b = buf;
    if (b == NULL || len < KVR_SYNC_HEADER_BYTES)
        return kvr_parse_fail(err, err_len, "message of %zu bytes is shorter than its header", len);
    if (len > MAX_MESSAGE)
        return kvr_parse_fail(err, err_len, "message of %zu bytes is too large", len);
    if (memcmp(b, MAGIC, 4) != 0)
        return kvr_parse_fail(err, err_len, "not a replica-sync message (bad magic)");
    if (b[4] != KVR_SYNC_VERSION)
        return kvr_parse_fail(err, err_len, "version %u (this build reads %u)", b[4], KVR_SYNC_VERSION);
    unsigned type = b[5];
    if (type < KVR_SYNC_EVENTS || type > KVR_SYNC_SNAPSHOT)
        return kvr_parse_fail(err, err_len, "unknown message type %u", type);
    r->h = (kvr_sync_header_t){.type = (kvr_sync_type_t)type,
                               .flags = kvr_le16(b + 6),
                               .router_id = kvr_le64(b + 8),
                               .seq = kvr_le64(b + 16),
                               .sent_us = kvr_le64(b + 24),
                               .n_events = kvr_le32(b + 32)};
    if ((r->h.flags & ~KVR_SYNC_FLAG_LAST) != 0 || kvr_le32(b + 36) != 0)
        return kvr_parse_fail(err, err_len, "reserved header bits set");
    if (r->h.router_id == 0)
        return kvr_parse_fail(err, err_len, "router id 0");
    if (type == KVR_SYNC_SNAP_REQ && r->h.n_events != 0)
        return kvr_parse_fail(err, err_len, "a snapshot request carries events");
    r->buf = b;
    r->len = len;
    r->pos = KVR_SYNC_HEADER_BYTES;
    kvr_sync_event_t ev;
    char why[160] = "";
    for (uint32_t i = 0; i < r->h.n_events; i++)
        if (read_event(r, &ev, why, sizeof why) != KVR_OK)
            return kvr_parse_fail(err, err_len, "event %u of %u: %s", i, r->h.n_events, why);
    if (r->pos != len)
        return kvr_parse_fail(err, err_len, "%zu bytes after the last event", len - r->pos);
    r->pos = KVR_SYNC_HEADER_BYTES;
    r->left = r->h.n_events;
    return KVR_OK;
}

int kvr_sync_next(kvr_sync_reader_t *r, kvr_sync_event_t *ev)
{
    if (r->left == 0)
        return KVR_ENOTFOUND;
    int rc = read_event(r, ev, NULL, 0);
    if (rc != KVR_OK) /* open() checked every event */
        return rc;
    r->left--;
    return KVR_OK;
}

uint64_t kvr_sync_seq_at(const kvr_sync_event_t *ev, size_t i)
{
    return kvr_le64(ev->seq_bytes + 8 * i);
}

/* ---- writing ---- */

void kvr_sync_begin(kvr_sync_writer_t *w, const kvr_sync_header_t *h)
{
    w->len = 0;
    w->n_events = 0;
    if (kvr_grow((void **)&w->buf, &w->cap, KVR_SYNC_HEADER_BYTES, MAX_MESSAGE, 1) != KVR_OK)
        return; /* kvr_sync_add reports it */
    uint8_t *b = w->buf;
    memcpy(b, MAGIC, 4);
    b[4] = KVR_SYNC_VERSION;
    b[5] = (uint8_t)h->type;
    kvr_put_le16(b + 6, h->flags);
    kvr_put_le64(b + 8, h->router_id);
    kvr_put_le64(b + 16, h->seq);
    kvr_put_le64(b + 24, h->sent_us);
    kvr_put_le32(b + 32, 0);
    kvr_put_le32(b + 36, 0);
    w->len = KVR_SYNC_HEADER_BYTES;
}

size_t kvr_sync_event_bytes(const kvr_sync_event_t *ev)
{
    size_t n = EVENT_HEAD + ev->id_len;
    return ev->kind == KVR_SYNC_ADD ? n + ADD_FIXED + 8 * ev->n_seq : n;
}

static unsigned opts_of(const kvr_sync_event_t *ev)
{
    if (ev->kind != KVR_SYNC_ADD)
        return 0;
    return (ev->has_expected_output_tokens ? OPT_HAS_EXPECTED : 0) |
           ((unsigned)ev->assume_kv_reuse & 3) << 1 |
           ((unsigned)ev->track_prefill_tokens & 3) << 3 |
           (ev->prefill_done ? OPT_PREFILL_DONE : 0);
}

int kvr_sync_add(kvr_sync_writer_t *w, const kvr_sync_event_t *ev)
{
    if (w->len < KVR_SYNC_HEADER_BYTES)
        return KVR_ENOMEM; /* begin could not allocate */
    if (ev->kind < KVR_SYNC_ADD || ev->kind > KVR_SYNC_FREE || ev->id == NULL ||
        ev->id_len == 0 || ev->id_len > KVR_SYNC_MAX_ID ||
        (ev->kind == KVR_SYNC_ADD &&
         (ev->n_seq > KVR_SYNC_MAX_SEQ || (ev->n_seq > 0 && ev->seq == NULL) ||
          (unsigned)ev->assume_kv_reuse > 2 || (unsigned)ev->track_prefill_tokens > 2)))
        return KVR_EINVAL;
    size_t need = w->len + kvr_sync_event_bytes(ev);
    if (kvr_grow((void **)&w->buf, &w->cap, need, MAX_MESSAGE, 1) != KVR_OK)
        return KVR_ENOMEM;
    uint8_t *p = w->buf + w->len;
    p[0] = (uint8_t)ev->kind;
    p[1] = (uint8_t)opts_of(ev);
    kvr_put_le16(p + 2, (uint16_t)ev->id_len);
    memcpy(p + EVENT_HEAD, ev->id, ev->id_len);
    p += EVENT_HEAD + ev->id_len;
    if (ev->kind == KVR_SYNC_ADD) {
        kvr_put_le64(p, ev->origin);
        kvr_put_le64(p + 8, ev->worker.worker_id);
        kvr_put_le32(p + 16, ev->worker.dp_rank);
        kvr_put_le32(p + 20, ev->block_size);
        kvr_put_le64(p + 24, ev->isl_tokens);
        kvr_put_le64(p + 32, ev->cached_tokens);
        kvr_put_le32(p + 40, ev->expected_output_tokens);
        kvr_put_le32(p + 44, (uint32_t)ev->n_seq);
        p += ADD_FIXED;
        for (size_t i = 0; i < ev->n_seq; i++)
            kvr_put_le64(p + 8 * i, ev->seq[i]);
    }
    w->len = need;
    w->n_events++;
    kvr_put_le32(w->buf + 32, w->n_events);
    return KVR_OK;
}

void kvr_sync_stamp(kvr_sync_writer_t *w, uint64_t seq, uint64_t sent_us)
{
    if (w->len < KVR_SYNC_HEADER_BYTES)
        return;
    kvr_put_le64(w->buf + 16, seq);
    kvr_put_le64(w->buf + 24, sent_us);
}

void kvr_sync_set_flags(kvr_sync_writer_t *w, uint16_t flags)
{
    if (w->len >= KVR_SYNC_HEADER_BYTES)
        kvr_put_le16(w->buf + 6, flags);
}

void kvr_sync_writer_free(kvr_sync_writer_t *w)
{
    free(w->buf);
    memset(w, 0, sizeof *w);
}
