/*
 * test_kv_publisher.c: the engine-side KV-event publisher on real ZeroMQ sockets over
 * loopback, no mocks: the exact PUB frames a SUB receives (bind and connect modes), the replay
 * protocol from a DEALER (whole buffer, from the middle, older than the ring, past the newest,
 * malformed requests, a REQ client, a peer that stops reading), the ring's step and byte caps,
 * the address rules (bind/connect, data-parallel ranks), configuration errors, and the
 * router's own listener (zmq_listener.h) recovering the batches it missed from this
 * publisher's replay socket.
 *
 * Ports: publishers bind port 0 on a "*" host and the test reads the port libzmq chose, so no port is
 * guessed. Every receive has a timeout; every wait has a deadline.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include <cmocka.h>
#include <zmq.h>

#include "kvrouter.h"
#include "events/kv_publisher.h"
#include "base/log.h"
#include "events/zmq_listener.h"

#define RECV_TIMEOUT_MS 2000

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

/* The payload of batch seq: its number then a pattern, 9 to 60 bytes, never empty. */
static size_t make_payload(uint64_t seq, uint8_t *buf)
{
    size_t len = 9 + (size_t)(seq % 52);
    put_be64(buf, seq);
    for (size_t i = 8; i < len; i++)
        buf[i] = (uint8_t)(seq * 31 + i);
    return len;
}

static bool payload_is(uint64_t seq, const void *data, size_t len)
{
    uint8_t want[64];
    size_t n = make_payload(seq, want);
    return len == n && memcmp(data, want, n) == 0;
}

static uint64_t publish_seq(kvr_kv_pub_t *p)
{
    uint8_t buf[64];
    uint64_t seq = UINT64_MAX, next = kvr_kv_pub_next_seq(p);
    assert_int_equal(kvr_kv_pub_publish(p, buf, make_payload(next, buf), &seq), KVR_OK);
    assert_int_equal(seq, next);
    return seq;
}

static void verify(const kvr_kv_pub_t *p)
{
    char msg[200];
    if (kvr_kv_pub_verify(p, msg, sizeof msg) != KVR_OK)
        fail_msg("publisher invariant: %s", msg);
}

static kvr_kv_pub_stats_t stats(const kvr_kv_pub_t *p)
{
    kvr_kv_pub_stats_t st;
    kvr_kv_pub_get_stats(p, &st);
    return st;
}

/* "tcp://0.0.0.0:41234" (what a "*" bind reports) -> "tcp://127.0.0.1:41234" */
static void loopback(const kvr_kv_pub_t *p, bool replay, char *out, size_t cap)
{
    char bound[128];
    assert_int_equal(kvr_kv_pub_endpoint(p, replay, bound, sizeof bound), KVR_OK);
    const char *port = strrchr(bound, ':');
    assert_non_null(port);
    snprintf(out, cap, "tcp://127.0.0.1%s", port);
}

static kvr_kv_pub_t *pub_open(void *ctx, kvr_kv_pub_config_t cfg)
{
    int st = -100;
    char err[200] = "";
    kvr_kv_pub_t *p = kvr_kv_pub_new(ctx, &cfg, &st, err, sizeof err);
    if (p == NULL)
        fail_msg("kvr_kv_pub_new: %s (%s)", kvr_status_name(st), err);
    assert_int_equal(st, KVR_OK);
    verify(p);
    return p;
}

static void *sock(void *ctx, int type)
{
    void *s = zmq_socket(ctx, type);
    assert_non_null(s);
    int linger = 0, timeout = RECV_TIMEOUT_MS;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
    return s;
}

/* Receives one multipart message (up to 8 frames) into fixed buffers; returns the frame
 * count, 0 on timeout. */
typedef struct frames {
    int n;
    size_t len[8];
    uint8_t data[8][512];
} frames_t;

static int recv_frames(void *s, frames_t *f)
{
    memset(f, 0, sizeof *f);
    int more = 1;
    while (more) {
        zmq_msg_t m;
        zmq_msg_init(&m);
        if (zmq_msg_recv(&m, s, 0) < 0) {
            zmq_msg_close(&m);
            return f->n == 0 ? 0 : -1;
        }
        more = zmq_msg_more(&m);
        if (f->n < 8) {
            size_t len = zmq_msg_size(&m);
            f->len[f->n] = len;
            memcpy(f->data[f->n], zmq_msg_data(&m), len < 512 ? len : 512);
            f->n++;
        }
        zmq_msg_close(&m);
    }
    return f->n;
}

/* ---- addresses ---- */

static void test_should_bind(void **state)
{
    (void)state;
    assert_true(kvr_kv_pub_should_bind("tcp://*:5557"));
    assert_true(kvr_kv_pub_should_bind("tcp://[::]:5557"));
    assert_true(kvr_kv_pub_should_bind("tcp://[::1]:5557")); /* "::" anywhere */
    assert_true(kvr_kv_pub_should_bind("ipc:///tmp/kv-events"));
    assert_true(kvr_kv_pub_should_bind("inproc://kv-events"));
    assert_false(kvr_kv_pub_should_bind("tcp://127.0.0.1:5557"));
    assert_false(kvr_kv_pub_should_bind("tcp://router-host:5557"));
    assert_false(kvr_kv_pub_should_bind("tcp://0.0.0.0:5557")); /* vLLM connects (SGLang binds) */
    assert_false(kvr_kv_pub_should_bind(NULL));
}

static void expect_rank(const char *ep, uint32_t rank, const char *want)
{
    char out[128];
    int rc = kvr_kv_pub_endpoint_for_rank(ep, rank, out, sizeof out);
    if (rc != KVR_OK)
        fail_msg("%s rank %u: %s", ep, rank, kvr_status_name(rc));
    assert_string_equal(out, want);
}

static void expect_rank_error(const char *ep, uint32_t rank, int want)
{
    char out[128];
    int rc = kvr_kv_pub_endpoint_for_rank(ep, rank, out, sizeof out);
    if (rc != want)
        fail_msg("%s rank %u: %s, expected %s", ep, rank, kvr_status_name(rc),
                 kvr_status_name(want));
}

static void test_endpoint_for_rank(void **state)
{
    (void)state;
    expect_rank("tcp://*:5557", 0, "tcp://*:5557");
    expect_rank("tcp://*:5557", 3, "tcp://*:5560");
    expect_rank("tcp://10.0.0.7:5558", 1, "tcp://10.0.0.7:5559");
    expect_rank("tcp://*:65534", 1, "tcp://*:65535");
    expect_rank("tcp://[::1]:5557", 2, "tcp://[::1]:5559");
    expect_rank("ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2");
    expect_rank("inproc://kv", 1, "inproc://kv_dp1");
    expect_rank("tcp://router-host", 0, "tcp://router-host"); /* rank 0: verbatim, as vLLM */
    expect_rank_error("tcp://router-host", 1, KVR_EINVAL);   /* no port */
    expect_rank_error("tcp://[::1]", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:*", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:55x7", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:-5", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:65535", 1, KVR_EINVAL);  /* port overflow */
    expect_rank_error("tcp://*:70000", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:123456", 1, KVR_EINVAL);
    expect_rank_error("tcp://*:5557", UINT32_MAX, KVR_EINVAL);
    expect_rank_error("udp://*:5557", 1, KVR_EINVAL);
    expect_rank_error(NULL, 1, KVR_EINVAL);
    char small[12];
    assert_int_equal(kvr_kv_pub_endpoint_for_rank("tcp://*:5557", 1, small, sizeof small),
                     KVR_ETOOBIG);
    assert_int_equal(kvr_kv_pub_endpoint_for_rank("tcp://*:5557", 0, small, sizeof small),
                     KVR_ETOOBIG);
    assert_int_equal(kvr_kv_pub_endpoint_for_rank("inproc://kv", 10, small, sizeof small),
                     KVR_ETOOBIG);
}

/* ---- configuration ---- */

static void expect_new_error(void *ctx, const kvr_kv_pub_config_t *cfg, int want,
                             const char *want_err)
{
    int st = 0;
    char err[200] = "";
    kvr_kv_pub_t *p = kvr_kv_pub_new(ctx, cfg, &st, err, sizeof err);
    if (p != NULL) {
        kvr_kv_pub_free(p);
        fail_msg("expected %s (%s), got a publisher", kvr_status_name(want), want_err);
    }
    if (st != want)
        fail_msg("status %s, expected %s (err: %s)", kvr_status_name(st), kvr_status_name(want),
                 err);
    if (strcmp(err, want_err) != 0)
        fail_msg("err \"%s\", expected \"%s\"", err, want_err);
}

static void test_config_errors(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    kvr_kv_pub_config_t ok = {.endpoint = "tcp://*:0", .buffer_steps = 10};
    expect_new_error(NULL, &ok, KVR_EINVAL, "kv events publisher: no ZMQ context");
    expect_new_error(ctx, NULL, KVR_EINVAL, "kv events endpoint missing");
    kvr_kv_pub_config_t c = ok;
    c.endpoint = "";
    expect_new_error(ctx, &c, KVR_EINVAL, "kv events endpoint missing");
    c = ok;
    c.buffer_steps = 0;
    expect_new_error(ctx, &c, KVR_EINVAL, "kv events buffer_steps must be >= 1");
    c = ok;
    c.hwm = -1;
    expect_new_error(ctx, &c, KVR_EINVAL, "kv events hwm -1 must be >= 0");
    c = ok;
    c.endpoint = "nonsense://x";
    expect_new_error(ctx, &c, KVR_EINVAL, "kv events endpoint nonsense://x: Protocol not supported");

    /* a port already taken: the error names the endpoint and the reason */
    kvr_kv_pub_config_t first_cfg = {.endpoint = "tcp://*:0", .replay_endpoint = "tcp://*:0",
                                     .buffer_steps = 10};
    kvr_kv_pub_t *first = pub_open(ctx, first_cfg);
    char bound[128], taken[128], want[256];
    assert_int_equal(kvr_kv_pub_endpoint(first, false, bound, sizeof bound), KVR_OK);
    snprintf(taken, sizeof taken, "tcp://*%s", strrchr(bound, ':'));
    c = ok;
    c.endpoint = taken;
    snprintf(want, sizeof want, "kv events endpoint %s: Address already in use", taken);
    expect_new_error(ctx, &c, KVR_EIO, want);
    assert_int_equal(kvr_kv_pub_endpoint(first, true, bound, sizeof bound), KVR_OK);
    snprintf(taken, sizeof taken, "tcp://*%s", strrchr(bound, ':'));
    c = ok;
    c.replay_endpoint = taken;
    snprintf(want, sizeof want, "kv events replay endpoint %s: Address already in use", taken);
    expect_new_error(ctx, &c, KVR_EIO, want);

    /* no replay socket: nothing to report, nothing to poll */
    kvr_kv_pub_t *plain = pub_open(ctx, ok);
    assert_int_equal(kvr_kv_pub_endpoint(plain, true, bound, sizeof bound), KVR_ENOTFOUND);
    assert_int_equal(kvr_kv_pub_poll_replay(plain), 0);
    char tiny[4];
    assert_int_equal(kvr_kv_pub_endpoint(plain, false, tiny, sizeof tiny), KVR_ETOOBIG);

    kvr_kv_pub_free(plain);
    kvr_kv_pub_free(first);
    kvr_kv_pub_free(NULL);
    assert_int_equal(zmq_ctx_term(ctx), 0);
}

static void test_publish_argument_errors(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    kvr_kv_pub_t *p = pub_open(ctx, (kvr_kv_pub_config_t){.endpoint = "tcp://*:0",
                                                           .buffer_steps = 4});
    uint8_t b = 1;
    assert_int_equal(kvr_kv_pub_publish(p, &b, 0, NULL), KVR_EINVAL); /* reads as end marker */
    assert_int_equal(kvr_kv_pub_publish(p, NULL, 5, NULL), KVR_EINVAL);
    assert_int_equal(kvr_kv_pub_publish(NULL, &b, 1, NULL), KVR_EINVAL);
    assert_int_equal(kvr_kv_pub_next_seq(p), 0);
    assert_int_equal(stats(p).buffered, 0);
    verify(p);
    /* no subscriber: a PUB socket drops silently, the batch is still numbered and kept */
    assert_int_equal(kvr_kv_pub_publish(p, &b, 1, NULL), KVR_OK);
    assert_int_equal(kvr_kv_pub_next_seq(p), 1);
    assert_int_equal(stats(p).published, 1);
    assert_int_equal(stats(p).buffered, 1);
    verify(p);
    kvr_kv_pub_free(p);
    zmq_ctx_term(ctx);
}

/* ---- the PUB frames ---- */

/* A publisher and a SUB that has provably joined: the SUB received batch 0 (a SUB misses
 * whatever is published before its subscription reaches the PUB, and nothing on the PUB side
 * says when that happened, so an attempt that missed batch 0 starts over with a fresh
 * publisher, waiting a little longer). sub_binds: the SUB binds and the publisher connects. */
typedef struct pubsub {
    kvr_kv_pub_t *p;
    void *sub;
} pubsub_t;

static void check_batch(const frames_t *f, const char *topic, uint64_t seq)
{
    assert_int_equal(f->n, 3);
    assert_int_equal(f->len[0], strlen(topic));
    assert_memory_equal(f->data[0], topic, strlen(topic));
    assert_int_equal(f->len[1], 8);
    assert_int_equal(be64(f->data[1]), seq);
    assert_true(payload_is(seq, f->data[2], f->len[2]));
}

static pubsub_t pubsub_open(void *ctx, kvr_kv_pub_config_t cfg, bool sub_binds, bool ipv6)
{
    for (int attempt = 1; attempt <= 20; attempt++) {
        pubsub_t ps = {0};
        ps.sub = sock(ctx, ZMQ_SUB);
        int one = 1, quick = 100 * attempt;
        if (ipv6)
            zmq_setsockopt(ps.sub, ZMQ_IPV6, &one, sizeof one);
        zmq_setsockopt(ps.sub, ZMQ_SUBSCRIBE, "", 0);
        zmq_setsockopt(ps.sub, ZMQ_RCVTIMEO, &quick, sizeof quick);
        char addr[128], ep[128];
        if (sub_binds) {
            assert_int_equal(zmq_bind(ps.sub, "tcp://127.0.0.1:*"), 0);
            size_t n = sizeof addr;
            zmq_getsockopt(ps.sub, ZMQ_LAST_ENDPOINT, addr, &n);
            cfg.endpoint = addr;
            assert_false(kvr_kv_pub_should_bind(addr));
            ps.p = pub_open(ctx, cfg);
        } else {
            ps.p = pub_open(ctx, cfg);
            if (ipv6) {
                assert_int_equal(kvr_kv_pub_endpoint(ps.p, false, ep, sizeof ep), KVR_OK);
            } else {
                loopback(ps.p, false, ep, sizeof ep);
            }
            assert_int_equal(zmq_connect(ps.sub, ep), 0);
        }
        /* a SUB that binds sends its subscription once it handles the new connection, which
         * it does inside a libzmq call (poll, recv): an idle one would miss batch 0 forever */
        zmq_pollitem_t it = {.socket = ps.sub, .events = ZMQ_POLLIN};
        (void)zmq_poll(&it, 1, 10 * attempt);
        publish_seq(ps.p);
        frames_t f;
        if (recv_frames(ps.sub, &f) > 0) {
            check_batch(&f, cfg.topic ? cfg.topic : "", 0);
            int timeout = RECV_TIMEOUT_MS;
            zmq_setsockopt(ps.sub, ZMQ_RCVTIMEO, &timeout, sizeof timeout);
            return ps;
        }
        kvr_kv_pub_free(ps.p);
        zmq_close(ps.sub);
    }
    fail_msg("a SUB never received batch 0 in 20 attempts");
    return (pubsub_t){0};
}

static void pubsub_close(pubsub_t *ps)
{
    kvr_kv_pub_free(ps->p);
    zmq_close(ps->sub);
}

static void test_sub_receives_exact_frames(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    kvr_kv_pub_config_t cfg = {.endpoint = "tcp://*:0", .topic = "kv-events",
                               .buffer_steps = 100};
    pubsub_t ps = pubsub_open(ctx, cfg, false, false);
    for (int i = 1; i < 60; i++)
        assert_int_equal(publish_seq(ps.p), (uint64_t)i);
    for (uint64_t seq = 1; seq < 60; seq++) {
        frames_t f;
        assert_int_equal(recv_frames(ps.sub, &f), 3);
        check_batch(&f, "kv-events", seq);
    }
    /* a payload far larger than a frame buffer: compare through a full-size receive */
    size_t big = 200000;
    uint8_t *payload = malloc(big), *got = malloc(big + 1);
    for (size_t i = 0; i < big; i++)
        payload[i] = (uint8_t)(i * 7 + 3);
    uint64_t seq = 0;
    assert_int_equal(kvr_kv_pub_publish(ps.p, payload, big, &seq), KVR_OK);
    assert_int_equal(seq, 60);
    char topic[16];
    uint8_t seq_be[8];
    assert_int_equal(zmq_recv(ps.sub, topic, sizeof topic, 0), 9);
    assert_int_equal(zmq_recv(ps.sub, seq_be, sizeof seq_be, 0), 8);
    assert_int_equal(be64(seq_be), 60);
    assert_int_equal(zmq_recv(ps.sub, got, big + 1, 0), (int)big);
    assert_memory_equal(got, payload, big);
    free(payload);
    free(got);

    kvr_kv_pub_stats_t st = stats(ps.p);
    assert_int_equal(st.published, 61);
    assert_int_equal(st.publish_errors, 0);
    assert_int_equal(st.buffered, 61);
    verify(ps.p);
    pubsub_close(&ps);
    zmq_ctx_term(ctx);
}

/* vLLM's "connect volatile" case: a host endpoint makes the engine connect to a SUB that binds
 * (the router side). The default topic is an empty frame. */
static void test_connect_mode(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    pubsub_t ps = pubsub_open(ctx, (kvr_kv_pub_config_t){.buffer_steps = 8}, true, false);
    for (uint64_t seq = 1; seq < 5; seq++) {
        publish_seq(ps.p);
        frames_t f;
        assert_int_equal(recv_frames(ps.sub, &f), 3);
        check_batch(&f, "", seq);
    }
    pubsub_close(&ps);
    zmq_ctx_term(ctx);
}

static void test_ipv6_loopback(void **state)
{
    (void)state;
    void *ctx = zmq_ctx_new();
    int st;
    char err[200];
    kvr_kv_pub_config_t cfg = {.endpoint = "tcp://[::1]:0", .buffer_steps = 8};
    kvr_kv_pub_t *probe = kvr_kv_pub_new(ctx, &cfg, &st, err, sizeof err);
    if (probe == NULL) { /* a host without IPv6 loopback: the error must still say why */
        assert_int_equal(st, KVR_EIO);
        assert_non_null(strstr(err, "tcp://[::1]:0"));
        fprintf(stderr, "note: no IPv6 loopback here (%s); IPv6 transfer not tested\n", err);
        zmq_ctx_term(ctx);
        return;
    }
    kvr_kv_pub_free(probe);
    pubsub_t ps = pubsub_open(ctx, cfg, false, true);
    publish_seq(ps.p);
    frames_t f;
    assert_int_equal(recv_frames(ps.sub, &f), 3);
    check_batch(&f, "", 1);
    pubsub_close(&ps);
    zmq_ctx_term(ctx);
}

/* ---- replay from a DEALER ---- */

typedef struct replay_fix {
    void *ctx;
    kvr_kv_pub_t *p;
    void *dealer;
} replay_fix_t;

static replay_fix_t replay_open(uint32_t steps, size_t bytes)
{
    replay_fix_t r = {.ctx = zmq_ctx_new()};
    r.p = pub_open(r.ctx, (kvr_kv_pub_config_t){.endpoint = "tcp://*:0",
                                                 .replay_endpoint = "tcp://*:0",
                                                 .buffer_steps = steps,
                                                 .buffer_bytes = bytes});
    char ep[128];
    loopback(r.p, true, ep, sizeof ep);
    r.dealer = sock(r.ctx, ZMQ_DEALER);
    assert_int_equal(zmq_connect(r.dealer, ep), 0);
    return r;
}

static void replay_close(replay_fix_t *r)
{
    zmq_close(r->dealer);
    kvr_kv_pub_free(r->p);
    assert_int_equal(zmq_ctx_term(r->ctx), 0);
}

static void send_request(void *dealer, uint64_t start)
{
    uint8_t req[8];
    put_be64(req, start);
    assert_int_equal(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(dealer, req, 8, 0), 8);
}

/* Polls the replay socket until `want` more requests have been answered (2 s at most). */
static void serve(kvr_kv_pub_t *p, int want)
{
    int got = 0;
    uint64_t end = now_ms() + RECV_TIMEOUT_MS;
    while (got < want && now_ms() < end) {
        uint64_t t0 = now_ms();
        got += kvr_kv_pub_poll_replay(p);
        assert_true(now_ms() - t0 < 5000); /* never blocks (a block never returns) */
        if (got < want)
            sleep_ms(1);
    }
    if (got != want)
        fail_msg("answered %d replay requests, expected %d", got, want);
}

/* Receives one replay answer: the batch numbers in *seqs (checking every payload), until the
 * end marker. Returns how many batches came. */
static size_t recv_replay_checked(void *dealer, uint64_t *seqs, size_t max, bool check)
{
    size_t n = 0;
    for (;;) {
        frames_t f;
        int nf = recv_frames(dealer, &f);
        if (nf == 0)
            fail_msg("replay answer stopped after %zu batches, no end marker", n);
        assert_int_equal(nf, 3);
        assert_int_equal(f.len[0], 0);
        assert_int_equal(f.len[1], 8);
        if (f.len[2] == 0) {
            assert_int_equal(be64(f.data[1]), UINT64_MAX); /* ff x 8 */
            return n;
        }
        uint64_t seq = be64(f.data[1]);
        if (check && !payload_is(seq, f.data[2], f.len[2]))
            fail_msg("replayed batch %llu: payload differs from the published one",
                     (unsigned long long)seq);
        if (n < max)
            seqs[n] = seq;
        n++;
    }
}

static size_t recv_replay(void *dealer, uint64_t *seqs, size_t max)
{
    return recv_replay_checked(dealer, seqs, max, true);
}

/* Asks for start and expects batches first, first + 1, ... (count of them), then the marker.
 * check: payloads are make_payload()'s. */
static void expect_replay_checked(replay_fix_t *r, uint64_t start, uint64_t first, size_t count,
                                  bool check)
{
    send_request(r->dealer, start);
    serve(r->p, 1);
    uint64_t seqs[2048];
    size_t n = recv_replay_checked(r->dealer, seqs, 2048, check);
    if (n != count)
        fail_msg("replay from %llu: %zu batches, expected %zu", (unsigned long long)start, n,
                 count);
    for (size_t i = 0; i < n && i < 2048; i++)
        if (seqs[i] != first + i)
            fail_msg("replay from %llu: batch %zu is %llu, expected %llu",
                     (unsigned long long)start, i, (unsigned long long)seqs[i],
                     (unsigned long long)(first + i));
}

static void expect_replay(replay_fix_t *r, uint64_t start, uint64_t first, size_t count)
{
    expect_replay_checked(r, start, first, count, true);
}

static void test_replay_whole_middle_and_past_newest(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(100, 0);
    expect_replay(&r, 0, 0, 0); /* nothing published yet: only the end marker */
    for (int i = 0; i < 10; i++)
        publish_seq(r.p);
    expect_replay(&r, 0, 0, 10);
    expect_replay(&r, 4, 4, 6);
    expect_replay(&r, 9, 9, 1);
    expect_replay(&r, 10, 0, 0); /* the next number: nothing yet */
    expect_replay(&r, UINT64_MAX - 1, 0, 0);
    kvr_kv_pub_stats_t st = stats(r.p);
    assert_int_equal(st.replay_requests, 6);
    assert_int_equal(st.replayed_batches, 17);
    assert_int_equal(st.replay_truncated, 0);
    assert_int_equal(st.invalid_requests, 0);
    assert_int_equal(st.replay_send_errors, 0);
    /* two requests queued before one poll are both answered by it, in order */
    send_request(r.dealer, 8);
    send_request(r.dealer, 7);
    sleep_ms(50);
    serve(r.p, 2);
    uint64_t seqs[16];
    assert_int_equal(recv_replay(r.dealer, seqs, 16), 2);
    assert_int_equal(seqs[0], 8);
    assert_int_equal(recv_replay(r.dealer, seqs, 16), 3);
    assert_int_equal(seqs[0], 7);
    replay_close(&r);
}

static void test_replay_older_than_ring(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(4, 0);
    for (int i = 0; i < 10; i++) {
        publish_seq(r.p);
        verify(r.p);
    }
    assert_int_equal(stats(r.p).buffered, 4);
    expect_replay(&r, 0, 6, 4); /* answered from the oldest kept: the consumer sees 6 */
    assert_int_equal(stats(r.p).replay_truncated, 1);
    expect_replay(&r, 5, 6, 4);
    assert_int_equal(stats(r.p).replay_truncated, 2);
    expect_replay(&r, 6, 6, 4); /* exactly the oldest: complete */
    expect_replay(&r, 8, 8, 2);
    assert_int_equal(stats(r.p).replay_truncated, 2);
    replay_close(&r);
}

static void test_buffer_bytes_cap_evicts_oldest(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(100, 200);
    /* payloads are 9 + seq % 52 bytes: 9, 10, ..., so batches 0..14 weigh 9+...+23 = 240 */
    for (uint64_t i = 0; i < 15; i++) {
        publish_seq(r.p);
        verify(r.p);
    }
    kvr_kv_pub_stats_t st = stats(r.p);
    assert_true(st.buffered_bytes <= 200);
    /* the newest batches that fit: 14 (23) + 13 + ... + 5 (14) = 185, + 4 (13) = 198 */
    assert_int_equal(st.buffered, 11);
    assert_int_equal(st.buffered_bytes, 198);
    expect_replay(&r, 0, 4, 11);
    /* one batch over the whole cap is kept alone (the newest is always replayable) */
    uint8_t *big = malloc(500);
    memset(big, 0xab, 500);
    assert_int_equal(kvr_kv_pub_publish(r.p, big, 500, NULL), KVR_OK);
    st = stats(r.p);
    assert_int_equal(st.buffered, 1);
    assert_int_equal(st.buffered_bytes, 500);
    verify(r.p);
    /* and goes with the next batch */
    uint8_t small[64];
    assert_int_equal(kvr_kv_pub_publish(r.p, small, make_payload(16, small), NULL), KVR_OK);
    st = stats(r.p);
    assert_int_equal(st.buffered, 1);
    assert_int_equal(st.buffered_bytes, 9 + 16);
    verify(r.p);
    expect_replay(&r, 15, 16, 1);
    free(big);
    replay_close(&r);
}

/* The ring starts small and grows to buffer_steps, then wraps. */
static void test_ring_grows_then_wraps(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(1000, 0);
    for (int i = 0; i < 700; i++)
        publish_seq(r.p);
    verify(r.p);
    assert_int_equal(stats(r.p).buffered, 700);
    expect_replay(&r, 650, 650, 50);
    for (int i = 0; i < 600; i++)
        publish_seq(r.p);
    verify(r.p);
    assert_int_equal(stats(r.p).buffered, 1000);
    expect_replay(&r, 0, 300, 1000);
    expect_replay(&r, 1290, 1290, 10);
    replay_close(&r);
}

static void test_malformed_requests_counted_and_ignored(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(10, 0);
    for (int i = 0; i < 3; i++)
        publish_seq(r.p);
    uint8_t req[9] = {0};
    /* [start] without the delimiter: the ROUTER sees 2 frames */
    assert_int_equal(zmq_send(r.dealer, req, 8, 0), 8);
    /* a 9-byte number */
    zmq_send(r.dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(r.dealer, req, 9, 0);
    /* an extra frame */
    zmq_send(r.dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(r.dealer, req, 8, ZMQ_SNDMORE);
    zmq_send(r.dealer, "x", 1, 0);
    /* a non-empty delimiter */
    zmq_send(r.dealer, "x", 1, ZMQ_SNDMORE);
    zmq_send(r.dealer, req, 8, 0);
    /* a pile of frames */
    for (int i = 0; i < 20; i++)
        zmq_send(r.dealer, "", 0, ZMQ_SNDMORE);
    zmq_send(r.dealer, "", 0, 0);
    /* then a good one: answered, the bad ones before it counted */
    expect_replay(&r, 1, 1, 2);
    kvr_kv_pub_stats_t st = stats(r.p);
    assert_int_equal(st.invalid_requests, 5);
    assert_int_equal(st.replay_requests, 1);
    /* nothing was sent back for the bad ones */
    int quick = 100;
    zmq_setsockopt(r.dealer, ZMQ_RCVTIMEO, &quick, sizeof quick);
    frames_t f;
    assert_int_equal(recv_frames(r.dealer, &f), 0);
    replay_close(&r);
}

/* vLLM's example subscriber uses REQ: it gets the first reply of the answer. */
static void test_req_client_gets_first_batch(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(10, 0);
    for (int i = 0; i < 5; i++)
        publish_seq(r.p);
    char ep[128];
    loopback(r.p, true, ep, sizeof ep);
    void *req = sock(r.ctx, ZMQ_REQ);
    assert_int_equal(zmq_connect(req, ep), 0);
    uint8_t start[8];
    put_be64(start, 2);
    assert_int_equal(zmq_send(req, start, 8, 0), 8);
    serve(r.p, 1);
    frames_t f;
    assert_int_equal(recv_frames(req, &f), 2);
    assert_int_equal(be64(f.data[0]), 2);
    assert_true(payload_is(2, f.data[1], f.len[1]));
    zmq_close(req);
    replay_close(&r);
}

/* A client that asks and never reads: its answers wait (continued by later polls) while
 * another client is served in full; past 4 waiting answers its requests are refused; when it
 * goes away its answers are dropped. poll_replay never blocks throughout. */
static void test_stuck_peer_waits_others_served(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(3, 0);
    size_t big = 16 * 1024;
    uint8_t *payload = calloc(1, big);
    for (int i = 0; i < 3; i++)
        assert_int_equal(kvr_kv_pub_publish(r.p, payload, big, NULL), KVR_OK);
    free(payload);
    char ep[128];
    loopback(r.p, true, ep, sizeof ep);
    void *stuck = sock(r.ctx, ZMQ_DEALER);
    int one = 1, small = 4096;
    zmq_setsockopt(stuck, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(stuck, ZMQ_RCVBUF, &small, sizeof small);
    assert_int_equal(zmq_connect(stuck, ep), 0);
    uint64_t end = now_ms() + 10000;
    int asked = 0;
    while (stats(r.p).replay_send_errors == 0 && now_ms() < end) {
        send_request(stuck, 0);
        asked++;
        uint64_t t0 = now_ms();
        (void)kvr_kv_pub_poll_replay(r.p);
        /* a blocking send would never return (the peer never reads): 5 s only turns that
         * hang into a clear failure; it is no speed bound (TSan runs take ~100x longer) */
        if (now_ms() - t0 > 5000)
            fail_msg("kvr_kv_pub_poll_replay blocked %llu ms on a peer that does not read",
                     (unsigned long long)(now_ms() - t0));
    }
    /* every request sent has been read (and answered, kept waiting or refused) */
    while (stats(r.p).replay_requests < (uint64_t)asked && now_ms() < end)
        (void)kvr_kv_pub_poll_replay(r.p);
    kvr_kv_pub_stats_t st = stats(r.p);
    if (st.replay_send_errors == 0)
        fail_msg("%d requests of 48 KiB never read, none refused", asked);
    assert_int_equal(st.replay_requests, asked);
    assert_int_equal(st.replay_in_progress, 4);
    uint64_t refused = st.replay_send_errors; /* every request past its 4th waiting answer */
    /* someone else is answered in full meanwhile */
    expect_replay_checked(&r, 1, 1, 2, false);
    assert_int_equal(stats(r.p).replay_in_progress, 4);
    /* the stuck client leaves: its answers go with it */
    zmq_close(stuck);
    end = now_ms() + RECV_TIMEOUT_MS;
    while (stats(r.p).replay_in_progress > 0 && now_ms() < end) {
        (void)kvr_kv_pub_poll_replay(r.p);
        sleep_ms(1);
    }
    st = stats(r.p);
    assert_int_equal(st.replay_in_progress, 0);
    assert_int_equal(st.replay_send_errors, refused + 4);
    verify(r.p);
    replay_close(&r);
}

/* An answer that waits while the ring moves on continues from the oldest batch still kept,
 * and still ends where the ring ended when the request came: the consumer sees the jump. */
static void test_waiting_answer_jumps_past_evicted(void **state)
{
    (void)state;
    replay_fix_t r = replay_open(4, 0);
    size_t big = 16 * 1024;
    uint8_t *payload = calloc(1, big);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kvr_kv_pub_publish(r.p, payload, big, NULL), KVR_OK);
    char ep[128];
    loopback(r.p, true, ep, sizeof ep);
    void *slow = sock(r.ctx, ZMQ_DEALER);
    int one = 1, small = 4096, quick = 20;
    zmq_setsockopt(slow, ZMQ_RCVHWM, &one, sizeof one);
    zmq_setsockopt(slow, ZMQ_RCVBUF, &small, sizeof small);
    assert_int_equal(zmq_connect(slow, ep), 0);
    uint64_t end = now_ms() + 10000;
    int asked = 0;
    while (stats(r.p).replay_in_progress == 0 && now_ms() < end) {
        send_request(slow, 0);
        asked++;
        /* one request at a time, so none is refused for lack of room */
        while (stats(r.p).replay_requests < (uint64_t)asked && now_ms() < end)
            (void)kvr_kv_pub_poll_replay(r.p);
    }
    assert_true(stats(r.p).replay_in_progress > 0);
    /* eight more batches: everything a waiting answer still had to send is evicted */
    for (int i = 0; i < 8; i++)
        assert_int_equal(kvr_kv_pub_publish(r.p, payload, big, NULL), KVR_OK);
    free(payload);
    /* now read everything; each answer is a prefix of 0..3, ended by the marker */
    zmq_setsockopt(slow, ZMQ_RCVTIMEO, &quick, sizeof quick);
    int answers = 0, short_answers = 0;
    uint64_t expect = 0;
    end = now_ms() + 10000;
    while (answers < asked && now_ms() < end) {
        (void)kvr_kv_pub_poll_replay(r.p);
        zmq_msg_t f[3];
        int nf = 0, more = 1;
        while (more && nf < 3) {
            zmq_msg_init(&f[nf]);
            if (zmq_msg_recv(&f[nf], slow, 0) < 0) {
                zmq_msg_close(&f[nf]);
                break;
            }
            more = zmq_msg_more(&f[nf]);
            nf++;
        }
        if (nf == 3) {
            assert_int_equal(zmq_msg_size(&f[1]), 8);
            uint64_t seq = be64(zmq_msg_data(&f[1]));
            if (zmq_msg_size(&f[2]) == 0) {
                assert_int_equal(seq, UINT64_MAX);
                short_answers += expect < 4;
                answers++;
                expect = 0;
            } else {
                assert_int_equal(seq, expect); /* in order, never past what was asked */
                expect++;
            }
        } else {
            assert_int_equal(nf, 0);
        }
        for (int i = 0; i < nf; i++)
            zmq_msg_close(&f[i]);
    }
    assert_int_equal(answers, asked);
    kvr_kv_pub_stats_t st = stats(r.p);
    assert_int_equal(st.replay_in_progress, 0);
    assert_int_equal(st.replay_send_errors, 0);
    assert_true(st.replay_truncated >= 1);
    assert_int_equal(st.replay_truncated, (uint64_t)short_answers);
    zmq_close(slow);
    replay_close(&r);
}

/* ---- the router's listener against this publisher ---- */

/* The engine thread owns the publisher and answers replay requests on its own schedule, as an
 * engine does; the test thread runs the listener and publishes through engine_publish, under
 * the same mutex, which hands the sockets over with a full barrier as libzmq requires. */
typedef struct engine {
    void *ctx;
    kvr_kv_pub_t *p;
    pthread_t th;
    pthread_mutex_t mu;
    atomic_bool stop;
    char events[128], replay[128];
} engine_t;

static void *engine_main(void *arg)
{
    engine_t *e = arg;
    while (!atomic_load(&e->stop)) {
        pthread_mutex_lock(&e->mu);
        (void)kvr_kv_pub_poll_replay(e->p);
        pthread_mutex_unlock(&e->mu);
        sleep_ms(1);
    }
    return NULL;
}

static void engine_start(engine_t *e, uint32_t steps)
{
    memset(e, 0, sizeof *e);
    e->ctx = zmq_ctx_new();
    e->p = pub_open(e->ctx, (kvr_kv_pub_config_t){.endpoint = "tcp://*:0",
                                                   .replay_endpoint = "tcp://*:0",
                                                   .topic = "kv",
                                                   .buffer_steps = steps});
    loopback(e->p, false, e->events, sizeof e->events);
    loopback(e->p, true, e->replay, sizeof e->replay);
    pthread_mutex_init(&e->mu, NULL);
    atomic_init(&e->stop, false);
    assert_int_equal(pthread_create(&e->th, NULL, engine_main, e), 0);
}

static uint64_t engine_publish(engine_t *e)
{
    pthread_mutex_lock(&e->mu);
    uint64_t seq = publish_seq(e->p);
    pthread_mutex_unlock(&e->mu);
    return seq;
}

static void engine_drop_next(engine_t *e, uint32_t n)
{
    pthread_mutex_lock(&e->mu);
    kvr_kv_pub_drop_next(e->p, n);
    pthread_mutex_unlock(&e->mu);
}

static kvr_kv_pub_stats_t engine_stop(engine_t *e)
{
    atomic_store(&e->stop, true);
    pthread_join(e->th, NULL);
    verify(e->p);
    kvr_kv_pub_stats_t st = stats(e->p);
    kvr_kv_pub_free(e->p);
    pthread_mutex_destroy(&e->mu);
    zmq_ctx_term(e->ctx);
    return st;
}

#define MAXREC 4096
typedef struct record {
    uint64_t seq[MAXREC];
    bool replayed[MAXREC];
    size_t n;
    size_t bad_payloads;
    kvr_zmq_reset_reason_t resets[16];
    size_t n_resets;
} record_t;

static int on_batch(void *ud, const kvr_zmq_batch_t *b)
{
    record_t *r = ud;
    if (!payload_is(b->seq, b->payload, b->len))
        r->bad_payloads++;
    if (r->n < MAXREC) {
        r->seq[r->n] = b->seq;
        r->replayed[r->n++] = b->replayed;
    }
    return KVR_OK;
}

static void on_reset(void *ud, uint64_t worker_id, uint32_t dp_rank, kvr_zmq_reset_reason_t why)
{
    (void)worker_id;
    (void)dp_rank;
    record_t *r = ud;
    if (r->n_resets < 16)
        r->resets[r->n_resets++] = why;
}

typedef struct router_side {
    record_t *rec;
    kvr_zmq_listener_t *l;
} router_side_t;

static router_side_t router_open(const engine_t *e)
{
    router_side_t rs = {.rec = calloc(1, sizeof *rs.rec)};
    kvr_zmq_handlers_t h = {.on_batch = on_batch, .on_reset = on_reset, .ud = rs.rec};
    kvr_zmq_config_t cfg = {.replay_timeout_ms = 1000};
    int st;
    rs.l = kvr_zmq_listener_new(&cfg, &h, &st);
    assert_non_null(rs.l);
    kvr_zmq_endpoint_t ep = {.worker_id = 7, .dp_rank = 0, .events = e->events,
                             .replay = e->replay};
    char err[200];
    assert_int_equal(kvr_zmq_listener_add(rs.l, &ep, err, sizeof err), KVR_OK);
    return rs;
}

static void router_close(router_side_t *rs)
{
    kvr_zmq_listener_free(rs->l);
    free(rs->rec);
}

static void pump(router_side_t *rs, size_t n)
{
    uint64_t end = now_ms() + 3000;
    while (rs->rec->n < n && now_ms() < end)
        (void)kvr_zmq_listener_poll(rs->l, 20);
    for (int i = 0; i < 3; i++)
        (void)kvr_zmq_listener_poll(rs->l, 10); /* anything unexpected shows up */
    if (rs->rec->n != n)
        fail_msg("the listener applied %zu batches, expected %zu", rs->rec->n, n);
}

static bool any_live(const record_t *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (!r->replayed[i])
            return true;
    return false;
}

/* Publishes one batch at a time until the listener receives one live, so its subscription is
 * known to be in place (replay is asynchronous: the replayed history before it may be handed
 * over a few polls ahead of it). Returns the number of that batch. */
static uint64_t join(router_side_t *rs, engine_t *e)
{
    uint64_t end = now_ms() + 5000;
    while (!any_live(rs->rec) && now_ms() < end) {
        engine_publish(e);
        uint64_t slice = now_ms() + 100;
        while (!any_live(rs->rec) && now_ms() < slice)
            (void)kvr_zmq_listener_poll(rs->l, 10);
    }
    assert_true(rs->rec->n > 0);
    for (size_t i = 0; i < rs->rec->n; i++)
        if (!rs->rec->replayed[i])
            return rs->rec->seq[i];
    fail_msg("no live batch among the first %zu", rs->rec->n);
    return 0;
}

static kvr_zmq_rank_info_t rank_info(const router_side_t *rs)
{
    kvr_zmq_rank_info_t ri;
    assert_int_equal(kvr_zmq_listener_rank(rs->l, 7, 0, &ri), KVR_OK);
    return ri;
}

static void expect_in_order(const record_t *r, uint64_t first, uint64_t upto)
{
    assert_int_equal(r->bad_payloads, 0);
    for (uint64_t s = first; s < upto; s++) {
        size_t i = (size_t)(s - first);
        if (r->seq[i] != s)
            fail_msg("applied batch %zu is %llu, expected %llu", i,
                     (unsigned long long)r->seq[i], (unsigned long long)s);
    }
}

static void test_listener_recovers_history_and_gaps(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, 1000);
    /* the engine ran before the router subscribed: these only reach it by replay */
    for (int i = 0; i < 5; i++)
        engine_publish(&e);
    router_side_t rs = router_open(&e);
    uint64_t live = join(&rs, &e);
    assert_true(live >= 5);
    pump(&rs, live + 1);
    expect_in_order(rs.rec, 0, live + 1);
    for (uint64_t s = 0; s < live; s++)
        assert_true(rs.rec->replayed[s]);
    assert_false(rs.rec->replayed[live]);
    kvr_zmq_rank_info_t ri = rank_info(&rs);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.gaps, 1);

    /* in-order traffic, then three batches lost in the network: the next one reveals them */
    for (int i = 0; i < 5; i++)
        engine_publish(&e);
    engine_drop_next(&e, 3);
    for (int i = 0; i < 4; i++)
        engine_publish(&e);
    uint64_t last = engine_publish(&e);
    pump(&rs, last + 1);
    expect_in_order(rs.rec, 0, last + 1);
    for (uint64_t s = live + 1; s <= last; s++) {
        bool want = s >= live + 6 && s < live + 9; /* the three dropped */
        if (rs.rec->replayed[s] != want)
            fail_msg("batch %llu replayed %d, expected %d", (unsigned long long)s,
                     rs.rec->replayed[s], want);
    }
    ri = rank_info(&rs);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.gaps, 2);
    assert_int_equal(ri.gaps_lost, 0);
    assert_int_equal(ri.last_seq, last);
    assert_int_equal(rs.rec->n_resets, 0);
    kvr_zmq_stats_t ls;
    kvr_zmq_listener_stats(rs.l, &ls);
    assert_int_equal(ls.replay_timeouts, 0);
    assert_int_equal(ls.bad_frames, 0);

    router_close(&rs);
    kvr_kv_pub_stats_t st = engine_stop(&e);
    assert_int_equal(st.replay_requests, 2);
    assert_int_equal(st.replay_truncated, 0);
    assert_int_equal(st.dropped, 3);
    assert_int_equal(st.invalid_requests, 0);
    assert_int_equal(st.replay_send_errors, 0);
    assert_int_equal(st.published, last + 1 - 3);
}

static void test_listener_gap_older_than_ring(void **state)
{
    (void)state;
    engine_t e;
    engine_start(&e, 8);
    router_side_t rs = router_open(&e);
    uint64_t live = join(&rs, &e);
    pump(&rs, live + 1);
    assert_int_equal(rank_info(&rs).state, KVR_ZMQ_EXACT);
    /* ten batches lost, the ring keeps eight: the two oldest missing ones are gone for good */
    engine_drop_next(&e, 10);
    for (int i = 0; i < 10; i++)
        engine_publish(&e);
    uint64_t last = engine_publish(&e); /* live + 11; the ring holds live + 4 .. live + 11 */
    pump(&rs, live + 1 + 8);
    const record_t *r = rs.rec;
    assert_int_equal(r->bad_payloads, 0);
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(r->seq[live + 1 + i], last - 7 + i);
        assert_int_equal(r->replayed[live + 1 + i], i < 7);
    }
    assert_int_equal(r->n_resets, 1);
    assert_int_equal(r->resets[0], KVR_RESET_GAP_LOST);
    kvr_zmq_rank_info_t ri = rank_info(&rs);
    assert_int_equal(ri.state, KVR_ZMQ_DEGRADED);
    assert_int_equal(ri.gaps_lost, 1);
    router_close(&rs);
    kvr_kv_pub_stats_t st = engine_stop(&e);
    assert_true(st.replay_truncated >= 1);
}

int main(void)
{
    kvr_log_set_level(KVR_LOG_ERROR); /* the invalid-request warnings are expected here */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_should_bind),
        cmocka_unit_test(test_endpoint_for_rank),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_publish_argument_errors),
        cmocka_unit_test(test_sub_receives_exact_frames),
        cmocka_unit_test(test_connect_mode),
        cmocka_unit_test(test_ipv6_loopback),
        cmocka_unit_test(test_replay_whole_middle_and_past_newest),
        cmocka_unit_test(test_replay_older_than_ring),
        cmocka_unit_test(test_buffer_bytes_cap_evicts_oldest),
        cmocka_unit_test(test_ring_grows_then_wraps),
        cmocka_unit_test(test_malformed_requests_counted_and_ignored),
        cmocka_unit_test(test_req_client_gets_first_batch),
        cmocka_unit_test(test_stuck_peer_waits_others_served),
        cmocka_unit_test(test_waiting_answer_jumps_past_evicted),
        cmocka_unit_test(test_listener_recovers_history_and_gaps),
        cmocka_unit_test(test_listener_gap_older_than_ring),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
