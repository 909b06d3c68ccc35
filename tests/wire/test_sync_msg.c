/*
 * test_sync_msg.c: the replica-sync messages. Random batches (adds with and without hashes,
 * every option, prefill-done and free events) written and read back are the same events;
 * every truncation of a message, and every byte flip of its fixed fields that makes it
 * invalid, is refused whole with a message; the writer refuses what it cannot encode and
 * leaves the message as it was.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "wire/sync_msg.h"

static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef struct owned {
    kvr_sync_event_t ev;
    char id[KVR_SYNC_MAX_ID];
    uint64_t seq[40];
} owned_t;

static void random_event(owned_t *o)
{
    memset(o, 0, sizeof *o);
    kvr_sync_event_t *e = &o->ev;
    e->kind = (kvr_sync_kind_t)(1 + next_rand() % 3);
    e->id_len = 1 + next_rand() % (next_rand() % 4 == 0 ? KVR_SYNC_MAX_ID : 40);
    for (size_t i = 0; i < e->id_len; i++)
        o->id[i] = (char)next_rand();
    e->id = o->id;
    if (e->kind != KVR_SYNC_ADD)
        return;
    e->origin = next_rand() | 1;
    e->worker = (kvr_worker_t){next_rand(), (uint32_t)next_rand()};
    e->block_size = (uint32_t)next_rand();
    e->isl_tokens = next_rand();
    e->cached_tokens = next_rand();
    e->has_expected_output_tokens = next_rand() & 1;
    e->expected_output_tokens = e->has_expected_output_tokens ? (uint32_t)next_rand() : 0;
    e->assume_kv_reuse = (kvr_load_opt_t)(next_rand() % 3);
    e->track_prefill_tokens = (kvr_load_opt_t)(next_rand() % 3);
    e->prefill_done = next_rand() & 1;
    e->n_seq = next_rand() % 41;
    for (size_t i = 0; i < e->n_seq; i++)
        o->seq[i] = next_rand();
    e->seq = o->seq;
}

static void assert_same(const kvr_sync_event_t *a, const kvr_sync_event_t *b)
{
    assert_int_equal(a->kind, b->kind);
    assert_int_equal(a->id_len, b->id_len);
    assert_memory_equal(a->id, b->id, a->id_len);
    if (a->kind != KVR_SYNC_ADD)
        return;
    assert_true(a->origin == b->origin && a->worker.worker_id == b->worker.worker_id &&
                a->worker.dp_rank == b->worker.dp_rank && a->block_size == b->block_size &&
                a->isl_tokens == b->isl_tokens && a->cached_tokens == b->cached_tokens);
    assert_int_equal(a->has_expected_output_tokens, b->has_expected_output_tokens);
    assert_int_equal(a->expected_output_tokens, b->expected_output_tokens);
    assert_int_equal(a->assume_kv_reuse, b->assume_kv_reuse);
    assert_int_equal(a->track_prefill_tokens, b->track_prefill_tokens);
    assert_int_equal(a->prefill_done, b->prefill_done);
    assert_int_equal(a->n_seq, b->n_seq);
    for (size_t i = 0; i < a->n_seq; i++)
        assert_true(a->seq[i] == kvr_sync_seq_at(b, i));
}

static void round_trip(void **state)
{
    (void)state;
    kvr_sync_writer_t w = {0};
    owned_t *evs = calloc(64, sizeof *evs);
    for (int round = 0; round < 200; round++) {
        kvr_sync_header_t h = {.type = KVR_SYNC_EVENTS, .router_id = next_rand() | 1,
                               .seq = next_rand(), .sent_us = next_rand()};
        kvr_sync_begin(&w, &h);
        size_t n = next_rand() % 65;
        for (size_t i = 0; i < n; i++) {
            random_event(&evs[i]);
            assert_int_equal(kvr_sync_add(&w, &evs[i].ev), KVR_OK);
        }
        uint16_t flags = next_rand() & 1 ? KVR_SYNC_FLAG_LAST : 0;
        kvr_sync_set_flags(&w, flags);
        kvr_sync_reader_t r;
        char err[200] = "";
        assert_int_equal(kvr_sync_open(&r, w.buf, w.len, err, sizeof err), KVR_OK);
        assert_true(r.h.router_id == h.router_id && r.h.seq == h.seq &&
                    r.h.sent_us == h.sent_us && r.h.n_events == n && r.h.flags == flags);
        kvr_sync_event_t got;
        for (size_t i = 0; i < n; i++) {
            assert_int_equal(kvr_sync_next(&r, &got), KVR_OK);
            assert_same(&evs[i].ev, &got);
        }
        assert_int_equal(kvr_sync_next(&r, &got), KVR_ENOTFOUND);
        /* stamped at publishing: the numbering and time change, nothing else */
        kvr_sync_stamp(&w, h.seq + 1, h.sent_us + 7);
        assert_int_equal(kvr_sync_open(&r, w.buf, w.len, err, sizeof err), KVR_OK);
        assert_true(r.h.seq == h.seq + 1 && r.h.sent_us == h.sent_us + 7 &&
                    r.h.router_id == h.router_id && r.h.n_events == n && r.h.flags == flags);
    }
    free(evs);
    kvr_sync_writer_free(&w);
}

static void truncations_and_flips_refused(void **state)
{
    (void)state;
    kvr_sync_writer_t w = {0};
    owned_t o;
    kvr_sync_header_t h = {.type = KVR_SYNC_EVENTS, .router_id = 5, .seq = 1};
    kvr_sync_begin(&w, &h);
    for (int i = 0; i < 6; i++) {
        random_event(&o);
        assert_int_equal(kvr_sync_add(&w, &o.ev), KVR_OK);
    }
    kvr_sync_reader_t r;
    char err[200];
    for (size_t len = 0; len < w.len; len++) {
        err[0] = '\0';
        assert_int_equal(kvr_sync_open(&r, w.buf, len, err, sizeof err), KVR_EPARSE);
        assert_true(err[0] != '\0');
    }
    uint8_t *copy = malloc(w.len + 1);
    memcpy(copy, w.buf, w.len);
    copy[w.len] = 0;
    assert_int_equal(kvr_sync_open(&r, copy, w.len + 1, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "after the last event"));
    /* the fixed header fields: magic, version, type, reserved flags, router id 0 */
    static const size_t at[] = {0, 1, 2, 3, 4, 5, 7, 36};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        memcpy(copy, w.buf, w.len);
        copy[at[k]] ^= 0x80;
        assert_int_equal(kvr_sync_open(&r, copy, w.len, err, sizeof err), KVR_EPARSE);
    }
    memcpy(copy, w.buf, w.len);
    memset(copy + 8, 0, 8);
    assert_int_equal(kvr_sync_open(&r, copy, w.len, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "router id 0"));
    /* the first event's kind and option bits */
    memcpy(copy, w.buf, w.len);
    copy[KVR_SYNC_HEADER_BYTES] = 9;
    assert_int_equal(kvr_sync_open(&r, copy, w.len, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "event 0 of 6: unknown event kind 9"));
    memcpy(copy, w.buf, w.len);
    copy[KVR_SYNC_HEADER_BYTES + 1] = 0x80;
    assert_int_equal(kvr_sync_open(&r, copy, w.len, err, sizeof err), KVR_EPARSE);
    free(copy);
    kvr_sync_writer_free(&w);
}

static void writer_refuses_what_it_cannot_encode(void **state)
{
    (void)state;
    kvr_sync_writer_t w = {0};
    kvr_sync_header_t h = {.type = KVR_SYNC_EVENTS, .router_id = 5};
    kvr_sync_begin(&w, &h);
    size_t len = w.len;
    char id[KVR_SYNC_MAX_ID + 1];
    memset(id, 'x', sizeof id);
    kvr_sync_event_t e = {.kind = KVR_SYNC_FREE, .id = id, .id_len = KVR_SYNC_MAX_ID + 1};
    assert_int_equal(kvr_sync_add(&w, &e), KVR_EINVAL);
    e.id_len = 0;
    assert_int_equal(kvr_sync_add(&w, &e), KVR_EINVAL);
    e = (kvr_sync_event_t){.kind = KVR_SYNC_ADD, .id = id, .id_len = 2, .n_seq = 3};
    assert_int_equal(kvr_sync_add(&w, &e), KVR_EINVAL); /* hashes announced, none given */
    e.n_seq = 0;
    e.assume_kv_reuse = (kvr_load_opt_t)3;
    assert_int_equal(kvr_sync_add(&w, &e), KVR_EINVAL);
    e.kind = (kvr_sync_kind_t)7;
    assert_int_equal(kvr_sync_add(&w, &e), KVR_EINVAL);
    assert_int_equal(w.len, len);
    assert_int_equal(w.n_events, 0);
    kvr_sync_reader_t r;
    assert_int_equal(kvr_sync_open(&r, w.buf, w.len, NULL, 0), KVR_OK);
    kvr_sync_writer_free(&w);
}

static void snapshot_request_has_no_events(void **state)
{
    (void)state;
    kvr_sync_writer_t w = {0};
    kvr_sync_header_t h = {.type = KVR_SYNC_SNAP_REQ, .router_id = 5};
    kvr_sync_begin(&w, &h);
    kvr_sync_reader_t r;
    assert_int_equal(kvr_sync_open(&r, w.buf, w.len, NULL, 0), KVR_OK);
    assert_int_equal(r.h.type, KVR_SYNC_SNAP_REQ);
    kvr_sync_event_t e = {.kind = KVR_SYNC_FREE, .id = "a", .id_len = 1};
    assert_int_equal(kvr_sync_add(&w, &e), KVR_OK);
    char err[200];
    assert_int_equal(kvr_sync_open(&r, w.buf, w.len, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "snapshot request carries events"));
    kvr_sync_writer_free(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(round_trip),
        cmocka_unit_test(truncations_and_flips_refused),
        cmocka_unit_test(writer_refuses_what_it_cannot_encode),
        cmocka_unit_test(snapshot_request_has_no_events),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
