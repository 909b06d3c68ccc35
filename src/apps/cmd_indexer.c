/*
 * cmd_indexer.c: `kvrouter indexer`, the standalone KV indexer daemon (indexer/indexer_server.h),
 * with the reference indexer's flags, and kvrouter's: the pair budget and partition cap, and
 * the key files of `serve` (--api-key-file, --admin-key-file, --peer-key-file). --peers
 * recovers the index and the registrations (indexer_server.h, "Start-up"). Prints
 * "listening HOST:PORT" on stdout once it answers. SIGINT / SIGTERM close the listener and
 * stop once the answers in flight are out.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "kvrouter.h"
#include "indexer/indexer.h"
#include "base/log.h"

#define MAX_WORKERS 4096

typedef struct indexer_args {
    kvr_indexer_config_t cfg;
    kvr_indexer_worker_t *workers;
    const char *workers_text;
    char *peers_text;
    const char *peers[KVR_INDEXER_MAX_PEERS];
    uint64_t port;
    bool have_block_size;
} indexer_args_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter indexer [options]\n\n"
            "A standalone KV indexer: one prefix index per (model_name, routing_group), fed by\n"
            "the engines' ZeroMQ KV events, queried over HTTP (POST /query, /query_by_hash).\n\n"
            "  --port N              HTTP port [8090]\n"
            "  --bind HOST           listen address [127.0.0.1]\n"
            "  --workers LIST        id[:dp_rank]=tcp://host:port,... registered at start\n"
            "  --block-size N        their block size (required with --workers)\n"
            "  --model NAME          their model name [default] (--model-name: the same)\n"
            "  --routing-group NAME  their routing_group [default]\n"
            "  --peers LIST          http://host:port,... : recover the index from the first\n"
            "                        whose index reads whole, before listening, with its\n"
            "                        registrations (GET /workers): their engines are\n"
            "                        subscribed here too (--workers win for an instance\n"
            "                        named both ways)\n"
            "  --peer-timeout-ms MS  how long each answer of a peer may take [10000]\n"
            "  --max-pairs N         (worker rank, block) pairs each partition's index keeps\n"
            "                        [16777216, or --max-total-pairs when less]\n"
            "  --max-total-pairs N   pairs every partition together may keep: a new partition\n"
            "                        reserves min(--max-pairs, what is left) and is refused\n"
            "                        (400) when less than 1024 is left [67108864]\n"
            "  --max-partitions N    (model_name, routing_group) partitions at most [64]; one\n"
            "                        with no registration and an empty index is dropped\n"
            "  --api-key-file PATH   token (Authorization: Bearer) for queries and reads\n"
            "  --admin-key-file PATH token for every call that changes something (register,\n"
            "                        unregister, record decisions, peers)\n"
            "  --peer-key-file PATH  token accepted for the index copies (/dump, snapshots)\n"
            "                        and GET /workers besides the admin key, and sent to\n"
            "                        --peers\n"
            "  --router-ttl-secs S   how long a recorded routing decision (POST\n"
            "                        /record_routing_decision, from routers in approximate\n"
            "                        mode) counts as cached [120]\n"
            "  --threads N           accepted for the reference's command line; each partition\n"
            "                        has one ingest thread and queries run on the HTTP thread\n"
            "  --log-level L         debug | info | warn | error [info]\n");
}

/* "id[:dp]=addr" items, comma-separated. */
static int parse_workers(const kvr_cli_t *c, indexer_args_t *a)
{
    char *text = strdup(a->workers_text);
    a->workers = calloc(MAX_WORKERS, sizeof *a->workers);
    if (text == NULL || a->workers == NULL) {
        free(text);
        return kvr_cli_fail(c, "out of memory");
    }
    int rc = 0;
    char *save = NULL;
    for (char *item = strtok_r(text, ",", &save); item && rc == 0;
         item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (a->cfg.n_workers >= MAX_WORKERS) {
            rc = kvr_cli_fail(c, "--workers: more than %d", MAX_WORKERS);
            break;
        }
        kvr_indexer_worker_t *w = &a->workers[a->cfg.n_workers];
        char *end = NULL;
        if (eq == NULL || eq[1] == '\0') {
            rc = kvr_cli_fail(c, "--workers: '%s': expected id[:dp_rank]=tcp://host:port", item);
            break;
        }
        *eq = '\0';
        unsigned long long id = strtoull(item, &end, 10);
        unsigned long dp = 0;
        if (end != item && *end == ':') {
            char *r = end + 1;
            dp = strtoul(r, &end, 10);
            if (end == r || dp > UINT32_MAX)
                end = r - 1;
        }
        if (end == item || *end != '\0' || item[0] == '-') {
            rc = kvr_cli_fail(c, "--workers: '%s': the id must be an integer (id or id:dp_rank)",
                              item);
            break;
        }
        if (strlen(eq + 1) >= sizeof w->endpoint) {
            rc = kvr_cli_fail(c, "--workers: the address of %llu is too long", id);
            break;
        }
        w->instance_id = id;
        w->dp_rank = (uint32_t)dp;
        snprintf(w->endpoint, sizeof w->endpoint, "%s", eq + 1);
        a->cfg.n_workers++;
    }
    free(text);
    a->cfg.workers = a->workers;
    return rc;
}

static int parse_peers(const kvr_cli_t *c, indexer_args_t *a)
{
    char *save = NULL;
    for (char *p = strtok_r(a->peers_text, ",", &save); p; p = strtok_r(NULL, ",", &save)) {
        if (strncmp(p, "http://", 7) != 0)
            return kvr_cli_fail(c, "--peers: '%s' is not an http:// URL", p);
        if (a->cfg.n_peers >= KVR_INDEXER_MAX_PEERS)
            return kvr_cli_fail(c, "--peers: more than %d", KVR_INDEXER_MAX_PEERS);
        a->peers[a->cfg.n_peers++] = p;
    }
    a->cfg.peers = a->peers;
    return 0;
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    indexer_args_t *a = arg;
    uint64_t v64;
    int rc;
    if (kvr_cli_is(c, "--port"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, 65535, &a->port);
    if (kvr_cli_is(c, "--bind"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.bind);
    if (kvr_cli_is(c, "--workers"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->workers_text);
    if (kvr_cli_is(c, "--block-size")) {
        a->have_block_size = true;
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 65536, &a->cfg.block_size);
    }
    if (kvr_cli_is_or_old(c, "--model", "--model-name"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.model_name);
    if (kvr_cli_is(c, "--routing-group"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.routing_group);
    if (kvr_cli_is(c, "--tenant-id")) /* the reference's legacy flag: ignored there too */
        return kvr_cli_value(c) ? 0 : kvr_cli_bad(c, NULL, "a value is required");
    if (kvr_cli_is(c, "--peers")) {
        const char *v = kvr_cli_value(c);
        if (v == NULL)
            return kvr_cli_bad(c, v, "a value is required");
        free(a->peers_text);
        a->peers_text = strdup(v);
        return a->peers_text ? 0 : kvr_cli_fail(c, "out of memory");
    }
    if (kvr_cli_is(c, "--peer-timeout-ms"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, 3600000, &a->cfg.peer_timeout_ms);
    if (kvr_cli_is(c, "--max-pairs")) {
        rc = kvr_cli_u64(c, kvr_cli_value(c), 1024, (uint64_t)1 << 34, &v64);
        a->cfg.max_pairs = (size_t)v64;
        return rc;
    }
    if (kvr_cli_is(c, "--max-total-pairs")) {
        rc = kvr_cli_u64(c, kvr_cli_value(c), 1024, (uint64_t)1 << 40, &v64);
        a->cfg.max_total_pairs = (size_t)v64;
        return rc;
    }
    if (kvr_cli_is(c, "--max-partitions")) {
        rc = kvr_cli_u64(c, kvr_cli_value(c), 1, KVR_INDEXER_MAX_PARTITIONS, &v64);
        a->cfg.max_partitions = (size_t)v64;
        return rc;
    }
    if (kvr_cli_is(c, "--api-key-file"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.api_key_file);
    if (kvr_cli_is(c, "--admin-key-file"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.admin_key_file);
    if (kvr_cli_is(c, "--peer-key-file"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->cfg.peer_key_file);
    if (kvr_cli_is(c, "--router-ttl-secs")) {
        rc = kvr_cli_u64(c, kvr_cli_value(c), 1, 86400 * 365, &v64);
        a->cfg.decision_ttl_ms = v64 * 1000;
        return rc;
    }
    if (kvr_cli_is(c, "--threads"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, 1024, &v64);
    if (kvr_cli_is(c, "--log-level")) {
        int level;
        rc = kvr_cli_log_level(c, kvr_cli_value(c), &level);
        if (rc == 0)
            kvr_log_set_level((kvr_log_level_t)level);
        return rc;
    }
    return -1;
}

typedef struct run {
    struct event_base *base;
    kvr_indexer_t *x;
    struct event *tick;
    bool draining;
} run_t;

static void on_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what;
    run_t *r = arg;
    if (kvr_indexer_busy(r->x) == 0)
        event_base_loopexit(r->base, NULL);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    run_t *r = arg;
    if (r->draining) {
        event_base_loopexit(r->base, NULL);
        return;
    }
    r->draining = true;
    kvr_log(KVR_LOG_INFO, "signal %d: closing the listener; stopping once answers are out",
            (int)sig);
    kvr_indexer_drain(r->x);
    struct timeval tv = {0, 20000};
    if (r->tick == NULL || event_add(r->tick, &tv) != 0)
        event_base_loopexit(r->base, NULL);
}

static int run(indexer_args_t *a)
{
    evthread_use_pthreads();
    signal(SIGPIPE, SIG_IGN);
    run_t r = {0};
    /* the changelist folds the per-request enable/disable of write events into one epoll_ctl
     * (as serve's loop does) */
    struct event_config *ec = event_config_new();
    if (ec != NULL)
        event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    r.base = ec != NULL ? event_base_new_with_config(ec) : event_base_new();
    if (ec != NULL)
        event_config_free(ec);
    if (r.base == NULL)
        return fprintf(stderr, "kvrouter indexer: out of memory\n"), 1;
    char err[800] = "";
    r.x = kvr_indexer_new(r.base, &a->cfg, err, sizeof err);
    if (r.x == NULL) {
        fprintf(stderr, "kvrouter indexer: %s\n", err);
        event_base_free(r.base);
        return 2;
    }
    r.tick = event_new(r.base, -1, EV_PERSIST, on_tick, &r);
    struct event *s1 = evsignal_new(r.base, SIGINT, on_signal, &r);
    struct event *s2 = evsignal_new(r.base, SIGTERM, on_signal, &r);
    if (s1 != NULL)
        event_add(s1, NULL);
    if (s2 != NULL)
        event_add(s2, NULL);
    printf("listening %s:%u\n", a->cfg.bind ? a->cfg.bind : "127.0.0.1", kvr_indexer_port(r.x));
    fflush(stdout);
    const char *regs = kvr_indexer_registrations(r.x);
    kvr_log(KVR_LOG_INFO, "indexer listening on port %u (index: %s%s%s)", kvr_indexer_port(r.x),
            kvr_indexer_origin(r.x), regs[0] ? "; registrations: " : "", regs);
    event_base_dispatch(r.base);
    if (s1)
        event_free(s1);
    if (s2)
        event_free(s2);
    signal(SIGTERM, SIG_IGN); /* past the loop: the orderly end is not cut short */
    signal(SIGINT, SIG_IGN);
    if (r.tick)
        event_free(r.tick);
    kvr_indexer_free(r.x);
    event_base_free(r.base);
    kvr_log(KVR_LOG_INFO, "indexer stopped");
    return 0;
}

int kvr_cmd_indexer(int argc, char **argv)
{
    indexer_args_t a;
    memset(&a, 0, sizeof a);
    a.port = 8090;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter indexer", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc == 0 && a.workers_text != NULL && !a.have_block_size)
        rc = kvr_cli_fail(&c, "--block-size is required with --workers");
    if (rc == 0 && a.workers_text != NULL)
        rc = parse_workers(&c, &a);
    if (rc == 0 && a.peers_text != NULL)
        rc = parse_peers(&c, &a);
    if (rc == 0) {
        a.cfg.port = (uint16_t)a.port;
        rc = run(&a);
    } else if (rc == 1) {
        rc = 0;
    }
    free(a.workers);
    free(a.peers_text);
    return rc;
}
