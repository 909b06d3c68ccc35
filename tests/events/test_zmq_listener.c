/*
 * test_zmq_listener.c: the KV-event transport against a real ZeroMQ publisher on loopback
 * (tests/tools/zmq_publisher.py, Debian's python3-zmq, written independently of the C code):
 * in-order delivery, gaps filled from the replay socket before the batch that revealed them,
 * duplicates dropped, publisher restarts, gaps older than the replay buffer, undecodable
 * batches, malformed messages, a replay socket that never answers, and a resync asked by the
 * caller (rebuilt from batch 0, or degraded when the buffer was trimmed). Each scenario checks
 * the sequence of batches the router would apply, the resets it would perform, the rank's
 * state and the counters.
 *
 * The second half runs several ranks in this process (raw PUB sockets, a ROUTER that never
 * answers, and the engine-side publisher of events/kv_publisher.h answering replays from the
 * test's own loop, which only works because replay no longer blocks poll): a rank whose
 * replay socket is silent does not delay the others; live batches that arrive during a
 * replay are applied after it, in order, exactly once; a full hold gives the gap up; remove()
 * and free() during a recovery release what was held.
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
#include <zmq.h>

#include "kvrouter.h"
#include "events/kv_publisher.h"
#include "events/zmq_listener.h"

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
    /* a SUB socket misses what is published before its subscription arrives: the publisher
     * (an XPUB) says when it has arrived */
    pub_cmd(&f->pub, "waitsub");
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

/* A resync (the index found drifting): the rank's state is dropped and rebuilt from the
 * replay buffer, from batch 0: exact again, then live batches go on. */
static void test_resync_rebuilds_from_batch_0(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    assert_int_equal(kvr_zmq_listener_resync(f->l, 7, 0), KVR_OK);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESYNC);
    assert_int_equal(kvr_zmq_listener_resync(f->l, 7, 0), KVR_EBUSY); /* one at a time */
    pump(f, 6);
    pub_cmd(&f->pub, "send 3 ad");
    pump(f, 7);
    uint64_t want[] = {0, 1, 2, 0, 1, 2, 3};
    bool rep[] = {false, false, false, true, true, true, false};
    expect_seqs(f, want, rep, 7);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.resyncs, 1);
    assert_false(ri.recovering);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(kvr_zmq_listener_verify(f->l, NULL, 0), KVR_OK);
}

/* A resync whose buffer no longer starts at batch 0: what it keeps is applied, the rank is
 * degraded (partial), and the next live batch follows. */
static void test_resync_buffer_trimmed(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    pub_cmd(&f->pub, "trim 1"); /* the buffer keeps only batch 2 */
    assert_int_equal(kvr_zmq_listener_resync(f->l, 7, 0), KVR_OK);
    pump(f, 4);
    pub_cmd(&f->pub, "send 3 ad");
    pump(f, 5);
    uint64_t want[] = {0, 1, 2, 2, 3};
    bool rep[] = {false, false, false, true, false};
    expect_seqs(f, want, rep, 5);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESYNC);
    assert_int_equal(info(f).state, KVR_ZMQ_DEGRADED);
    assert_int_equal(kvr_zmq_listener_verify(f->l, NULL, 0), KVR_OK);
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
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_REPLAY_TIMEOUT); /* not "gap lost" */
    assert_string_equal(kvr_zmq_reset_reason_name(KVR_RESET_REPLAY_TIMEOUT),
                        "no answer from the replay socket");
}

/* A new process on the same address whose numbers ran past the old one's before the
 * subscriber saw any of them: no number goes back, so only the bytes tell. The gap's replay
 * starts at the last applied batch, which comes back with other bytes: a restart, and the
 * rank is rebuilt from the new process's batch 0 (S2). */
static void test_restart_numbers_ahead(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    pub_cmd(&f->pub, "clear"); /* the new process ... */
    pub_cmd(&f->pub, "keep 0 ba");
    pub_cmd(&f->pub, "keep 1 bb");
    pub_cmd(&f->pub, "keep 2 bc");
    pub_cmd(&f->pub, "keep 3 bd");
    pub_cmd(&f->pub, "keep 4 be"); /* ... published 0..4 before the subscriber was back */
    pub_cmd(&f->pub, "send 5 bf");
    pump(f, 9);
    uint64_t want[] = {0, 1, 2, 0, 1, 2, 3, 4, 5};
    bool rep[] = {false, false, false, true, true, true, true, true, false};
    expect_seqs(f, want, rep, 9);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESTART);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.restarts, 1);
    assert_int_equal(ri.gaps, 1);
    assert_int_equal(ri.gaps_lost, 0);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.last_seq, 5);
    assert_false(ri.recovering);
}

/* The same process after a gap: the last batch comes back unchanged and is not applied twice
 * (test_in_order_then_gap_then_duplicate checks the order); a replay buffer that no longer
 * holds it cannot confirm, and the gap is judged as before. */
static void test_gap_confirm_batch_trimmed(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pump(f, 1);
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "trim 1"); /* only batch 1 is left: 0 cannot be confirmed */
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    uint64_t want[] = {0, 1, 2};
    bool rep[] = {false, true, false};
    expect_seqs(f, want, rep, 3);
    assert_int_equal(f->rec.n_resets, 0);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
    assert_int_equal(info(f).restarts, 0);
}

/* Polls until cond(f) holds (or 3 s pass). */
static void pump_until(fixture_t *f, bool (*cond)(fixture_t *))
{
    uint64_t end = now_ms() + 3000;
    while (!cond(f) && now_ms() < end)
        (void)kvr_zmq_listener_poll(f->l, 20);
}

static bool connected(fixture_t *f) { return info(f).connected; }
static bool lost_once(fixture_t *f) { return info(f).disconnects == 1; }

/* The SUB's monitor: connected once subscribed, a lost connection counted (the rank shows it
 * until the publisher is back), batches flow again after the reconnect. */
static void test_connection_state(void **state)
{
    fixture_t *f = *state;
    pump_until(f, connected);
    kvr_zmq_rank_info_t ri = info(f);
    assert_true(ri.connected);
    assert_true(ri.was_connected);
    assert_int_equal(ri.disconnects, 0);
    pub_cmd(&f->pub, "disconnect");
    pump_until(f, lost_once);
    assert_int_equal(info(f).disconnects, 1);
    pump_until(f, connected); /* the subscriber reconnected by itself */
    assert_true(info(f).connected);
    /* its subscription may still be on its way: a batch lost to that is replayed when the
     * next one reveals the gap, so both arrive either way */
    uint64_t sent = 0, end = now_ms() + 3000;
    for (; f->rec.n == 0 && sent < MAXREC && now_ms() < end; sent++) {
        pub_cmd(&f->pub, "send %llu aa", (unsigned long long)sent);
        for (int i = 0; i < 5 && f->rec.n == 0; i++)
            (void)kvr_zmq_listener_poll(f->l, 20);
    }
    pump(f, sent);
    assert_int_equal(f->rec.n, sent); /* every batch, the early ones replayed */
    for (size_t i = 0; i < f->rec.n; i++)
        assert_int_equal(f->rec.seq[i], i);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
    kvr_zmq_stats_t st;
    kvr_zmq_listener_stats(f->l, &st);
    assert_int_equal(st.disconnects, 1);
}

/* ---- resuming a saved cursor (warm restart) ---- */

static uint64_t hash_hex(const char *hex)
{
    uint8_t b[64];
    size_t n = strlen(hex) / 2;
    for (size_t i = 0; i < n; i++)
        sscanf(hex + 2 * i, "%2hhx", &b[i]);
    return kvr_xxh3(b, n, 0);
}


static bool not_recovering(fixture_t *f) { return !info(f).recovering; }
static bool holds_two(fixture_t *f) { return info(f).held_batches == 2; }

static void test_resume_confirmed_with_live_batches_first(void **state)
{
    fixture_t *f = *state;
    /* the router applied 0 and 1, saved, and restarted; the engine went on with 2 */
    pub_cmd(&f->pub, "keep 0 aa");
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "keep 2 ac");
    pub_cmd(&f->pub, "hold");
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 1, hash_hex("ab")), KVR_OK);
    kvr_zmq_rank_info_t ri = info(f);
    assert_true(ri.recovering && ri.resuming && ri.state == KVR_ZMQ_EXACT);
    /* live batches arrive before the replay answer: held, never taken for a restart */
    pub_cmd(&f->pub, "send 3 ad");
    pub_cmd(&f->pub, "send 4 ae");
    pump_until(f, holds_two);
    assert_int_equal(f->rec.n, 0);
    pub_cmd(&f->pub, "release");
    pump_until(f, not_recovering);
    pump(f, 3);
    uint64_t want[] = {2, 3, 4};
    bool rep[] = {true, false, false};
    expect_seqs(f, want, rep, 3);
    ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.resumes, 1);
    assert_int_equal(ri.resumes_failed + ri.restarts + ri.duplicates + ri.gaps_lost, 0);
    assert_false(ri.resuming);
    assert_int_equal(ri.last_seq, 4);
    assert_int_equal(f->rec.n_resets, 0);
}

static bool duplicates_two(fixture_t *f) { return info(f).duplicates == 2; }

/* A resume asks for everything after the cursor; its answer may bring batches the SUB has not
 * delivered yet (two connections, no order between them). Their live copies, arriving after
 * the replay applied newer ones, are duplicates, not a new process numbering from the past. */
static void test_resume_replay_ahead_of_live(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "keep 0 aa");
    pub_cmd(&f->pub, "keep 1 ab");
    pub_cmd(&f->pub, "keep 2 ac");
    pub_cmd(&f->pub, "keep 3 ad");
    pub_cmd(&f->pub, "keep 4 ae"); /* published, its live copy still on its way */
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 1, hash_hex("ab")), KVR_OK);
    pump_until(f, not_recovering);
    pump(f, 3);
    pub_cmd(&f->pub, "late 3 ad");
    pub_cmd(&f->pub, "late 4 ae");
    pump_until(f, duplicates_two);
    pub_cmd(&f->pub, "send 5 af");
    pump(f, 4);
    uint64_t want[] = {2, 3, 4, 5};
    bool rep[] = {true, true, true, false};
    expect_seqs(f, want, rep, 4);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.resumes, 1);
    assert_int_equal(ri.duplicates, 2);
    assert_int_equal(ri.restarts + ri.gaps_lost + ri.resumes_failed, 0);
    assert_int_equal(f->rec.n_resets, 0);
    /* an older number with other bytes is still a new process */
    pub_cmd(&f->pub, "late 4 ee");
    pump_until(f, not_recovering);
    pump(f, 5);
    assert_int_equal(info(f).restarts, 1);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESTART);
}

static void test_resume_refused_by_another_process(void **state)
{
    fixture_t *f = *state;
    /* the engine restarted: its batch 1 has other bytes than the one the router saved */
    pub_cmd(&f->pub, "keep 0 ba");
    pub_cmd(&f->pub, "keep 1 bb");
    pub_cmd(&f->pub, "keep 2 bc");
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 1, hash_hex("ab")), KVR_OK);
    pump_until(f, not_recovering);
    pump(f, 2);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESUME_FAILED);
    /* the rest of the answer is taken as a late joiner would: partial, so degraded */
    uint64_t want[] = {1, 2};
    bool rep[] = {true, true};
    expect_seqs(f, want, rep, 2);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.state, KVR_ZMQ_DEGRADED);
    assert_int_equal(ri.resumes_failed, 1);
    assert_int_equal(ri.resumes, 0);
}

static void test_resume_cursor_no_longer_buffered(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "keep 5 af");
    pub_cmd(&f->pub, "keep 6 b0");
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 1, hash_hex("ab")), KVR_OK);
    pump_until(f, not_recovering);
    pump(f, 2);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESUME_FAILED);
    uint64_t want[] = {5, 6};
    bool rep[] = {true, true};
    expect_seqs(f, want, rep, 2);
    assert_int_equal(info(f).state, KVR_ZMQ_DEGRADED);
}

static void test_resume_without_answer_or_batch(void **state)
{
    fixture_t *f = *state;
    /* an answer with no batch at all (the engine restarted and sent fewer batches) */
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 9, hash_hex("ab")), KVR_OK);
    pump_until(f, not_recovering);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESUME_FAILED);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.resumes_failed, 1);
    assert_false(ri.resuming);
    /* the next batch 0 of the new process is applied from a clean cursor: exact again */
    pub_cmd(&f->pub, "send 0 ba");
    pump(f, 1);
    assert_int_equal(f->rec.n, 1);
    assert_int_equal(info(f).state, KVR_ZMQ_EXACT);
    /* a silent replay socket fails a resume too, after replay_timeout_ms */
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 0, 0), KVR_EBUSY);
}

static void test_resume_silent_replay_socket(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "mute");
    assert_int_equal(kvr_zmq_listener_resume(f->l, 7, 0, 3, hash_hex("ad")), KVR_OK);
    pump_until(f, not_recovering);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESUME_FAILED);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.replay_timeouts, 1);
    assert_int_equal(ri.resumes_failed, 1);
    assert_false(ri.recovering);
    assert_int_not_equal(ri.state, KVR_ZMQ_EXACT);
}

/* S2 over a lost connection: the old process applied 0..2 and died; the new one published
 * 0..2 (other bytes) before the subscriber was back, so the next batch it sees may be exactly
 * the next number. The reconnect makes the listener check the last batch's bytes before
 * trusting it: a restart, rebuilt from the new process's batch 0. */
static void test_restart_after_reconnect(void **state)
{
    fixture_t *f = *state;
    pub_cmd(&f->pub, "send 0 aa");
    pub_cmd(&f->pub, "send 1 ab");
    pub_cmd(&f->pub, "send 2 ac");
    pump(f, 3);
    pub_cmd(&f->pub, "disconnect");
    pump_until(f, lost_once);
    pub_cmd(&f->pub, "clear");
    pub_cmd(&f->pub, "keep 0 ba");
    pub_cmd(&f->pub, "keep 1 bb");
    pub_cmd(&f->pub, "keep 2 bc");
    pump_until(f, connected);
    uint64_t seq = 3, end = now_ms() + 3000;
    for (; f->rec.n == 3 && seq < 40 && now_ms() < end; seq++) {
        pub_cmd(&f->pub, "send %llu b%x", (unsigned long long)seq, (unsigned)(seq & 15));
        for (int i = 0; i < 5 && f->rec.n == 3; i++)
            (void)kvr_zmq_listener_poll(f->l, 20);
    }
    pump(f, 3 + seq);
    /* 0..2 of the old process, then 0..seq-1 of the new one */
    assert_int_equal(f->rec.n, 3 + seq);
    for (uint64_t i = 0; i < seq; i++)
        assert_int_equal(f->rec.seq[3 + i], i);
    assert_int_equal(f->rec.n_resets, 1);
    assert_int_equal(f->rec.resets[0], KVR_RESET_RESTART);
    kvr_zmq_rank_info_t ri = info(f);
    assert_int_equal(ri.restarts, 1);
    assert_int_equal(ri.gaps_lost, 0);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
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
    kvr_zmq_endpoint_t no_replay = {.worker_id = 9, .dp_rank = 0, .events = f->pub.pub};
    assert_int_equal(kvr_zmq_listener_add(f->l, &no_replay, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_zmq_listener_resync(f->l, 9, 0), KVR_EINVAL); /* nothing to rebuild from */
    assert_int_equal(f->rec.n_resets, 0);                             /* ... and left as it is */
    assert_int_equal(kvr_zmq_listener_resync(f->l, 10, 0), KVR_ENOTFOUND);
    assert_int_equal(kvr_zmq_listener_remove(f->l, 7, 0), KVR_OK);
    assert_int_equal(kvr_zmq_listener_remove(f->l, 7, 0), KVR_ENOTFOUND);
    kvr_zmq_rank_info_t ri;
    assert_int_equal(kvr_zmq_listener_rank(f->l, 7, 0, &ri), KVR_ENOTFOUND);
}

/* ---- several ranks in this process ---- */

#define MREC 1024
typedef struct mrec {
    uint64_t worker[MREC], seq[MREC];
    bool replayed[MREC];
    size_t n;
    size_t bad_payloads; /* bytes that are not those of (worker, seq) */
    uint64_t reset_worker[64];
    kvr_zmq_reset_reason_t resets[64];
    size_t n_resets;
} mrec_t;

/* Batch seq of worker w: "w<w>-b<seq>", then `pad` bytes 'x'. */
static size_t make_batch(uint64_t w, uint64_t seq, size_t pad, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "w%llu-b%llu", (unsigned long long)w, (unsigned long long)seq);
    assert_true(n > 0 && (size_t)n + pad <= cap);
    memset(buf + n, 'x', pad);
    return (size_t)n + pad;
}

static bool batch_is(uint64_t w, uint64_t seq, const uint8_t *p, size_t len)
{
    char want[64];
    size_t n = make_batch(w, seq, 0, want, sizeof want);
    if (len < n || memcmp(p, want, n) != 0)
        return false;
    for (size_t i = n; i < len; i++)
        if (p[i] != 'x')
            return false;
    return true;
}

static int m_on_batch(void *ud, const kvr_zmq_batch_t *b)
{
    mrec_t *r = ud;
    if (!batch_is(b->worker_id, b->seq, b->payload, b->len))
        r->bad_payloads++;
    if (r->n < MREC) {
        r->worker[r->n] = b->worker_id;
        r->seq[r->n] = b->seq;
        r->replayed[r->n++] = b->replayed;
    }
    return KVR_OK;
}

static void m_on_reset(void *ud, uint64_t worker_id, uint32_t dp_rank, kvr_zmq_reset_reason_t why)
{
    (void)dp_rank;
    mrec_t *r = ud;
    if (r->n_resets < 64) {
        r->reset_worker[r->n_resets] = worker_id;
        r->resets[r->n_resets++] = why;
    }
}

typedef struct multi {
    void *ctx;
    mrec_t rec;
    kvr_zmq_listener_t *l;
    kvr_kv_pub_t *pub; /* the engine-side publisher, when a test uses one */
} multi_t;

static void m_open(multi_t *m, kvr_zmq_config_t cfg)
{
    memset(m, 0, sizeof *m);
    m->ctx = zmq_ctx_new();
    assert_non_null(m->ctx);
    kvr_zmq_handlers_t h = {.on_batch = m_on_batch, .on_reset = m_on_reset, .ud = &m->rec};
    int st;
    m->l = kvr_zmq_listener_new(&cfg, &h, &st);
    assert_non_null(m->l);
}

static void m_verify(const multi_t *m)
{
    char msg[200];
    if (kvr_zmq_listener_verify(m->l, msg, sizeof msg) != KVR_OK)
        fail_msg("listener invariant: %s", msg);
}

static void m_close(multi_t *m)
{
    m_verify(m);
    kvr_zmq_listener_free(m->l);
    kvr_kv_pub_free(m->pub);
    zmq_ctx_term(m->ctx);
}

/* One turn of the router's loop; with `answer`, also one turn of the engine's. */
static void m_step(multi_t *m, bool answer)
{
    (void)kvr_zmq_listener_poll(m->l, 5);
    if (answer && m->pub != NULL)
        (void)kvr_kv_pub_poll_replay(m->pub);
    m_verify(m);
}

#define WAIT_UNTIL(m, answer, cond)                                                             \
    do {                                                                                       \
        uint64_t end_ = now_ms() + 3000;                                                       \
        while (!(cond) && now_ms() < end_)                                                     \
            m_step((m), (answer));                                                             \
        if (!(cond))                                                                           \
            fail_msg("line %d: timed out waiting for %s", __LINE__, #cond);                    \
    } while (0)

static kvr_zmq_stats_t m_stats(const multi_t *m)
{
    kvr_zmq_stats_t st;
    kvr_zmq_listener_stats(m->l, &st);
    return st;
}

static kvr_zmq_rank_info_t m_info(const multi_t *m, uint64_t w)
{
    kvr_zmq_rank_info_t ri;
    assert_int_equal(kvr_zmq_listener_rank(m->l, w, 0, &ri), KVR_OK);
    return ri;
}

/* The batches of worker w, in the order they were handed over. */
static size_t m_seqs(const multi_t *m, uint64_t w, uint64_t *seq, bool *replayed, size_t cap)
{
    size_t k = 0;
    for (size_t i = 0; i < m->rec.n; i++) {
        if (m->rec.worker[i] != w)
            continue;
        if (k < cap) {
            seq[k] = m->rec.seq[i];
            if (replayed != NULL)
                replayed[k] = m->rec.replayed[i];
        }
        k++;
    }
    return k;
}

static size_t m_count(const multi_t *m, uint64_t w) { return m_seqs(m, w, NULL, NULL, 0); }

static void *bound_socket(void *ctx, int type, char *addr, size_t cap)
{
    void *s = zmq_socket(ctx, type);
    assert_non_null(s);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    assert_int_equal(zmq_bind(s, "tcp://127.0.0.1:*"), 0);
    assert_int_equal(zmq_getsockopt(s, ZMQ_LAST_ENDPOINT, addr, &cap), 0);
    return s;
}

static void raw_send(void *pub, uint64_t seq, int seq_len, const void *p, size_t n)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(seq >> (56 - 8 * i));
    assert_int_equal(zmq_send(pub, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(pub, b, (size_t)seq_len, ZMQ_SNDMORE), seq_len);
    assert_int_equal(zmq_send(pub, p, n, 0), (int)n);
}

static void raw_batch(void *pub, uint64_t w, uint64_t seq, size_t pad)
{
    char buf[512];
    raw_send(pub, seq, 8, buf, make_batch(w, seq, pad, buf, sizeof buf));
}

/* Sends malformed messages (a 7-byte seq: counted, nothing else) until one arrives, so the
 * subscription is known to be in place before the first real batch. */
static void raw_join(multi_t *m, void *pub)
{
    uint64_t before = m_stats(m).bad_frames, end = now_ms() + 5000;
    while (m_stats(m).bad_frames == before && now_ms() < end) {
        raw_send(pub, 0, 7, "probe", 5);
        for (int i = 0; i < 4 && m_stats(m).bad_frames == before; i++)
            m_step(m, false);
    }
    assert_true(m_stats(m).bad_frames > before);
}

static void add_rank(multi_t *m, uint64_t w, const char *events, const char *replay)
{
    kvr_zmq_endpoint_t ep = {.worker_id = w, .dp_rank = 0, .events = events, .replay = replay};
    char err[200];
    assert_int_equal(kvr_zmq_listener_add(m->l, &ep, err, sizeof err), KVR_OK);
}

static void expect_worker(const multi_t *m, uint64_t w, const uint64_t *want, const bool *rep,
                          size_t n)
{
    uint64_t seq[MREC];
    bool replayed[MREC];
    size_t got = m_seqs(m, w, seq, replayed, MREC);
    if (got != n)
        fail_msg("worker %llu: %zu batches applied, expected %zu", (unsigned long long)w, got, n);
    for (size_t i = 0; i < n; i++)
        if (seq[i] != want[i] || replayed[i] != rep[i])
            fail_msg("worker %llu batch %zu: seq %llu replayed %d, expected %llu replayed %d",
                     (unsigned long long)w, i, (unsigned long long)seq[i], replayed[i],
                     (unsigned long long)want[i], rep[i]);
    assert_int_equal(m->rec.bad_payloads, 0);
}

/* The key property: rank A's replay socket never answers; while A waits for it, rank B's
 * batches go through at once. A gives its gap up at the deadline, then applies what it held. */
static void test_silent_replay_does_not_stall_other_ranks(void **state)
{
    (void)state;
    multi_t m;
    const int timeout_ms = 1000;
    m_open(&m, (kvr_zmq_config_t){.replay_timeout_ms = timeout_ms});
    char a_ev[128], a_rp[128], b_ev[128];
    void *a = bound_socket(m.ctx, ZMQ_PUB, a_ev, sizeof a_ev);
    void *silent = bound_socket(m.ctx, ZMQ_ROUTER, a_rp, sizeof a_rp); /* never read */
    void *b = bound_socket(m.ctx, ZMQ_PUB, b_ev, sizeof b_ev);
    add_rank(&m, 1, a_ev, a_rp);
    add_rank(&m, 2, b_ev, NULL);
    raw_join(&m, a);
    raw_join(&m, b);

    raw_batch(a, 1, 0, 0);
    WAIT_UNTIL(&m, false, m_count(&m, 1) == 1);
    uint64_t asked = now_ms();
    raw_batch(a, 1, 2, 0); /* batch 1 lost: A asks its replay socket, which stays silent */
    WAIT_UNTIL(&m, false, m_info(&m, 1).recovering);
    raw_batch(a, 1, 3, 0); /* held until A's recovery ends */
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 2);
    assert_int_equal(m_stats(&m).replays_in_progress, 1);
    assert_int_equal(m_info(&m, 1).held_batches, 2);

    uint64_t worst = 0;
    for (uint64_t s = 0; s < 10; s++) {
        uint64_t t0 = now_ms();
        raw_batch(b, 2, s, 0);
        WAIT_UNTIL(&m, false, m_count(&m, 2) == s + 1);
        if (now_ms() - t0 > worst)
            worst = now_ms() - t0;
    }
    print_message("rank B's worst delivery while rank A's replay is silent: %llu ms "
                  "(replay timeout %d ms)\n", (unsigned long long)worst, timeout_ms);
    if (worst >= (uint64_t)timeout_ms / 2) /* waiting behind A would take the timeout */
        fail_msg("a healthy rank waited %llu ms behind another rank's replay",
                 (unsigned long long)worst);
    /* all of that happened while A was still waiting */
    assert_true(m_info(&m, 1).recovering);
    assert_int_equal(m_count(&m, 1), 1);
    assert_int_equal(m_stats(&m).replay_timeouts, 0);

    /* nothing else is coming: one long poll must wake for A's deadline, not sleep it out */
    (void)kvr_zmq_listener_poll(m.l, 20 * timeout_ms);
    uint64_t waited = now_ms() - asked;
    m_verify(&m);
    assert_false(m_info(&m, 1).recovering);
    if (waited < (uint64_t)timeout_ms || waited > 3 * (uint64_t)timeout_ms)
        fail_msg("gave up after %llu ms, for a %d ms deadline", (unsigned long long)waited,
                 timeout_ms);
    uint64_t want_a[] = {0, 2, 3}, want_b[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    bool rep_a[3] = {false}, rep_b[10] = {false};
    expect_worker(&m, 1, want_a, rep_a, 3);
    expect_worker(&m, 2, want_b, rep_b, 10);
    assert_int_equal(m.rec.n_resets, 1);
    assert_int_equal(m.rec.reset_worker[0], 1);
    assert_int_equal(m.rec.resets[0], KVR_RESET_REPLAY_TIMEOUT);
    kvr_zmq_rank_info_t ra = m_info(&m, 1), rb = m_info(&m, 2);
    assert_int_equal(ra.state, KVR_ZMQ_DEGRADED);
    assert_int_equal(ra.gaps, 1);
    assert_int_equal(ra.gaps_lost, 1);
    assert_int_equal(ra.replay_timeouts, 1);
    assert_int_equal(ra.last_seq, 3);
    assert_int_equal(ra.held_batches, 0);
    assert_int_equal(rb.state, KVR_ZMQ_EXACT);
    assert_int_equal(rb.gaps, 0);
    kvr_zmq_stats_t st = m_stats(&m);
    assert_int_equal(st.replay_timeouts, 1);
    assert_int_equal(st.gaps_lost, 1);
    assert_int_equal(st.replays_in_progress, 0);
    assert_int_equal(st.held_batches, 0);
    assert_int_equal(st.held_bytes, 0);
    assert_int_equal(st.hold_overflows, 0);
    assert_int_equal(st.batches, 13);

    zmq_close(a);
    zmq_close(silent);
    zmq_close(b);
    m_close(&m);
}

/* The engine-side publisher, answering replays only when the test's loop lets it. */
static void engine_open(multi_t *m, uint32_t steps, char *events, char *replay, size_t cap)
{
    kvr_kv_pub_config_t cfg = {.endpoint = "tcp://*:0", .replay_endpoint = "tcp://*:0",
                               .topic = "kv", .buffer_steps = steps};
    int st;
    char err[200] = "";
    m->pub = kvr_kv_pub_new(m->ctx, &cfg, &st, err, sizeof err);
    if (m->pub == NULL)
        fail_msg("kvr_kv_pub_new: %s", err);
    char *out[2] = {events, replay};
    for (int k = 0; k < 2; k++) {
        char b[128];
        assert_int_equal(kvr_kv_pub_endpoint(m->pub, k == 1, b, sizeof b), KVR_OK);
        const char *port = strrchr(b, ':');
        assert_non_null(port);
        snprintf(out[k], cap, "tcp://127.0.0.1%s", port);
    }
}

static uint64_t engine_batch(multi_t *m, uint64_t w)
{
    char buf[64];
    uint64_t seq, next = kvr_kv_pub_next_seq(m->pub);
    size_t n = make_batch(w, next, 0, buf, sizeof buf);
    assert_int_equal(kvr_kv_pub_publish(m->pub, (const uint8_t *)buf, n, &seq), KVR_OK);
    assert_int_equal(seq, next);
    return seq;
}

/* Publishes until one batch arrives live (the ones before it come by replay), then waits
 * until everything published so far is applied. Returns the number of batches. */
static uint64_t engine_join(multi_t *m, uint64_t w)
{
    uint64_t end = now_ms() + 5000;
    while (m_count(m, w) == 0 && now_ms() < end) {
        engine_batch(m, w);
        for (int i = 0; i < 10 && m_count(m, w) == 0; i++)
            m_step(m, true);
    }
    uint64_t n = kvr_kv_pub_next_seq(m->pub);
    WAIT_UNTIL(m, true, m_count(m, w) == n && !m_info(m, w).recovering);
    return n;
}

/* Live batches that arrive while a gap is being replayed are applied after the replayed ones,
 * in order, exactly once, even when they reveal another gap of their own. */
static void test_live_batches_held_during_replay(void **state)
{
    (void)state;
    multi_t m;
    m_open(&m, (kvr_zmq_config_t){.replay_timeout_ms = 1000});
    char ev[128], rp[128];
    engine_open(&m, 1000, ev, rp, sizeof ev);
    add_rank(&m, 7, ev, rp);
    uint64_t base = engine_join(&m, 7);
    assert_int_equal(m_info(&m, 7).state, KVR_ZMQ_EXACT);
    uint64_t gaps0 = m_info(&m, 7).gaps;

    kvr_kv_pub_drop_next(m.pub, 3); /* base .. base+2 lost on the wire */
    for (int i = 0; i < 3; i++)
        engine_batch(&m, 7);
    engine_batch(&m, 7); /* base+3 reveals the gap */
    /* the engine does not answer yet: the router is recovering and must hold what comes */
    WAIT_UNTIL(&m, false, m_info(&m, 7).recovering);
    engine_batch(&m, 7); /* base+4 */
    kvr_kv_pub_drop_next(m.pub, 2); /* base+5, base+6: a second gap, inside the held batches */
    engine_batch(&m, 7);
    engine_batch(&m, 7);
    engine_batch(&m, 7); /* base+7 */
    uint64_t last = engine_batch(&m, 7); /* base+8 */
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 4);
    assert_int_equal(m_count(&m, 7), base); /* nothing applied while recovering */
    size_t bytes = 0;
    uint64_t held[] = {base + 3, base + 4, base + 7, base + 8};
    for (int i = 0; i < 4; i++) {
        char buf[64];
        bytes += make_batch(7, held[i], 0, buf, sizeof buf);
    }
    assert_int_equal(m_stats(&m).held_bytes, bytes);

    /* the engine answers: the first gap, then the held batches; base+7 reveals the second
     * gap, which is replayed before base+7 and base+8 */
    WAIT_UNTIL(&m, true, m_count(&m, 7) == last + 1 && !m_info(&m, 7).recovering);
    for (int i = 0; i < 5; i++)
        m_step(&m, true); /* anything unexpected shows up */
    uint64_t want[MREC];
    bool rep[MREC];
    for (uint64_t s = 0; s <= last; s++) {
        want[s] = s;
        rep[s] = s < base ? m.rec.replayed[s]
                          : (s < base + 3 || s == base + 5 || s == base + 6);
    }
    expect_worker(&m, 7, want, rep, (size_t)last + 1);
    kvr_zmq_rank_info_t ri = m_info(&m, 7);
    assert_int_equal(ri.state, KVR_ZMQ_EXACT);
    assert_int_equal(ri.gaps, gaps0 + 2);
    assert_int_equal(ri.gaps_lost, 0);
    assert_int_equal(ri.last_seq, last);
    assert_int_equal(m.rec.n_resets, 0);
    kvr_zmq_stats_t st = m_stats(&m);
    assert_int_equal(st.replay_timeouts, 0);
    assert_int_equal(st.hold_overflows, 0);
    assert_int_equal(st.replays_in_progress, 0);
    assert_int_equal(st.held_batches, 0);
    assert_int_equal(st.held_bytes, 0);
    assert_int_equal(st.duplicates, 0);
    m_close(&m);
}

/* A hold at its bound gives the gap up at once (no waiting for the deadline) and applies
 * what it held, in order; the abandoned answer, when it comes, is not taken for anything. */
static void test_hold_overflow_gives_gap_up(void **state)
{
    (void)state;
    multi_t m;
    m_open(&m, (kvr_zmq_config_t){.replay_timeout_ms = 1000, .max_held_batches = 3});
    char ev[128], rp[128];
    engine_open(&m, 1000, ev, rp, sizeof ev);
    add_rank(&m, 7, ev, rp);
    uint64_t base = engine_join(&m, 7);
    size_t resets0 = m.rec.n_resets;

    kvr_kv_pub_drop_next(m.pub, 2);
    engine_batch(&m, 7);
    engine_batch(&m, 7);
    engine_batch(&m, 7); /* base+2 reveals [base, base+2) and is held */
    WAIT_UNTIL(&m, false, m_info(&m, 7).recovering);
    engine_batch(&m, 7);
    engine_batch(&m, 7); /* the hold is full: base+2, base+3, base+4 */
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 3);
    uint64_t last = engine_batch(&m, 7); /* base+5: one too many */
    WAIT_UNTIL(&m, false, m_count(&m, 7) == base + 4);
    assert_false(m_info(&m, 7).recovering);
    kvr_zmq_stats_t st = m_stats(&m);
    assert_int_equal(st.hold_overflows, 1);
    assert_int_equal(st.replay_timeouts, 0);
    assert_int_equal(st.replays_in_progress, 0);
    assert_int_equal(st.held_batches, 0);
    assert_int_equal(m.rec.n_resets, resets0 + 1);
    assert_int_equal(m.rec.resets[resets0], KVR_RESET_HOLD_FULL);

    /* the engine answers the abandoned request now; then one more batch comes live */
    for (int i = 0; i < 10; i++)
        m_step(&m, true);
    last = engine_batch(&m, 7);
    WAIT_UNTIL(&m, true, m_count(&m, 7) == base + 5);
    for (int i = 0; i < 5; i++)
        m_step(&m, true);
    uint64_t want[MREC];
    bool rep[MREC];
    for (uint64_t s = 0; s < base; s++) {
        want[s] = s;
        rep[s] = m.rec.replayed[s];
    }
    for (uint64_t k = 0; k < 5; k++) {
        want[base + k] = base + 2 + k;
        rep[base + k] = false;
    }
    expect_worker(&m, 7, want, rep, (size_t)base + 5);
    kvr_zmq_rank_info_t ri = m_info(&m, 7);
    assert_int_equal(ri.state, KVR_ZMQ_DEGRADED);
    assert_int_equal(ri.hold_overflows, 1);
    assert_int_equal(ri.last_seq, last);
    assert_int_equal(m_stats(&m).replayed, ri.replayed);
    m_close(&m);
}

/* The byte bound: a batch that does not fit even in an empty hold gives the gap up at once. */
static void test_hold_byte_bound(void **state)
{
    (void)state;
    multi_t m;
    m_open(&m, (kvr_zmq_config_t){.replay_timeout_ms = 1000, .max_held_bytes = 64});
    char ev[128], rp[128];
    void *pub = bound_socket(m.ctx, ZMQ_PUB, ev, sizeof ev);
    void *silent = bound_socket(m.ctx, ZMQ_ROUTER, rp, sizeof rp);
    add_rank(&m, 3, ev, rp);
    raw_join(&m, pub);
    raw_batch(pub, 3, 0, 0);
    raw_batch(pub, 3, 2, 0); /* 6 bytes: held */
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 1);
    raw_batch(pub, 3, 3, 100); /* 106 bytes: over the bound */
    WAIT_UNTIL(&m, false, m_count(&m, 3) == 3);
    uint64_t want[] = {0, 2, 3};
    bool rep[3] = {false};
    expect_worker(&m, 3, want, rep, 3);
    kvr_zmq_stats_t st = m_stats(&m);
    assert_int_equal(st.hold_overflows, 1);
    assert_int_equal(st.gaps_lost, 1);
    assert_int_equal(st.replay_timeouts, 0);
    assert_int_equal(st.held_bytes, 0);
    /* a gap revealed by a batch too big to hold is given up at once as well */
    raw_batch(pub, 3, 5, 100);
    WAIT_UNTIL(&m, false, m_count(&m, 3) == 4);
    assert_false(m_info(&m, 3).recovering);
    assert_int_equal(m_stats(&m).hold_overflows, 2);
    assert_int_equal(m_info(&m, 3).last_seq, 5);
    zmq_close(pub);
    zmq_close(silent);
    m_close(&m);
}

/* remove() of a recovering rank frees what it held and stops its replay; the other ranks go
 * on; the rank can come back; free() during a recovery releases everything (ASan checks). */
static void test_remove_and_free_during_recovery(void **state)
{
    (void)state;
    multi_t m;
    m_open(&m, (kvr_zmq_config_t){.replay_timeout_ms = 1000});
    char a_ev[128], a_rp[128], b_ev[128];
    void *a = bound_socket(m.ctx, ZMQ_PUB, a_ev, sizeof a_ev);
    void *silent = bound_socket(m.ctx, ZMQ_ROUTER, a_rp, sizeof a_rp);
    void *b = bound_socket(m.ctx, ZMQ_PUB, b_ev, sizeof b_ev);
    add_rank(&m, 1, a_ev, a_rp);
    add_rank(&m, 2, b_ev, NULL);
    raw_join(&m, a);
    raw_join(&m, b);
    raw_batch(a, 1, 4, 10); /* joined late: [0, 4) is asked for */
    raw_batch(a, 1, 5, 10);
    raw_batch(a, 1, 6, 10);
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 3);
    assert_int_equal(m_stats(&m).replays_in_progress, 1);

    assert_int_equal(kvr_zmq_listener_remove(m.l, 1, 0), KVR_OK);
    m_verify(&m);
    kvr_zmq_stats_t st = m_stats(&m);
    assert_int_equal(st.replays_in_progress, 0);
    assert_int_equal(st.held_batches, 0);
    assert_int_equal(st.held_bytes, 0);
    assert_int_equal(m_count(&m, 1), 0); /* nothing held was applied */
    raw_batch(b, 2, 0, 0);
    WAIT_UNTIL(&m, false, m_count(&m, 2) == 1);

    /* back again, and recovering (from the same silent socket) when the listener is freed */
    add_rank(&m, 1, a_ev, a_rp);
    raw_join(&m, a);
    raw_batch(a, 1, 9, 10);
    raw_batch(a, 1, 10, 10);
    WAIT_UNTIL(&m, false, m_stats(&m).held_batches == 2);
    assert_true(m_info(&m, 1).recovering);
    assert_int_equal(m.rec.n_resets, 0);
    zmq_close(a);
    zmq_close(silent);
    zmq_close(b);
    m_close(&m);
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
        cmocka_unit_test_setup_teardown(test_resync_rebuilds_from_batch_0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resync_buffer_trimmed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silent_replay_socket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_numbers_ahead, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gap_confirm_batch_trimmed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connection_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restart_after_reconnect, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_remove_validation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_confirmed_with_live_batches_first, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_resume_replay_ahead_of_live, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_refused_by_another_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_cursor_no_longer_buffered, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_without_answer_or_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_silent_replay_socket, setup, teardown),
        cmocka_unit_test(test_silent_replay_does_not_stall_other_ranks),
        cmocka_unit_test(test_live_batches_held_during_replay),
        cmocka_unit_test(test_hold_overflow_gives_gap_up),
        cmocka_unit_test(test_hold_byte_bound),
        cmocka_unit_test(test_remove_and_free_during_recovery),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
