/*
 * bench_sync.c: `kvrouter bench sync`: router replicas over a real nats-server (started here
 * on a free loopback port, JetStream on, its store in a temporary directory), four figures:
 *
 *   lag        replicas A and B (replica sync on, 8 workers known by id). bench route's load
 *              generator books requests on A and frees them (POST /v1/route with
 *              update_state, then DELETE: two mutations each) at --rate mutations/s for
 *              --duration s. B's kvr_sync_lag_seconds histogram (publish on A to applied on
 *              B, by the two processes' wall clocks, the same host) gives p50 and p99 as the
 *              upper bound of their bucket; B must have applied every add and free A made.
 *   route      closed-loop POST /v1/route (update_state + DELETE, 32 clients) against C (the
 *              same router, no NATS), then A (sync on, B applying on the same cores), then A
 *              again with B stopped (only the publishing side's cost): both ratios to C.
 *   discovery  router D (--discovery nats, --nats-presence-ttl-ms --ttl-ms): a worker entry
 *              written by this process (cluster/discovery.c's register) until D lists it; then a
 *              `kvrouter register` child killed with SIGKILL until D drops it.
 *   join       --pairs (1M) (worker, block) pairs published as KV events by 8 engine
 *              publishers this process runs (ZeroMQ PUB + replay ROUTER, events/kv_publisher.c),
 *              ingested by router E; then router F starts with --peers E: from its spawn to
 *              its /ready answering 200 (the snapshot fetched over HTTP, checked, applied, each
 *              rank resumed from its publisher's replay buffer), and F's index pairs = E's.
 *
 * Targets (the issue's): lag p99 <= 5 ms at 10,000 mutations/s; route with sync >= 80% of
 * without; a new worker routable <= 1 s; a dead one dropped <= TTL + 1 s; a join of 1M pairs
 * ready <= 5 s. The numbers are this machine's, printed as measured.
 * Threads: main (setup, polling, publishing the join's events), the load generator's.
 * Children: nats-server and the routers (apps/child.h), stopped at the end.
 * Invariants: every child started is stopped before the benchmark returns (in reverse order).
 * Memory: bodies and samples are owned here. Cost: the join's publishing dominates the wall time.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "apps/child.h"
#include "apps/cli.h"
#include "bench.h"
#include "kvrouter/router.h"
#include "cluster/discovery.h"
#include "http/http.h"
#include "events/kv_publisher.h"
#include "nats/nats_link.h"
#include "wire/kv_encode.h"

#define N_WORKERS 8
#define JOIN_WORKERS 8
#define CHAIN 256 /* blocks per stored event in the join's stream */

typedef struct sync_args {
    double rate, duration_s;
    uint64_t pairs, ttl_ms;
} sync_args_t;

typedef struct env {
    char dir[512], nats_url[64];
    kvr_child_t nats;
    bool nats_up;
    kvr_child_t kids[8];
    size_t n_kids;
} env_t;

/* ---- small helpers ------------------------------------------------------------------------ */

/* A router child with these extra flags (NULL-terminated), 8 workers by id unless no_workers. */
static kvr_child_t *router(env_t *e, const char *what, const char *const *extra,
                           bool no_workers)
{
    if (e->n_kids == 8)
        return NULL;
    static char wspec[N_WORKERS][16];
    char *argv[64];
    size_t k = 0;
    const char *fixed[] = {"kvrouter", "serve", "--http-port", "0", "--bind", "127.0.0.1",
                           "--log-level", "warn", "--min-initial-workers", "0"};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        argv[k++] = (char *)fixed[i];
    for (size_t i = 0; extra != NULL && extra[i] != NULL && k < 40; i++)
        argv[k++] = (char *)extra[i];
    for (int w = 0; !no_workers && w < N_WORKERS; w++) {
        snprintf(wspec[w], sizeof wspec[w], "id=%d", w + 1);
        argv[k++] = "--worker";
        argv[k++] = wspec[w];
    }
    argv[k] = NULL;
    kvr_child_t *c = &e->kids[e->n_kids];
    if (!kvr_bench_spawn(c, e->dir, what, argv, "kvrouter bench sync"))
        return NULL;
    e->n_kids++;
    return c;
}

/* The upper bound of the bucket holding quantile q of histogram name on c. */
static double hist_quantile(const kvr_child_t *c, const char *name, double q, double *count)
{
    static const char *const les[] = {"0.0001", "0.00025", "0.0005", "0.001", "0.0015",
                                      "0.002",  "0.003",   "0.004",  "0.005", "0.01",
                                      "0.025",  "0.05",    "0.1",    "0.5",   "1"};
    char sample[128];
    snprintf(sample, sizeof sample, "%s_count", name);
    *count = kvr_child_metric(c, sample);
    for (size_t i = 0; i < sizeof les / sizeof les[0] && *count > 0; i++) {
        snprintf(sample, sizeof sample, "%s_bucket{le=\"%s\"}", name, les[i]);
        if (kvr_child_metric(c, sample) >= q * *count)
            return strtod(les[i], NULL) * 1000.0;
    }
    return INFINITY;
}

/* Whether c's GET /v1/workers lists worker id. */
static bool lists_worker(const kvr_child_t *c, uint64_t id)
{
    int st;
    char *w = kvr_child_get(c, "/v1/workers", &st), needle[48];
    snprintf(needle, sizeof needle, "\"worker_id\":%llu,", (unsigned long long)id);
    bool yes = w != NULL && strstr(w, needle) != NULL;
    free(w);
    return yes;
}

static void base_opts(kvr_bench_opts_t *o, const kvr_child_t *c, char *url, size_t cap)
{
    memset(o, 0, sizeof *o);
    snprintf(url, cap, "http://%s", c->addr);
    o->url = url;
    o->runs = 1;
    o->seed = 1;
    o->warmup_s = 1.0;
    o->prefix_share = 0.5;
    o->threads = 1;
    o->update_state = true;
}

/* ---- the four parts ----------------------------------------------------------------------- */

static int part_lag(env_t *e, const sync_args_t *a, kvr_child_t **out_a, kvr_child_t **out_b)
{
    const char *sync[] = {"--nats-url", e->nats_url, "--router-replica-sync", "true", NULL};
    kvr_child_t *ra = router(e, "replica-A", sync, false), *rb = router(e, "replica-B", sync, false);
    if (ra == NULL || rb == NULL || kvr_child_wait_ready(ra, 30) != KVR_OK ||
        kvr_child_wait_ready(rb, 30) != KVR_OK)
        return 1;
    kvr_bench_opts_t o;
    char url[160];
    base_opts(&o, ra, url, sizeof url);
    o.duration_s = a->duration_s;
    o.rate_per_s = a->rate / 2.0; /* a route and a DELETE per request */
    printf("== lag: bench route on A at %.0f requests/s (= %.0f mutations/s), B applies\n",
           o.rate_per_s, a->rate);
    double per_s;
    int rc = kvr_bench_route_point(&o, 32, 1024, &per_s);
    if (rc != 0)
        return rc;
    double published = kvr_child_metric(ra, "kvr_sync_published_events_total"), applied_add,
           applied_free;
    for (int i = 0; i < 200; i++) { /* until B has applied everything A published */
        applied_add = kvr_child_metric(rb, "kvr_sync_applied_events_total{kind=\"add\"}");
        applied_free = kvr_child_metric(rb, "kvr_sync_applied_events_total{kind=\"free\"}");
        if (applied_add + applied_free >= published)
            break;
        usleep(10000);
    }
    double n, p50 = hist_quantile(rb, "kvr_sync_lag_seconds", 0.5, &n),
              p99 = hist_quantile(rb, "kvr_sync_lag_seconds", 0.99, &n);
    printf("sync_lag  mutations_per_s %.0f  batches %.0f  p50_ms <= %.2f  p99_ms <= %.2f  "
           "(target p99 <= 5)  published %.0f  applied %.0f (%.0f adds, %.0f frees)  "
           "lost_batches %.0f\n",
           2.0 * per_s, n, p50, p99, published, applied_add + applied_free, applied_add,
           applied_free, kvr_child_metric(rb, "kvr_sync_lost_batches_total"));
    *out_a = ra;
    *out_b = rb;
    return 0;
}

static int part_route(env_t *e, kvr_child_t *ra, kvr_child_t *rb)
{
    kvr_child_t *rc_ = router(e, "single", NULL, false);
    if (rc_ == NULL || kvr_child_wait_ready(rc_, 30) != KVR_OK)
        return 1;
    kvr_bench_opts_t o;
    char url[160];
    double on = NAN, off = NAN, alone = NAN;
    printf("== route: closed loop, 32 clients, 1024-token prompts, update_state + DELETE: "
           "without NATS, A with B applying, A with B stopped\n");
    base_opts(&o, rc_, url, sizeof url);
    o.duration_s = 5.0;
    int rc = kvr_bench_route_point(&o, 32, 1024, &off);
    base_opts(&o, ra, url, sizeof url);
    o.duration_s = 5.0;
    if (rc == 0)
        rc = kvr_bench_route_point(&o, 32, 1024, &on);
    kvr_child_stop(rb); /* A keeps publishing; nobody applies on this machine's 2 cores */
    if (rc == 0)
        rc = kvr_bench_route_point(&o, 32, 1024, &alone);
    printf("route_sync  without_per_s %.0f  with_sync_per_s %.0f  ratio %.2f  (target >= 0.80; "
           "B applies every event on the same cores)  with_sync_no_peer_per_s %.0f  ratio %.2f\n",
           off, on, on / off, alone, alone / off);
    return rc;
}

static int part_discovery(env_t *e, const sync_args_t *a)
{
    char ttl[24];
    snprintf(ttl, sizeof ttl, "%llu", (unsigned long long)a->ttl_ms);
    const char *disc[] = {"--nats-url", e->nats_url, "--discovery", "nats",
                          "--nats-presence-ttl-ms", ttl, NULL};
    kvr_child_t *rd = router(e, "discovering", disc, true);
    if (rd == NULL)
        return 1;
    int st;
    char err[300];
    kvr_nats_config_t nc = {.url = e->nats_url, .name = "kvrouter bench sync"};
    kvr_nats_t *n = kvr_nats_new(&nc, &st, err, sizeof err);
    if (n == NULL) {
        fprintf(stderr, "kvrouter bench sync: %s\n", err);
        return 1;
    }
    kvr_worker_spec_t w = {.worker_id = 77, .dp_size = 1};
    double t0 = kvr_child_now_s();
    st = kvr_discovery_register(n, "kvrouter", a->ttl_ms, &w);
    while (st == KVR_OK && !lists_worker(rd, 77) && kvr_child_now_s() - t0 < 10)
        usleep(1000);
    double appear_ms = (kvr_child_now_s() - t0) * 1000.0;
    kvr_nats_free(n); /* a clean stop: its entry deleted */
    /* a crash: a register sidecar killed without cleanup */
    kvr_child_t reg;
    char log[1024], spec[32];
    snprintf(log, sizeof log, "%.400s/register.log", e->dir);
    snprintf(spec, sizeof spec, "id=78");
    char *argv[] = {"kvrouter", "register", "--nats-url", e->nats_url, "--nats-presence-ttl-ms",
                    ttl, "--worker", spec, NULL};
    double gone_ms = NAN;
    if (kvr_child_spawn(&reg, kvr_child_self(), "register", argv, log, err, sizeof err) ==
        KVR_OK) {
        double t1 = kvr_child_now_s();
        while (!lists_worker(rd, 78) && kvr_child_now_s() - t1 < 10)
            usleep(1000);
        kill(reg.pid, SIGKILL);
        double t2 = kvr_child_now_s();
        while (lists_worker(rd, 78) && kvr_child_now_s() - t2 < 30)
            usleep(5000);
        gone_ms = (kvr_child_now_s() - t2) * 1000.0;
        kvr_child_stop(&reg);
    }
    printf("== discovery (nats_presence_ttl_ms %llu)\n", (unsigned long long)a->ttl_ms);
    printf("discovery  appear_ms %.1f  (target <= 1000)  dead_dropped_ms %.0f  (target <= %llu)\n",
           appear_ms, gone_ms, (unsigned long long)(a->ttl_ms + 1000));
    return 0;
}

/* The join's engines: JOIN_WORKERS publishers, each storing its share of pairs as chains of
 * CHAIN new blocks. */
typedef struct engines {
    void *zctx;
    kvr_kv_pub_t *pub[JOIN_WORKERS];
    int ev_port[JOIN_WORKERS], rp_port[JOIN_WORKERS];
} engines_t;

static int engines_start(engines_t *g, uint64_t pairs)
{
    memset(g, 0, sizeof *g);
    g->zctx = zmq_ctx_new();
    for (int w = 0; w < JOIN_WORKERS; w++) {
        char ev[64], rp[64], err[300];
        g->ev_port[w] = kvr_free_port();
        g->rp_port[w] = kvr_free_port();
        snprintf(ev, sizeof ev, "tcp://*:%d", g->ev_port[w]); /* a star: the PUB binds */
        snprintf(rp, sizeof rp, "tcp://127.0.0.1:%d", g->rp_port[w]);
        /* every batch stays replayable: the joining router resumes from the snapshot's cursor */
        kvr_kv_pub_config_t pc = {.endpoint = ev, .replay_endpoint = rp,
                                  .buffer_steps = (uint32_t)(pairs / CHAIN / JOIN_WORKERS + 16),
                                  .hwm = 1000000};
        int st;
        if ((g->pub[w] = kvr_kv_pub_new(g->zctx, &pc, &st, err, sizeof err)) == NULL) {
            fprintf(stderr, "kvrouter bench sync: engine %d: %s\n", w, err);
            return 1;
        }
    }
    return 0;
}

static void engines_serve(engines_t *g)
{
    for (int w = 0; w < JOIN_WORKERS; w++) {
        kvr_kv_pub_poll_replay(g->pub[w]);
        kvr_kv_pub_poll_subscriptions(g->pub[w]);
    }
}

static int engines_publish(engines_t *g, uint64_t pairs)
{
    int st;
    kvr_kv_enc_config_t ec = {.format = KVR_KV_FMT_VLLM_ARRAY};
    kvr_kv_enc_t *enc = kvr_kv_enc_new(&ec, &st);
    uint64_t *hashes = malloc(CHAIN * sizeof *hashes);
    uint32_t *tokens = malloc(CHAIN * 16 * sizeof *tokens);
    if (enc == NULL || hashes == NULL || tokens == NULL) {
        kvr_kv_enc_free(enc);
        free(hashes);
        free(tokens);
        return 1;
    }
    uint64_t id = 1, chains = pairs / CHAIN;
    for (uint64_t c = 0; c < chains; c++) {
        int w = (int)(c % JOIN_WORKERS);
        for (int i = 0; i < CHAIN; i++)
            hashes[i] = kvr_bench_mix64(id++);
        for (int i = 0; i < CHAIN * 16; i++)
            tokens[i] = (uint32_t)(kvr_bench_mix64(id * 131 + (uint64_t)i) % 150000);
        kvr_kv_enc_stored_t s = {.hashes = hashes, .n_hashes = CHAIN, .tokens = tokens,
                                 .n_tokens = CHAIN * 16, .block_size = 16, .medium = "GPU"};
        const uint8_t *bytes;
        size_t len;
        if (kvr_kv_enc_begin_batch(enc, 1789095808.0 + (double)c, false, 0) != KVR_OK ||
            kvr_kv_enc_add_stored(enc, &s) != KVR_OK ||
            kvr_kv_enc_end_batch(enc, &bytes, &len) != KVR_OK ||
            kvr_kv_pub_publish(g->pub[w], bytes, len, NULL) != KVR_OK)
            break;
        if (c % 64 == 0)
            engines_serve(g);
    }
    kvr_kv_enc_free(enc);
    free(hashes);
    free(tokens);
    return 0;
}

static void engines_stop(engines_t *g)
{
    for (int w = 0; w < JOIN_WORKERS; w++)
        kvr_kv_pub_free(g->pub[w]);
    if (g->zctx != NULL)
        zmq_ctx_term(g->zctx);
}

/* The worker flags of the join's routers. */
static void join_flags(const engines_t *g, char spec[JOIN_WORKERS][128], const char **argv)
{
    for (int w = 0; w < JOIN_WORKERS; w++) {
        snprintf(spec[w], 128, "id=%d,events=tcp://127.0.0.1:%d,replay=tcp://127.0.0.1:%d",
                 w + 1, g->ev_port[w], g->rp_port[w]);
        argv[2 * w] = "--worker";
        argv[2 * w + 1] = spec[w];
    }
}

static int part_join(env_t *e, const sync_args_t *a)
{
    engines_t g;
    if (engines_start(&g, a->pairs) != 0) {
        engines_stop(&g);
        return 1;
    }
    char spec[JOIN_WORKERS][128], budget[32];
    const char *argv[2 * JOIN_WORKERS + 8];
    join_flags(&g, spec, argv);
    snprintf(budget, sizeof budget, "%llu", (unsigned long long)(a->pairs * 2));
    size_t k = 2 * JOIN_WORKERS;
    argv[k++] = "--index-max-pairs";
    argv[k++] = budget;
    argv[k] = NULL;
    int rc = 1;
    kvr_child_t *re = router(e, "indexed", argv, true);
    double want = (double)(a->pairs / CHAIN * CHAIN);
    double t0 = kvr_child_now_s();
    while (re != NULL) { /* its subscriptions reach every publisher before batch 0 */
        engines_serve(&g);
        kvr_kv_pub_stats_t ps;
        int subscribed = 0;
        for (int w = 0; w < JOIN_WORKERS; w++) {
            kvr_kv_pub_get_stats(g.pub[w], &ps);
            subscribed += ps.subscribers > 0;
        }
        if (subscribed == JOIN_WORKERS || kvr_child_now_s() - t0 > 30)
            break;
        usleep(5000);
    }
    if (re != NULL && engines_publish(&g, a->pairs) == 0) {
        double t1 = kvr_child_now_s();
        while (kvr_child_metric(re, "kvr_index_pairs") < want && kvr_child_now_s() - t1 < 120) {
            engines_serve(&g);
            usleep(20000);
        }
        double held = kvr_child_metric(re, "kvr_index_pairs");
        char peer[160];
        snprintf(peer, sizeof peer, "http://%s", re->addr);
        argv[k++] = "--peers";
        argv[k++] = peer;
        argv[k] = NULL;
        double t2 = kvr_child_now_s();
        kvr_child_t *rf = router(e, "joining", argv, true);
        double ready_s = NAN, joined = NAN;
        while (rf != NULL && kvr_child_now_s() - t2 < 60) {
            engines_serve(&g); /* answers the joining router's replay requests */
            int st;
            char *b = kvr_child_get(rf, "/ready", &st);
            free(b);
            if (st == 200) {
                ready_s = kvr_child_now_s() - t2;
                break;
            }
            usleep(2000);
        }
        if (rf != NULL)
            joined = kvr_child_metric(rf, "kvr_index_pairs");
        printf("== join: a router holding %.0f pairs (%d workers); a new one with --peers\n",
               held, JOIN_WORKERS);
        printf("join  pairs %.0f  ready_s %.2f  (target <= 5, from spawn to /ready 200)  "
               "joined_pairs %.0f  equal %s\n",
               held, ready_s, joined, joined == held ? "yes" : "NO");
        rc = isnan(ready_s) ? 1 : 0;
    }
    engines_stop(&g);
    return rc;
}

/* ---- the command -------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out, "usage: kvrouter bench sync [--rate MUTATIONS_PER_S] [--duration S] "
                 "[--pairs N] [--ttl-ms MS]\n\n"
                 "Router replicas over a real nats-server: replica-sync lag at --rate (10000)\n"
                 "for --duration (10) s, POST /v1/route with and without sync, discovery\n"
                 "latency (TTL --ttl-ms, 3000), a replica joining a fleet of --pairs (1000000).\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    sync_args_t *a = arg;
    if (kvr_cli_is(c, "--rate"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->rate);
    if (kvr_cli_is(c, "--duration"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->duration_s);
    if (kvr_cli_is(c, "--pairs"))
        return kvr_cli_u64(c, kvr_cli_value(c), CHAIN * JOIN_WORKERS, 100000000, &a->pairs);
    if (kvr_cli_is(c, "--ttl-ms"))
        return kvr_cli_u64(c, kvr_cli_value(c), 300, 3600000, &a->ttl_ms);
    return -1;
}

int kvr_bench_sync(int argc, char **argv)
{
    sync_args_t a = {.rate = 10000, .duration_s = 10, .pairs = 1000000, .ttl_ms = 3000};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter bench sync", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    signal(SIGPIPE, SIG_IGN);
    env_t e = {.n_kids = 0};
    if (!kvr_bench_workdir(e.dir, sizeof e.dir, "bench-sync", "kvrouter bench sync"))
        return 1;
    char err[300];
    rc = kvr_nats_server_start(&e.nats, e.dir, e.nats_url, sizeof e.nats_url, err, sizeof err);
    if (rc != KVR_OK)
        fprintf(stderr, "kvrouter bench sync: %s\n", err);
    e.nats_up = rc == KVR_OK;
    kvr_child_t *ra = NULL, *rb = NULL;
    rc = e.nats_up ? part_lag(&e, &a, &ra, &rb) : 1;
    if (rc == 0)
        rc = part_route(&e, ra, rb);
    if (rc == 0)
        rc = part_discovery(&e, &a);
    if (rc == 0)
        rc = part_join(&e, &a);
    kvr_bench_children_stop(e.kids, e.n_kids);
    if (e.nats_up)
        kvr_child_stop(&e.nats);
    kvr_bench_workdir_end(e.dir, rc, "kvrouter bench sync");
    return rc;
}
