/*
 * test_zmq_listener.c: the KV-event transport against a real ZeroMQ publisher on loopback
 * (tests/tools/zmq_publisher.py, Debian's python3-zmq, written independently of the C code):
 * in-order delivery, gaps filled from the replay socket before the batch that revealed them,
 * duplicates dropped, publisher restarts, gaps older than the replay buffer, undecodable
 * batches, malformed messages, and a replay socket that never answers. Each scenario checks
 * the sequence of batches the router would apply, the resets it would perform, the rank's
 * state and the counters.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvrouter.h"
#include "net/zmq_listener.h"

/* ---- the publisher process ---- */

typedef struct publisher {
    pid_t pid;
    FILE *in, *out; /* its stdin, its stdout */
    char pub[128], replay[128];
} publisher_t;

static void pub_start(publisher_t *p)
{
    const char *data = getenv("KVR_TEST_DATA");
    char script[512];
    snprintf(script, sizeof script, "%s/../tools/zmq_publisher.py", data ? data : "tests/data");
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execl("/usr/bin/python3", "python3", script, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    p->in = fdopen(to[1], "w");
    p->out = fdopen(from[0], "r");
    assert_non_null(p->in);
    assert_non_null(p->out);
    char line[256];
    assert_non_null(fgets(line, sizeof line, p->out));
    assert_int_equal(sscanf(line, "pub %127s", p->pub), 1);
    assert_non_null(fgets(line, sizeof line, p->out));
    assert_int_equal(sscanf(line, "replay %127s", p->replay), 1);
}

static void pub_cmd(publisher_t *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->in, fmt, ap);
    va_end(ap);
    fputc('\n', p->in);
    fflush(p->in);
    char line[64];
    assert_non_null(fgets(line, sizeof line, p->out));
    assert_string_equal(line, "ok\n");
}

static void pub_stop(publisher_t *p)
{
    fprintf(p->in, "quit\n");
    fclose(p->in);
    fclose(p->out);
    int status;
    waitpid(p->pid, &status, 0);
}

/* ---- what the router would apply ---- */

#define MAXREC 64
typedef struct record {
    uint64_t seq[MAXREC];
    bool replayed[MAXREC];
    size_t n;
    kvr_zmq_reset_reason_t resets[MAXREC];
    size_t n_resets;
} record_t;

static int on_batch(void *ud, const kvr_zmq_batch_t *b)
{
    record_t *r = ud;
    if (b->len == 3 && memcmp(b->payload, "BAD", 3) == 0)
        return KVR_EPARSE;
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
    if (r->n_resets < MAXREC)
        r->resets[r->n_resets++] = why;
}

typedef struct fixture {
    publisher_t pub;
    record_t rec;
    kvr_zmq_listener_t *l;
} fixture_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Polls until n batches have been recorded (or 3 s pass). */
static void pump(fixture_t *f, size_t n)
{
    uint64_t end = now_ms() + 3000;
    while (f->rec.n < n && now_ms() < end)
        (void)kvr_zmq_listener_poll(f->l, 20);
    for (int i = 0; i < 5; i++)
        (void)kvr_zmq_listener_poll(f->l, 10); /* let anything unexpected show up */
}

static int setup(void **state)
{
    fixture_t *f = calloc(1, sizeof *f);
    pub_start(&f->pub);
    kvr_zmq_handlers_t h = {.on_batch = on_batch, .on_reset = on_reset, .ud = &f->rec};
    kvr_zmq_config_t cfg = {.replay_timeout_ms = 300};
    int st;
    f->l = kvr_zmq_listener_new(&cfg, &h, &st);
    assert_non_null(f->l);
    kvr_zmq_endpoint_t ep = {.worker_id = 7, .dp_rank = 0, .events = f->pub.pub,
                             .replay = f->pub.replay};
    char err[200];
    assert_int_equal(kvr_zmq_listener_add(f->l, &ep, err, sizeof err), KVR_OK);
    /* a SUB socket misses what is published before its subscription arrives */
    for (int i = 0; i < 20; i++)
        (void)kvr_zmq_listener_poll(f->l, 10);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvr_zmq_listener_free(f->l);
    pub_stop(&f->pub);
    free(f);
    return 0;
}

static kvr_zmq_rank_info_t info(fixture_t *f)
{
    kvr_zmq_rank_info_t ri;
    assert_int_equal(kvr_zmq_listener_rank(f->l, 7, 0, &ri), KVR_OK);
    return ri;
}

static void expect_seqs(fixture_t *f, const uint64_t *want, const bool *replayed, size_t n)
{
    if (f->rec.n != n)
        fail_msg("applied %zu batches, expected %zu", f->rec.n, n);
    for (size_t i = 0; i < n; i++) {
        if (f->rec.seq[i] != want[i] || f->rec.replayed[i] != replayed[i])
            fail_msg("batch %zu: seq %llu replayed %d, expected %llu replayed %d", i,
                     (unsigned long long)f->rec.seq[i], f->rec.replayed[i],
                     (unsigned long long)want[i], replayed[i]);
    }
}

static void test_in_order_then_gap_then_duplicate(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pump(f, 2);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
    /* batches 2 and 3 never reach the subscriber; 4 reveals the gap */
    pub_cmd(&f->pub, "keep 2 ac");
    pub_cmd(&f->pub, "keep 3 ad");
    pub_cmd(&f->pub, "send 4 ae");
    pump(f, 5);
    uint64_t want[] = {0, 1, 2, 3, 4};
    bool rep[] = {false, false, true, true, false};
    expect_seqs(f, want, rep, 5);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.gaps, 1);
    assert_int_equal(ri.gaps_lost, 0);
    assert_int_equal(ri.last_seq, 4);
    assert_int_equal(f->rec.n_resets, 0);
    /* the same batch again is dropped and counted */
    pub_cmd(&f->pub, "send 4 ae");
    pump(f, 6);
    assert_int_equal(f->rec.n, 5);
    assert_int_equal(info(f).duplicates, 1);
}

static void test_restart_drops_state(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    pub_cmd(&f->pub, "clear"); /* the engine restarts and numbers from 0 again */
    pub_cmd(&f->pub, "send 0 ba");
    pump(f, 4);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESTART);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.restarts, 1);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT); /* batch 0 of the new process: complete again */
    assert_int_equal(f->rec.seq[3], 0);
}

static void test_gap_older_than_replay_buffer(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pump(f, 1);
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "keep 2 ac");
    pub_cmd(&f->pub, "trim 1"); /* the buffer keeps only batch 2 */
    pub_cmd(&f->pub, "send 3 ad");
    pump(f, 3);
    /* batch 1 is lost for good: state dropped, the rest applied, the rank degraded */
    uint64_t want[] = {0, 2, 3};
    bool rep[] = {false, true, false};
    expect_seqs(f, want, rep, 3);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_GAP_LOST);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_DEGRADED);
    assert_int_equal(ri.gaps_lost, 1);
}

static void test_undecodable_batch(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 424144"); /* "BAD": the handler cannot frame it */
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 2);
    /* replayed once, still bad: state dropped, batch 2 still applied */
    uint64_t want[] = {0, 2};
    bool rep[] = {false, false};
    expect_seqs(f, want, rep, 2);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_UNDECODABLE);
    kvr_zmq_rank_info_t ri = info(f);
    assert_true(ri.undecodable >= 1);
    assert_int_equal(ri.state, KVR_ZMQ_DEGRADED);
    kvr_zmq_stats_t st;
    kvr_zmq_listener_stats(f->l, &st);
    assert_true(st.undecodable >= 1);
}

static void test_malformed_messages_counted(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "frames 2");
    pub_cmd(&f->pub, "frames 4");
    pub_cmd(&f->pub, "shortseq");
    pub_cmd(&f->pub, "send 0 aa");
    pump(f, 1);
    kvr_zmq_stats_t st;
    kvr_zmq_listener_stats(f->l, &st);
    assert_int_equal(st.bad_frames, 3);
    assert_int_equal(f->rec.n, 1);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
}

static void test_late_subscriber_replays_history(void **state)
{
    fixture_t *f = *state;
    /* the engine ran before the router subscribed: its first live batch is 3 */
    pub_cmd(&f->pub, "keep 0 aa");
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "keep 2 ac");
    pub_cmd(&f->pub, "send 3 ad");
    pump(f, 4);
    uint64_t want[] = {0, 1, 2, 3};
    bool rep[] = {true, true, true, false};
    expect_seqs(f, want, rep, 4);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
    assert_int_equal(f->rec.n_resets, 0);
}

static void test_silent_replay_socket(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pump(f, 1);
    pub_cmd(&f->pub, "mute");
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 2);
    /* after the timeout the gap is given up: state dropped, batch 2 applied, no hang */
    uint64_t want[] = {0, 2};
    bool rep[] = {false, false};
    expect_seqs(f, want, rep, 2);
    kvr_zmq_stats_t st;
    kvr_zmq_listener_stats(f->l, &st);
    assert_int_equal(st.replay_timeouts, 1);
    assert_int_equal(info(f).state, KVR_ZMQ_DEGRADED);
}

static void test_add_remove_validation(void **state)
{
    fixture_t *f = *state;
    char err[200];
    kvr_zmq_endpoint_t dup = {.worker_id = 7, .dp_rank = 0, .events = f->pub.pub};
    assert_int_equal(kvr_zmq_listener_add(f->l, &dup, err, sizeof err), KVR_EEXIST);
    kvr_zmq_endpoint_t bad = {.worker_id = 8, .dp_rank = 0, .events = "nonsense://x"};
    assert_int_equal(kvr_zmq_listener_add(f->l, &bad, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "nonsense://x"));
    assert_int_equal(kvr_zmq_listener_remove(f->l, 7, 0), KVR_OK);
    assert_int_equal(kvr_zmq_listener_remove(f->l, 7, 0), KVR_ENOTFOUND);
    kvr_zmq_rank_info_t ri;
    assert_int_equal(kvr_zmq_listener_rank(f->l, 7, 0, &ri), KVR_ENOTFOUND);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_in_order_then_gap_then_duplicate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_drops_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gap_older_than_replay_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_undecodable_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_malformed_messages_counted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_late_subscriber_replays_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_replay_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_remove_validation, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
