/*
 * test_queue.c: the request queue (Dynamo's queue policies): dispatch order under fcfs / wspt / lcfs
 * with priority_jump and strict priority, FIFO among equals, limits and rejections,
 * cancellation by handle, deadlines, gauges, and a randomized model-based test against a
 * naive list (kvr_queue_verify after every operation; the seed is printed on failure;
 * KVR_TEST_SEED=<seed> reruns one seed; KVR_TEST_SCALE=asan runs fewer).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include <cmocka.h>

#include "common/model_driver.h"

#include "core/queue.h"
#include "kvrouter.h"

static kvr_queue_t *mkqueue(size_t cap, kvr_queue_order_t order, uint64_t max_isl)
{
    kvr_queue_config_t cfg = {.capacity = cap, .order = order, .max_pending_isl_tokens = max_isl};
    int st;
    kvr_queue_t *q = kvr_queue_new(&cfg, &st);
    assert_non_null(q);
    assert_int_equal(st, KVR_OK);
    return q;
}

static void *tag(uintptr_t id) { return (void *)id; }

static kvr_queue_handle_t push(kvr_queue_t *q, uint64_t now, double jump, uint64_t cost,
                               uintptr_t id)
{
    kvr_queue_item_t it = {.isl_tokens = 100, .cost_tokens = cost, .priority_jump = jump,
                           .user = tag(id)};
    kvr_queue_handle_t h = 0;
    assert_int_equal(kvr_queue_push(q, &it, now, &h), KVR_OK);
    assert_true(h != 0);
    return h;
}

static void ok(const kvr_queue_t *q)
{
    char msg[256];
    if (kvr_queue_verify(q, msg, sizeof msg) != KVR_OK) {
        fprintf(stderr, "verify: %s\n", msg);
        fail();
    }
}

/* Pops everything and checks the user tags come out in this order. */
static void expect_order(kvr_queue_t *q, const uintptr_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvr_queue_entry_t e;
        assert_int_equal(kvr_queue_pop(q, &e), KVR_OK);
        if (e.item.user != tag(ids[i])) {
            fprintf(stderr, "pop %zu: got %lu, expected %lu\n", i, (unsigned long)(uintptr_t)e.item.user,
                    (unsigned long)ids[i]);
            fail();
        }
        ok(q);
    }
    assert_int_equal(kvr_queue_pop(q, NULL), KVR_ENOTFOUND);
}

static void test_fcfs_priority_jump(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(16, KVR_QUEUE_ORDER_FCFS, 0);
    push(q, 0, 0, 0, 1);     /* score 0 */
    push(q, 1000, 0, 0, 2);  /* -1 */
    push(q, 2000, 5, 0, 3);  /* 5 - 2 = 3: five seconds of head start */
    push(q, 3000, -3, 0, 4); /* negative jumps count as 0: -3 */
    push(q, 1000, 1, 0, 5);  /* 1 - 1 = 0: ties with 1, which came first */
    kvr_queue_entry_t top;
    assert_int_equal(kvr_queue_peek(q, &top), KVR_OK);
    assert_true(top.item.user == tag(3));
    assert_int_equal(kvr_queue_len(q), 5); /* peek leaves it */
    expect_order(q, (const uintptr_t[]){3, 1, 5, 2, 4}, 5);
    kvr_queue_free(q);
}

static void test_wspt(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(16, KVR_QUEUE_ORDER_WSPT, 0);
    push(q, 0, 0, 100, 1); /* 0.01 */
    push(q, 1, 0, 50, 2);  /* 0.02 */
    push(q, 2, 3, 100, 3); /* 0.04 */
    push(q, 3, 0, 0, 4);   /* cost 0 reads 1: 1.0 */
    push(q, 4, -7, 50, 5); /* 0.02, after 2 */
    push(q, 5, 0, 100, 6); /* 0.01, after 1 */
    kvr_queue_entry_t e;
    assert_int_equal(kvr_queue_peek(q, &e), KVR_OK);
    assert_true(e.score == 1.0);
    expect_order(q, (const uintptr_t[]){4, 3, 2, 5, 1, 6}, 6);
    kvr_queue_free(q);
}

static void test_lcfs(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(16, KVR_QUEUE_ORDER_LCFS, 0);
    push(q, 0, 0, 0, 1);
    push(q, 1000, 0, 0, 2);
    push(q, 2000, 0, 0, 3);
    push(q, 500, 2, 0, 4); /* 2 + 0.5 = 2.5: first */
    expect_order(q, (const uintptr_t[]){4, 3, 2, 1}, 4);
    kvr_queue_free(q);
}

static void test_strict_priority(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(16, KVR_QUEUE_ORDER_FCFS, 0);
    kvr_queue_item_t it = {.isl_tokens = 1, .priority_jump = 1000};
    it.user = tag(1);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_OK);
    it = (kvr_queue_item_t){.isl_tokens = 1, .strict_priority = 2, .user = tag(2)};
    assert_int_equal(kvr_queue_push(q, &it, 50000, NULL), KVR_OK);
    it = (kvr_queue_item_t){.isl_tokens = 1, .strict_priority = 1, .user = tag(3)};
    assert_int_equal(kvr_queue_push(q, &it, 100, NULL), KVR_OK);
    it = (kvr_queue_item_t){.isl_tokens = 1, .strict_priority = 2, .user = tag(4)};
    assert_int_equal(kvr_queue_push(q, &it, 60000, NULL), KVR_OK);
    expect_order(q, (const uintptr_t[]){2, 4, 3, 1}, 4);
    kvr_queue_free(q);
}

static void test_fifo_among_equals(void **s)
{
    (void)s;
    for (int order = 0; order < 3; order++) {
        kvr_queue_t *q = mkqueue(64, (kvr_queue_order_t)order, 0);
        uintptr_t ids[40];
        for (uintptr_t i = 0; i < 40; i++) {
            push(q, 777, 0.5, 10, i + 1);
            ids[i] = i + 1;
        }
        expect_order(q, ids, 40);
        kvr_queue_free(q);
    }
}

static void test_limits_and_rejections(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(3, KVR_QUEUE_ORDER_FCFS, 0);
    for (uintptr_t i = 1; i <= 3; i++)
        push(q, 0, 0, 0, i);
    kvr_queue_item_t it = {.isl_tokens = 5};
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EQUEUEFULL);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EQUEUEFULL);
    kvr_queue_stats_t st;
    kvr_queue_stats(q, &st);
    assert_int_equal(st.rejected, 2);
    assert_int_equal(st.enqueued, 3);
    assert_int_equal(st.pending, 3);
    assert_int_equal(st.pending_isl_tokens, 300);
    assert_int_equal(kvr_queue_pop(q, NULL), KVR_OK);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_OK);
    /* runtime limits: never above the capacity */
    assert_int_equal(kvr_queue_set_limits(q, 4, 0), KVR_ERANGE);
    assert_int_equal(kvr_queue_set_limits(q, 2, 0), KVR_OK);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EQUEUEFULL);
    assert_int_equal(kvr_queue_set_limits(q, 0, 0), KVR_OK); /* back to the capacity */
    ok(q);
    kvr_queue_free(q);

    /* pending ISL tokens: checked before adding, so the crossing request gets in */
    q = mkqueue(16, KVR_QUEUE_ORDER_FCFS, 1000);
    it.isl_tokens = 600;
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_OK);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_OK);
    it.isl_tokens = 1;
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EQUEUEFULL);
    assert_int_equal(kvr_queue_pop(q, NULL), KVR_OK);
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_OK);
    kvr_queue_stats(q, &st);
    assert_int_equal(st.rejected, 1);
    assert_int_equal(st.pending_isl_tokens, 601);
    /* bad input is an error, not a rejection */
    it.priority_jump = NAN;
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EINVAL);
    it.priority_jump = INFINITY;
    assert_int_equal(kvr_queue_push(q, &it, 0, NULL), KVR_EINVAL);
    kvr_queue_stats(q, &st);
    assert_int_equal(st.rejected, 1);
    ok(q);
    kvr_queue_free(q);
}

static void test_cancellation(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(4, KVR_QUEUE_ORDER_FCFS, 0);
    kvr_queue_handle_t h[4];
    for (uintptr_t i = 0; i < 4; i++)
        h[i] = push(q, i, 0, 0, i + 1);
    kvr_queue_entry_t e;
    assert_int_equal(kvr_queue_remove(q, h[1], &e), KVR_OK);
    assert_true(e.item.user == tag(2));
    assert_true(e.handle == h[1]);
    ok(q);
    assert_int_equal(kvr_queue_remove(q, h[1], &e), KVR_ENOTFOUND); /* twice */
    assert_int_equal(kvr_queue_pop(q, &e), KVR_OK);
    assert_int_equal(kvr_queue_remove(q, h[0], NULL), KVR_ENOTFOUND); /* dispatched */
    assert_int_equal(kvr_queue_remove(q, 0, NULL), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_remove(q, UINT64_MAX, NULL), KVR_ENOTFOUND);
    /* a freed slot is reused: the old handle still names nothing */
    kvr_queue_handle_t h5 = push(q, 10, 0, 0, 5);
    kvr_queue_handle_t h6 = push(q, 11, 0, 0, 6);
    assert_true(h5 != h[0] && h5 != h[1] && h6 != h[0] && h6 != h[1]);
    assert_int_equal(kvr_queue_remove(q, h[0], NULL), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_remove(q, h[1], NULL), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_remove(q, h6, NULL), KVR_OK);
    kvr_queue_stats_t st;
    kvr_queue_stats(q, &st);
    assert_int_equal(st.cancelled, 2);
    assert_int_equal(st.dispatched, 1);
    assert_int_equal(st.pending, 3);
    expect_order(q, (const uintptr_t[]){3, 4, 5}, 3);
    kvr_queue_free(q);
}

static void test_expiry(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(8, KVR_QUEUE_ORDER_FCFS, 0);
    uint64_t timeouts[] = {100, 50, 0, 200, 50};
    for (uintptr_t i = 0; i < 5; i++) {
        kvr_queue_item_t it = {.isl_tokens = 10, .timeout_ms = timeouts[i], .user = tag(i + 1)};
        assert_int_equal(kvr_queue_push(q, &it, 1000 + i, NULL), KVR_OK);
    }
    assert_int_equal(kvr_queue_next_deadline(q), 1051);
    kvr_queue_entry_t e;
    assert_int_equal(kvr_queue_expire(q, 1050, &e), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_expire(q, 1100, &e), KVR_OK);
    assert_true(e.item.user == tag(2));
    assert_int_equal(e.deadline_ms, 1051);
    assert_int_equal(e.enqueued_ms, 1001);
    assert_int_equal(kvr_queue_expire(q, 1100, &e), KVR_OK); /* earliest deadline first */
    assert_true(e.item.user == tag(5));
    assert_int_equal(e.deadline_ms, 1054);
    assert_int_equal(kvr_queue_expire(q, 1099, &e), KVR_ENOTFOUND); /* id 1: 1000 + 100 */
    assert_int_equal(kvr_queue_expire(q, 1100, &e), KVR_OK);
    assert_true(e.item.user == tag(1));
    assert_int_equal(kvr_queue_expire(q, 1100, &e), KVR_ENOTFOUND);
    ok(q);
    assert_int_equal(kvr_queue_next_deadline(q), 1203);
    assert_int_equal(kvr_queue_expire(q, UINT64_MAX - 1, &e), KVR_OK);
    assert_true(e.item.user == tag(4));
    /* no deadline: never expires */
    assert_int_equal(kvr_queue_expire(q, UINT64_MAX, &e), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_next_deadline(q), UINT64_MAX);
    kvr_queue_stats_t st;
    kvr_queue_stats(q, &st);
    assert_int_equal(st.expired, 4);
    assert_int_equal(st.pending, 1);
    /* a timeout that would overflow the clock means no deadline */
    kvr_queue_item_t far = {.timeout_ms = UINT64_MAX};
    assert_int_equal(kvr_queue_push(q, &far, 5, NULL), KVR_OK);
    assert_int_equal(kvr_queue_next_deadline(q), UINT64_MAX);
    ok(q);
    kvr_queue_free(q);
}

static void test_gauges_zero_after_drain(void **s)
{
    (void)s;
    kvr_queue_t *q = mkqueue(64, KVR_QUEUE_ORDER_WSPT, 0);
    kvr_queue_handle_t h[64];
    for (uintptr_t i = 0; i < 64; i++) {
        kvr_queue_item_t it = {.isl_tokens = 1 + i * 37, .cost_tokens = 1 + i % 7,
                               .timeout_ms = i % 3 == 0 ? 10 : 0, .user = tag(i)};
        assert_int_equal(kvr_queue_push(q, &it, 0, &h[i]), KVR_OK);
    }
    for (size_t i = 1; i < 64; i += 5)
        (void)kvr_queue_remove(q, h[i], NULL);
    while (kvr_queue_expire(q, 10, NULL) == KVR_OK)
        ok(q);
    while (kvr_queue_pop(q, NULL) == KVR_OK)
        ok(q);
    kvr_queue_stats_t st;
    kvr_queue_stats(q, &st);
    assert_int_equal(st.pending, 0);
    assert_int_equal(st.pending_isl_tokens, 0);
    assert_int_equal(st.enqueued, 64);
    assert_int_equal(st.dispatched + st.expired + st.cancelled, 64);
    assert_true(st.expired > 0 && st.cancelled > 0 && st.dispatched > 0);
    assert_int_equal(kvr_queue_len(q), 0);
    ok(q);
    kvr_queue_free(q);
}

static void test_config_validation(void **s)
{
    (void)s;
    const char *field;
    kvr_queue_config_t cfg = {.capacity = 2};
    assert_int_equal(kvr_queue_config_validate(&cfg, &field), KVR_OK);
    size_t bad_caps[] = {0, 1, KVR_QUEUE_MAX_CAPACITY + 1, SIZE_MAX};
    for (size_t i = 0; i < 4; i++) {
        cfg.capacity = bad_caps[i];
        assert_int_equal(kvr_queue_config_validate(&cfg, &field), KVR_EINVAL);
        assert_string_equal(field, "queue_capacity");
        int st = 0;
        assert_null(kvr_queue_new(&cfg, &st));
        assert_int_equal(st, KVR_EINVAL);
    }
    cfg = (kvr_queue_config_t){.capacity = 8, .order = (kvr_queue_order_t)9};
    assert_int_equal(kvr_queue_config_validate(&cfg, &field), KVR_EINVAL);
    assert_string_equal(field, "router_queue_policy");
    assert_int_equal(kvr_queue_config_validate(NULL, &field), KVR_EINVAL);
    kvr_queue_free(NULL);
    assert_int_equal(kvr_queue_pop(NULL, NULL), KVR_ENOTFOUND);
    assert_int_equal(kvr_queue_len(NULL), 0);
}

/* ---- model-based ---- */

#define MCAP 48

typedef struct ment {
    uint32_t strict;
    double score;
    uint64_t seq, deadline, isl;
    kvr_queue_handle_t h;
    uintptr_t id;
} ment_t;

typedef struct model {
    ment_t e[MCAP];
    size_t n, max_requests;
    uint64_t max_isl, isl;
    kvr_queue_order_t order;
    bool has_epoch;
    uint64_t epoch, next_seq, now, rng, next_id;
    kvr_queue_stats_t st;
    kvr_queue_handle_t dead[64];
    size_t n_dead;
    kvr_queue_t *q;
    unsigned long seed, step;
    char why[256];
    int failed;
} model_t;

#define CHECK(m, cond, ...)                                                                 \
    do {                                                                                    \
        if (!(cond) && !(m)->failed) {                                                      \
            (m)->failed = 1;                                                                \
            snprintf((m)->why, sizeof (m)->why, __VA_ARGS__);                               \
        }                                                                                   \
    } while (0)

static uint64_t rnd(model_t *m)
{
    uint64_t z = (m->rng += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static unsigned below(model_t *m, unsigned n) { return (unsigned)(rnd(m) % n); }

/* The policy score, written out independently of queue.c. */
static double model_score(const model_t *m, double jump, uint64_t cost)
{
    double j = jump < 0 ? 0 : jump;
    double offset = ((double)m->now - (double)m->epoch) / 1000.0;
    if (m->order == KVR_QUEUE_ORDER_WSPT)
        return (1.0 + j) / (double)(cost == 0 ? 1 : cost);
    return m->order == KVR_QUEUE_ORDER_LCFS ? j + offset : j - offset;
}

static bool mbetter(const ment_t *a, const ment_t *b)
{
    if (a->strict != b->strict)
        return a->strict > b->strict;
    if (a->score != b->score)
        return a->score > b->score;
    return a->seq < b->seq;
}

static void mdrop(model_t *m, size_t i)
{
    m->isl -= m->e[i].isl;
    m->dead[m->n_dead++ % 64] = m->e[i].h;
    m->e[i] = m->e[--m->n];
}

static void check_entry(model_t *m, const kvr_queue_entry_t *got, const ment_t *want,
                        const char *op)
{
    CHECK(m, got->handle == want->h && got->item.user == (void *)want->id &&
                 got->seq == want->seq && got->deadline_ms == want->deadline &&
                 got->item.isl_tokens == want->isl,
          "%s: got id %lu seq %llu, model id %lu seq %llu", op,
          (unsigned long)(uintptr_t)got->item.user, (unsigned long long)got->seq,
          (unsigned long)want->id, (unsigned long long)want->seq);
}

static void op_push(model_t *m)
{
    static const double jumps[] = {0, 0, 0, -1, 0.25, 1, 2.5, 30};
    kvr_queue_item_t it = {
        .isl_tokens = below(m, 4) == 0 ? 0 : 1 + below(m, 4000),
        .cost_tokens = below(m, 6) == 0 ? 0 : 1 + below(m, 8),
        .priority_jump = jumps[below(m, 8)],
        .strict_priority = below(m, 5) == 0 ? below(m, 3) : 0,
        .timeout_ms = below(m, 3) == 0 ? 0 : 1 + below(m, 3000),
        .user = (void *)(uintptr_t)++m->next_id,
    };
    bool full = m->n >= m->max_requests || (m->max_isl != 0 && m->isl >= m->max_isl);
    kvr_queue_handle_t h = 0;
    int rc = kvr_queue_push(m->q, &it, m->now, &h);
    CHECK(m, rc == (full ? KVR_EQUEUEFULL : KVR_OK), "push: rc %s, model full %d",
          kvr_status_name(rc), full);
    if (full) {
        m->st.rejected++;
        return;
    }
    if (!m->has_epoch) {
        m->has_epoch = true;
        m->epoch = m->now;
    }
    ment_t *e = &m->e[m->n++];
    *e = (ment_t){.strict = it.strict_priority,
                  .score = model_score(m, it.priority_jump, it.cost_tokens),
                  .seq = m->next_seq++,
                  .deadline = it.timeout_ms ? m->now + it.timeout_ms : UINT64_MAX,
                  .isl = it.isl_tokens,
                  .h = h,
                  .id = (uintptr_t)it.user};
    m->isl += it.isl_tokens;
    m->st.enqueued++;
}

static size_t mbest(const model_t *m)
{
    size_t b = 0;
    for (size_t i = 1; i < m->n; i++)
        if (mbetter(&m->e[i], &m->e[b]))
            b = i;
    return b;
}

static void op_pop(model_t *m, bool peek)
{
    kvr_queue_entry_t got;
    int rc = peek ? kvr_queue_peek(m->q, &got) : kvr_queue_pop(m->q, &got);
    CHECK(m, rc == (m->n ? KVR_OK : KVR_ENOTFOUND), "pop: rc %s with %zu queued",
          kvr_status_name(rc), m->n);
    if (m->n == 0 || rc != KVR_OK)
        return;
    size_t b = mbest(m);
    check_entry(m, &got, &m->e[b], peek ? "peek" : "pop");
    if (!peek) {
        mdrop(m, b);
        m->st.dispatched++;
    }
}

static void op_remove(model_t *m)
{
    bool live = m->n > 0 && below(m, 5) != 0;
    kvr_queue_handle_t h;
    size_t i = 0;
    if (live) {
        i = below(m, (unsigned)m->n);
        h = m->e[i].h;
    } else {
        h = m->n_dead && below(m, 4) ? m->dead[below(m, (unsigned)(m->n_dead < 64 ? m->n_dead : 64))]
                                     : rnd(m);
    }
    kvr_queue_entry_t got;
    int rc = kvr_queue_remove(m->q, h, &got);
    CHECK(m, rc == (live ? KVR_OK : KVR_ENOTFOUND), "remove %s handle %llx: rc %s",
          live ? "live" : "dead", (unsigned long long)h, kvr_status_name(rc));
    if (live && rc == KVR_OK) {
        check_entry(m, &got, &m->e[i], "remove");
        mdrop(m, i);
        m->st.cancelled++;
    }
}

static void op_expire(model_t *m)
{
    m->now += below(m, 1500);
    for (;;) {
        size_t b = SIZE_MAX;
        for (size_t i = 0; i < m->n; i++) {
            const ment_t *x = &m->e[i];
            if (x->deadline > m->now)
                continue;
            if (b == SIZE_MAX || x->deadline < m->e[b].deadline ||
                (x->deadline == m->e[b].deadline && x->seq < m->e[b].seq))
                b = i;
        }
        kvr_queue_entry_t got;
        int rc = kvr_queue_expire(m->q, m->now, &got);
        CHECK(m, rc == (b != SIZE_MAX ? KVR_OK : KVR_ENOTFOUND), "expire: rc %s",
              kvr_status_name(rc));
        if (b == SIZE_MAX || m->failed)
            return;
        check_entry(m, &got, &m->e[b], "expire");
        mdrop(m, b);
        m->st.expired++;
    }
}

static void op_limits(model_t *m)
{
    size_t maxr = below(m, 3) == 0 ? 0 : 1 + below(m, MCAP);
    uint64_t maxi = below(m, 2) == 0 ? 0 : 1000 + below(m, 40000);
    CHECK(m, kvr_queue_set_limits(m->q, maxr, maxi) == KVR_OK, "set_limits");
    m->max_requests = maxr ? maxr : MCAP;
    m->max_isl = maxi;
}

static void check_state(model_t *m)
{
    char msg[200];
    if (kvr_queue_verify(m->q, msg, sizeof msg) != KVR_OK)
        CHECK(m, 0, "verify: %s", msg);
    kvr_queue_stats_t st;
    kvr_queue_stats(m->q, &st);
    m->st.pending = m->n;
    m->st.pending_isl_tokens = m->isl;
    CHECK(m, memcmp(&st, &m->st, sizeof st) == 0,
          "stats: pending %llu/%llu isl %llu/%llu enq %llu/%llu rej %llu/%llu",
          (unsigned long long)st.pending, (unsigned long long)m->st.pending,
          (unsigned long long)st.pending_isl_tokens, (unsigned long long)m->st.pending_isl_tokens,
          (unsigned long long)st.enqueued, (unsigned long long)m->st.enqueued,
          (unsigned long long)st.rejected, (unsigned long long)m->st.rejected);
    uint64_t next = UINT64_MAX;
    for (size_t i = 0; i < m->n; i++)
        if (m->e[i].deadline < next)
            next = m->e[i].deadline;
    CHECK(m, kvr_queue_next_deadline(m->q) == next, "next deadline %llu, model %llu",
          (unsigned long long)kvr_queue_next_deadline(m->q), (unsigned long long)next);
}

static struct {
    unsigned long full, rejected_isl, expired, cancelled, strict_pops;
} cov;

static int run_seed(unsigned long seed, int steps)
{
    model_t *m = calloc(1, sizeof *m);
    assert_non_null(m);
    m->seed = seed;
    m->rng = seed * 6151 + 3;
    m->order = (kvr_queue_order_t)(seed % 3);
    m->max_requests = MCAP;
    m->now = 1000 * below(m, 5);
    kvr_queue_config_t cfg = {.capacity = MCAP, .order = m->order};
    int st;
    m->q = kvr_queue_new(&cfg, &st);
    assert_non_null(m->q);
    for (m->step = 0; m->step < (unsigned long)steps && !m->failed; m->step++) {
        unsigned r = below(m, 100);
        m->now += below(m, 4) == 0 ? 0 : below(m, 200); /* equal timestamps happen */
        if (r < 45)
            op_push(m);
        else if (r < 65)
            op_pop(m, false);
        else if (r < 70)
            op_pop(m, true);
        else if (r < 85)
            op_remove(m);
        else if (r < 97)
            op_expire(m);
        else
            op_limits(m);
        check_state(m);
    }
    cov.full += m->st.rejected;
    cov.expired += m->st.expired;
    cov.cancelled += m->st.cancelled;
    if (m->max_isl)
        cov.rejected_isl++;
    int failed = m->failed;
    if (failed)
        fprintf(stderr, "queue model FAILED: seed %lu step %lu: %s\n", seed, m->step - 1, m->why);
    kvr_queue_free(m->q);
    free(m);
    return failed;
}

static void test_model_random(void **state)
{
    (void)state;
    static const kvr_model_plan_t plan = {
        .seeds = 300, .seeds_asan = 30, .steps = 4000, .steps_one = 20000};
    assert_int_equal(kvr_model_drive(&plan, run_seed), 0);
    if (kvr_test_seed(&(unsigned long){0}))
        return; /* one seed: the coverage bounds are for the whole sweep */
    printf("queue model: rejected %lu expired %lu cancelled %lu\n", cov.full, cov.expired,
           cov.cancelled);
    assert_true(cov.full > 100);
    assert_true(cov.expired > 100);
    assert_true(cov.cancelled > 100);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fcfs_priority_jump),
        cmocka_unit_test(test_wspt),
        cmocka_unit_test(test_lcfs),
        cmocka_unit_test(test_strict_priority),
        cmocka_unit_test(test_fifo_among_equals),
        cmocka_unit_test(test_limits_and_rejections),
        cmocka_unit_test(test_cancellation),
        cmocka_unit_test(test_expiry),
        cmocka_unit_test(test_gauges_zero_after_drain),
        cmocka_unit_test(test_config_validation),
        cmocka_unit_test(test_model_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
