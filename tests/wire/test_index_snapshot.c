/*
 * test_index_snapshot.c: the warm-restart file format. A random index (stores with parents,
 * removals that leave holes, several ranks and tiers) saved through the writer and read back
 * into an empty index dumps identically; every truncation and every single-bit flip of a
 * file is refused whole; a file whose checksum is right but whose records are not (rank
 * outside the table, bad kind, a count past the end) is refused naming the problem; the
 * writer refuses what it cannot encode.
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
#include "wire/index_snapshot.h"

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
} buf_t;

static int sink(void *ud, const void *bytes, size_t len)
{
    buf_t *b = ud;
    if (b->n + len > b->cap) {
        b->cap = (b->n + len) * 2;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, bytes, len);
    b->n += len;
    return 0;
}

static const kvr_snap_rank_t RANKS[] = {
    {.worker_id = 1, .dp_rank = 0, .last_seq = 41, .last_hash = 0x1111},
    {.worker_id = 2, .dp_rank = 0, .last_seq = 7, .last_hash = 0x2222},
    {.worker_id = 2, .dp_rank = 1, .last_seq = 0, .last_hash = 0x3333},
};
#define N_RANKS 3u

static uint32_t rank_of(kvr_worker_t w)
{
    for (uint32_t i = 0; i < N_RANKS; i++)
        if (RANKS[i].worker_id == w.worker_id && RANKS[i].dp_rank == w.dp_rank)
            return i;
    fail_msg("worker %llu rank %u not in the table", (unsigned long long)w.worker_id, w.dp_rank);
    return 0;
}

/* A random index over the three ranks: chains of stores (sharing prefixes), removals. */
static kvr_index_t *random_index(uint64_t seed)
{
    int st;
    kvr_index_config_t ic = {.max_pairs = 1 << 16, .sync = KVR_SYNC_NONE};
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    assert_non_null(ix);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, x)
    for (int e = 0; e < 300; e++) {
        const kvr_snap_rank_t *r = &RANKS[RND() % N_RANKS];
        kvr_worker_t w = {r->worker_id, r->dp_rank};
        uint64_t base = RND() % 8, n = 1 + RND() % 12;
        kvr_block_t b[16];
        for (uint64_t i = 0; i < n; i++)
            b[i] = (kvr_block_t){.ext = (w.worker_id << 48) ^ ((uint64_t)w.dp_rank << 40) ^ (base << 20) ^ i,
                                 .lbh = base * 1000 + i};
        kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = w, .tier = (kvr_tier_t)(RND() % 2),
                          .blocks = b, .n_blocks = n};
        (void)kvr_index_apply(ix, &ev);
        if (RND() % 4 == 0) {
            uint64_t gone = b[RND() % n].ext;
            kvr_event_t rm = {.kind = KVR_EV_REMOVED, .worker = w, .tier = ev.tier,
                              .removed = &gone, .n_removed = 1};
            (void)kvr_index_apply(ix, &rm);
        }
    }
#undef RND
    return ix;
}

typedef struct wctx {
    kvr_snap_writer_t *w;
} wctx_t;

static int write_event(void *ud, const kvr_event_t *ev)
{
    return kvr_snap_write_event(((wctx_t *)ud)->w, rank_of(ev->worker), ev);
}

static buf_t save(kvr_index_t *ix)
{
    buf_t b = {0};
    int st;
    wctx_t c = {kvr_snap_writer_new(sink, &b, 16, 1234, RANKS, N_RANKS, &st)};
    assert_non_null(c.w);
    assert_int_equal(kvr_index_dump(ix, write_event, &c), KVR_OK);
    assert_int_equal(kvr_snap_writer_finish(c.w), KVR_OK);
    kvr_snap_writer_free(c.w);
    return b;
}

/* A canonical text of an index: its dump, event by event. */
static int to_text(void *ud, const kvr_event_t *ev)
{
    buf_t *b = ud;
    char line[128];
    int n = snprintf(line, sizeof line, "%d %llu/%u t%d p%d:%llx", ev->kind,
                     (unsigned long long)ev->worker.worker_id, ev->worker.dp_rank, ev->tier,
                     ev->has_parent, (unsigned long long)ev->parent_ext);
    sink(b, line, (size_t)n);
    for (size_t i = 0; i < ev->n_blocks; i++) {
        n = snprintf(line, sizeof line, " %llx:%llx", (unsigned long long)ev->blocks[i].ext,
                     (unsigned long long)ev->blocks[i].lbh);
        sink(b, line, (size_t)n);
    }
    for (size_t i = 0; i < ev->n_removed; i++) {
        n = snprintf(line, sizeof line, " -%llx", (unsigned long long)ev->removed[i]);
        sink(b, line, (size_t)n);
    }
    sink(b, "\n", 1);
    return 0;
}

static buf_t text_of(kvr_index_t *ix)
{
    buf_t t = {0};
    assert_int_equal(kvr_index_dump(ix, to_text, &t), KVR_OK);
    sink(&t, "", 1);
    return t;
}

static void test_round_trip(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 20; seed++) {
        kvr_index_t *ix = random_index(seed);
        buf_t f = save(ix);
        kvr_snap_reader_t r;
        char err[200];
        assert_int_equal(kvr_snap_open(&r, f.p, f.n, err, sizeof err), KVR_OK);
        assert_int_equal(r.info.block_size, 16);
        assert_int_equal(r.info.saved_unix_ms, 1234);
        assert_int_equal(r.info.n_ranks, N_RANKS);
        for (uint32_t i = 0; i < N_RANKS; i++) {
            kvr_snap_rank_t k;
            kvr_snap_rank(&r, i, &k);
            assert_true(k.worker_id == RANKS[i].worker_id && k.dp_rank == RANKS[i].dp_rank &&
                        k.last_seq == RANKS[i].last_seq && k.last_hash == RANKS[i].last_hash);
        }
        int st;
        kvr_index_config_t ic = {.max_pairs = 1 << 16, .sync = KVR_SYNC_NONE};
        kvr_index_t *back = kvr_index_new(&ic, &st);
        uint32_t rank;
        kvr_event_t ev;
        uint64_t n = 0;
        while (kvr_snap_next(&r, &rank, &ev) == KVR_OK) {
            assert_int_equal(rank, rank_of(ev.worker));
            assert_int_equal(kvr_index_apply(back, &ev), KVR_OK);
            n++;
        }
        assert_int_equal(n, r.info.n_events);
        assert_int_equal(kvr_index_verify(back, NULL, 0), KVR_OK);
        buf_t a = text_of(ix), b = text_of(back);
        assert_string_equal((char *)a.p, (char *)b.p);
        kvr_index_stats_t sa, sb;
        kvr_index_stats(ix, &sa);
        kvr_index_stats(back, &sb);
        assert_int_equal(sa.pairs, sb.pairs);
        free(a.p);
        free(b.p);
        kvr_snap_close(&r);
        kvr_index_free(back);
        kvr_index_free(ix);
        free(f.p);
    }
}

static void test_truncations_and_bit_flips_refused(void **state)
{
    (void)state;
    kvr_index_t *ix = random_index(3);
    buf_t f = save(ix);
    kvr_snap_reader_t r;
    char err[200];
    for (size_t len = 0; len < f.n; len++) {
        err[0] = '\0';
        assert_int_equal(kvr_snap_open(&r, f.p, len, err, sizeof err), KVR_EPARSE);
        assert_true(err[0] != '\0');
    }
    for (size_t i = 0; i < f.n; i += 7) {
        for (int bit = 0; bit < 8; bit += 3) {
            f.p[i] ^= (uint8_t)(1u << bit);
            assert_int_equal(kvr_snap_open(&r, f.p, f.n, err, sizeof err), KVR_EPARSE);
            f.p[i] ^= (uint8_t)(1u << bit);
        }
    }
    assert_int_equal(kvr_snap_open(&r, f.p, f.n, err, sizeof err), KVR_OK);
    kvr_snap_close(&r);
    free(f.p);
    kvr_index_free(ix);
}

/* Rewrites the checksum so that only the record checks can refuse the file. */
static void reseal(buf_t *f)
{
    uint64_t h = kvr_xxh3(f->p, f->n - 8, 0);
    for (int i = 0; i < 8; i++)
        f->p[f->n - 8 + i] = (uint8_t)(h >> (8 * i));
}

static void expect_refused(buf_t *f, const char *needle)
{
    reseal(f);
    kvr_snap_reader_t r;
    char err[200] = "";
    assert_int_equal(kvr_snap_open(&r, f->p, f->n, err, sizeof err), KVR_EPARSE);
    if (strstr(err, needle) == NULL)
        fail_msg("message '%s' does not say '%s'", err, needle);
}

static void test_sealed_bad_records_refused(void **state)
{
    (void)state;
    kvr_block_t b = {.ext = 5, .lbh = 6};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {1, 0}, .blocks = &b, .n_blocks = 1};
    size_t first = 32 + N_RANKS * 32; /* the first event record */
    buf_t f = {0};
    int st;
    kvr_snap_writer_t *w = kvr_snap_writer_new(sink, &f, 16, 0, RANKS, N_RANKS, &st);
    assert_int_equal(kvr_snap_write_event(w, 0, &ev), KVR_OK);
    assert_int_equal(kvr_snap_writer_finish(w), KVR_OK);
    kvr_snap_writer_free(w);
    buf_t g = {.p = malloc(f.n), .n = f.n};

    memcpy(g.p, f.p, f.n);
    g.p[first + 4] = 9; /* rank 9 of 3 */
    expect_refused(&g, "rank 9 outside the table of 3");
    memcpy(g.p, f.p, f.n);
    g.p[first] = 7; /* kind */
    expect_refused(&g, "bad kind 7");
    memcpy(g.p, f.p, f.n);
    g.p[first + 8] = 2; /* two blocks where one is */
    expect_refused(&g, "past the end");
    memcpy(g.p, f.p, f.n);
    g.p[f.n - 16] = 5; /* the trailer's event count */
    expect_refused(&g, "1 events, the trailer says 5");
    memcpy(g.p, f.p, f.n);
    g.p[8] = 2; /* version */
    expect_refused(&g, "format version 2");
    memcpy(g.p, f.p, f.n);
    g.p[24] = 200; /* 200 ranks: the table runs past the end */
    expect_refused(&g, "rank table of 200");
    free(g.p);
    free(f.p);
}

static void test_writer_refuses_what_it_cannot_encode(void **state)
{
    (void)state;
    buf_t f = {0};
    int st;
    assert_null(kvr_snap_writer_new(sink, &f, 0, 0, RANKS, N_RANKS, &st));
    assert_int_equal(st, KVR_EINVAL);
    kvr_snap_writer_t *w = kvr_snap_writer_new(sink, &f, 16, 0, RANKS, N_RANKS, &st);
    assert_non_null(w);
    kvr_block_t b = {1, 2};
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {1, 0}, .blocks = &b, .n_blocks = 1};
    assert_int_equal(kvr_snap_write_event(w, N_RANKS, &ev), KVR_EINVAL);
    ev.n_blocks = 0;
    assert_int_equal(kvr_snap_write_event(w, 0, &ev), KVR_EINVAL);
    ev.n_blocks = 1;
    ev.tier = (kvr_tier_t)KVR_N_TIERS;
    assert_int_equal(kvr_snap_write_event(w, 0, &ev), KVR_EINVAL);
    ev.tier = KVR_TIER_DEVICE;
    ev.kind = (kvr_event_kind_t)9;
    assert_int_equal(kvr_snap_write_event(w, 0, &ev), KVR_EINVAL);
    assert_int_equal(kvr_snap_writer_finish(w), KVR_OK); /* no event was written */
    kvr_snap_writer_free(w);
    kvr_snap_reader_t r;
    assert_int_equal(kvr_snap_open(&r, f.p, f.n, NULL, 0), KVR_OK);
    assert_int_equal(r.info.n_events, 0);
    kvr_snap_close(&r);
    free(f.p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_truncations_and_bit_flips_refused),
        cmocka_unit_test(test_sealed_bad_records_refused),
        cmocka_unit_test(test_writer_refuses_what_it_cannot_encode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
