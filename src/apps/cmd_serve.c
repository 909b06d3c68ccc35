/*
 * cmd_serve.c: `kvrouter serve`, the router daemon. Reads the configuration (defaults, then
 * --config FILE, then KVR_* environment variables, then flags; the later wins), validates it
 * (a bad value stops start-up naming the field), then wires the parts together: the prefix
 * index, the ingest thread (KV events over ZeroMQ), the router core, the HTTP API and the
 * OpenAI front end (a KV-aware proxy to the workers' urls) on one event loop. SIGINT / SIGTERM
 * stop it cleanly.
 */
#include <event2/event.h>
#include <event2/thread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/apps.h"
#include "base/file.h"
#include "apps/cli.h"
#include "kvrouter/config.h"
#include "kvrouter/router.h"
#include "api/api.h"
#include "base/log.h"
#include "base/secret.h"
#include "cluster/cluster.h"
#include "core/endpoint.h"
#include "kvrouter/sched.h"
#include "events/ingest.h"
#include "fleet/fleet.h"
#include "frontend/frontend.h"
#include "http/http.h"
#include "indexer/indexer.h"
#include "ui/ui.h"

extern char **environ;

#define MAX_CLI_WORKERS 1024

typedef struct serve_args {
    kvr_router_config_t cfg;
    kvr_worker_spec_t *workers;
    size_t n_workers;
    const char *config_file;
    kvr_log_level_t log_level;
    char derived[512]; /* kvr_config_resolve's note, logged at start */
    char notes[4096];  /* the reference's names read, ignored or not read: logged at start */
} serve_args_t;

/* One line of a->notes (dropped past its room: the first ones are the ones that matter). */
static void add_note(void *arg, const char *line)
{
    serve_args_t *a = arg;
    size_t n = strlen(a->notes);
    if (n + strlen(line) + 2 < sizeof a->notes)
        snprintf(a->notes + n, sizeof a->notes - n, "%s\n", line);
}

/* A boolean flag given alone ("--router-replica-sync", then another flag or nothing). */
static bool bare_flag(const kvr_cli_t *c, const char *setting)
{
    if (c->eq != NULL || !kvr_config_is_bool(setting))
        return false;
    return c->i + 1 >= c->argc || strncmp(c->argv[c->i + 1], "--", 2) == 0;
}

/* --help (all: --help-all): the flags of serve itself, then the settings by group. */
static void usage(FILE *out, bool all)
{
    fprintf(out,
            "usage: kvrouter serve [--worker SPEC]... [--config FILE] [--SETTING VALUE]...\n"
            "\n"
            "The router: KV events in, routing decisions and an OpenAI-compatible front end\n"
            "out, over HTTP on loopback by default.\n"
            "\n"
            "Workers:\n"
            "  --worker SPEC                 one engine (repeatable): comma-separated key=value,\n"
            "                                only id required, e.g.\n"
            "      id=1,url=http://127.0.0.1:8001,events=tcp://127.0.0.1:5557\n"
            "                                keys: id (or worker_id) N; url URL (its HTTP API);\n"
            "                                events ZMQ-ENDPOINT (KV events); replay\n"
            "                                ZMQ-ENDPOINT (their replay socket); dp_size N,\n"
            "                                dp_start N (data-parallel ranks); model NAME;\n"
            "                                loras A;B; taints A;B; role prefill|decode|both;\n"
            "                                block_size N; total_kv_blocks N (or num_blocks);\n"
            "                                max_num_batched_tokens N; eagle true|false;\n"
            "                                bootstrap_host HOST, bootstrap_port N (SGLang\n"
            "                                disaggregation); tokenizer DIR\n"
            "  --tokenizer MODEL=DIR         tokenize MODEL's prompts in the router, from DIR's\n"
            "                                tokenizer.json and tokenizer_config.json\n"
            "                                (repeatable; adds to --tokenizers)\n"
            "  --config FILE                 `setting = value` lines, read before the flags\n"
            "  --log-level LEVEL             debug | info | warn | error [info]\n"
            "  --port N                      the same as --http-port (the flag of every\n"
            "                                command's listening port)\n"
            "  --help, --help-all            the common settings, or all of them\n"
            "\n"
            "Every setting below is also read from KVR_<SETTING> (e.g. KVR_BLOCK_SIZE=64) and\n"
            "from --config's `setting_name = value` lines; defaults in brackets.\n");
    size_t need = kvr_config_help(NULL, 0, all);
    char *help = malloc(need + 1);
    if (help != NULL) {
        kvr_config_help(help, need + 1, all);
        fputs(help, out);
        free(help);
    }
}

static void usage_common(FILE *out) { usage(out, false); }

/* --help-all anywhere: every group of settings. */
static bool wants_help_all(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help-all") == 0)
            return true;
    return false;
}

/* The config file goes first, whatever its position. */
static int read_config_file(kvr_cli_t *c, serve_args_t *a)
{
    for (c->i = 1; c->i < c->argc; c->i++) {
        const char *v;
        if (kvr_cli_is(c, "--config") && (v = kvr_cli_value(c)) != NULL)
            a->config_file = v;
    }
    if (a->config_file == NULL)
        return 0;
    char *text, err[300];
    size_t len;
    int frc = kvr_file_read(a->config_file, (size_t)1 << 24, &text, &len);
    if (frc != KVR_OK)
        return kvr_cli_fail(c, "cannot read config file '%s': %s", a->config_file,
                            frc == KVR_ETOOBIG ? "over 16 MiB" : kvr_strerror(frc));
    int rc = kvr_config_from_text(&a->cfg, text, len, err, sizeof err);
    free(text);
    if (rc != KVR_OK)
        return kvr_cli_fail(c, "%s: %s", a->config_file, err);
    return 0;
}

/* --tokenizer MODEL=DIR: appended to the tokenizers setting (checked with it, at the end). */
static int add_tokenizer(kvr_cli_t *c, serve_args_t *a, const char *v)
{
    char *t = a->cfg.tokenizers;
    size_t used = strlen(t), need = strlen(v) + (used > 0);
    if (strchr(v, ',') != NULL)
        return kvr_cli_bad(c, v, "one MODEL=DIR a flag (no comma)");
    if (used + need >= sizeof a->cfg.tokenizers)
        return kvr_cli_fail(c, "--tokenizer: the tokenizers setting is full (%zu bytes)",
                            sizeof a->cfg.tokenizers - 1);
    if (used > 0)
        t[used++] = ',';
    memcpy(t + used, v, strlen(v) + 1);
    return 0;
}

/* An error naming settings, as the user types them: their flags (kvr_config_spell_flags). */
static const char *as_flags(const char *err, char *buf, size_t cap)
{
    kvr_config_spell_flags(err, buf, cap);
    return buf;
}

/* One "--name value" or "--name=value" at c->argv[c->i] (kvr_cli_option_fn). */
static int parse_flag(kvr_cli_t *c, void *arg)
{
    serve_args_t *a = arg;
    char name[96], err[300];
    if (!kvr_cli_setting(c, name, sizeof name))
        return -1;
    char buf[96], note[300];
    /* --port: the listening port's flag in every command (mocker, indexer, serve) */
    const char *setting = strcmp(name, "--port") == 0 ? "http_port" : name;
    kvr_config_ref_t ref = {KVR_REF_NONE, NULL, NULL, NULL};
    if (strcmp(setting, "http_port") != 0 && !kvr_config_has(name) &&
        strcmp(name, "--config") != 0 &&
        strcmp(name, "--log-level") != 0 && strcmp(name, "--worker") != 0 &&
        strcmp(name, "--tokenizer") != 0)
        ref = kvr_config_ref_flag(name, buf, sizeof buf);
    if (ref.kind == KVR_REF_REFUSED)
        return kvr_cli_fail(c, "%s is the reference router's flag; not supported here: %s", name,
                            ref.why);
    if (ref.kind == KVR_REF_IGNORED) {
        snprintf(note, sizeof note, "%s (the reference's): accepted, no effect here: %s", name,
                 ref.why);
        add_note(a, note);
        if (c->eq == NULL && c->i + 1 < c->argc && strncmp(c->argv[c->i + 1], "--", 2) != 0)
            c->i++; /* its value */
        return 0;
    }
    if (ref.kind == KVR_REF_SETTING) {
        setting = ref.setting;
        snprintf(note, sizeof note, "reference name %s read as %s%s%s", name, ref.setting,
                 ref.value ? " = " : "", ref.value ? ref.value : "");
        add_note(a, note);
    }
    if (ref.value != NULL && c->eq != NULL)
        return kvr_cli_bad(c, c->eq, "this flag takes no value");
    const char *v = ref.value != NULL          ? ref.value
                    : bare_flag(c, setting) ? "true"
                                            : kvr_cli_value(c);
    if (v == NULL)
        return kvr_cli_bad(c, v, "a value is required");
    if (strcmp(name, "--config") == 0)
        return 0;
    const char *vnote = kvr_config_ref_value_note(setting, v);
    if (vnote != NULL)
        add_note(a, vnote);
    if (strcmp(name, "--log-level") == 0) {
        int level;
        int rc = kvr_cli_log_level(c, v, &level);
        if (rc == 0)
            a->log_level = (kvr_log_level_t)level;
        return rc;
    }
    if (strcmp(name, "--worker") == 0) {
        if (a->n_workers == MAX_CLI_WORKERS)
            return kvr_cli_fail(c, "more than %d --worker flags", MAX_CLI_WORKERS);
        if (kvr_worker_spec_parse(v, &a->workers[a->n_workers], err, sizeof err) != KVR_OK)
            return kvr_cli_bad(c, v, err);
        a->n_workers++;
        return 0;
    }
    if (strcmp(name, "--tokenizer") == 0) /* repeatable: one more MODEL=DIR of tokenizers */
        return add_tokenizer(c, a, v);
    int rc = kvr_config_set(&a->cfg, setting, v, err, sizeof err);
    if (rc == KVR_ENOTFOUND)
        return kvr_cli_fail(c, "%s; `kvrouter serve --help` lists the settings", err);
    if (rc != KVR_OK)
        return kvr_cli_fail(c, "%s", as_flags(err, note, sizeof note));
    return 0;
}

/* "kvrouter serve: <err>" on stderr, the settings it names spelt as flags. */
static void serve_fail(const char *err)
{
    char buf[600];
    fprintf(stderr, "kvrouter serve: %s\n", as_flags(err, buf, sizeof buf));
}

/* 0 to run, 1 after --help, 2 on a usage error. */
static int parse_args(int argc, char **argv, serve_args_t *a)
{
    char err[300];
    kvr_config_defaults(&a->cfg);
    a->log_level = KVR_LOG_INFO;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter serve", argc, argv);
    if (wants_help_all(argc, argv)) {
        usage(stdout, true);
        return 1;
    }
    if (read_config_file(&c, a) != 0)
        return 2;
    /* the reference's DYN_* variables, then ours (KVR_*: they win), then the flags */
    if (kvr_config_from_ref_env(&a->cfg, environ, add_note, a, err, sizeof err) != KVR_OK ||
        kvr_config_from_env(&a->cfg, environ, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "%s", err);
    int rc = kvr_cli_parse(&c, parse_flag, a, usage_common);
    if (rc != 0)
        return rc;
    kvr_config_resolve(&a->cfg, a->derived, sizeof a->derived);
    char spelt[400];
    if (kvr_config_validate(&a->cfg, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "%s", as_flags(err, spelt, sizeof spelt));
    return 0;
}

typedef struct daemon_parts {
    struct event_base *base;
    kvr_index_t *ix;
    kvr_ingest_t *g;
    kvr_router_t *r;
    kvr_sched_t *sched;
    kvr_http_host_t *host;
    kvr_fleet_t *fleet;
    kvr_api_t *api;
    kvr_frontend_t *fe;
    kvr_ui_t *ui;
    kvr_cluster_t *cluster;
    kvr_ix_serve_t *ixs;  /* serve_indexer */
    kvr_remote_ix_t *rix; /* remote_indexer */
    struct event *sigint, *sigterm;
    struct event *drain;  /* watches the answers in flight while draining */
    uint64_t drain_deadline_ms, grace_ms;
    bool draining, stopping;
    const kvr_router_config_t *cfg; /* the settings (the caller's, for the loop's life) */
} daemon_parts_t;

/* The end: the front end answers what is still in flight (503, or an error event ending a
 * stream); the loop runs 200 ms more to write it out. */
static void stop_now(daemon_parts_t *d, const char *why)
{
    if (d->stopping)
        return;
    d->stopping = true;
    kvr_log(KVR_LOG_INFO, "shutting down: %s", why);
    if (d->fe != NULL)
        kvr_frontend_close(d->fe);
    struct timeval tv = {0, 200000};
    event_base_loopexit(d->base, &tv);
}

static void on_drain_tick(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    daemon_parts_t *d = arg;
    uint64_t busy = kvr_http_host_busy(d->host);
    if (busy == 0)
        stop_now(d, "every answer in flight is complete");
    else if (kvr_now_ms() >= d->drain_deadline_ms)
        stop_now(d, "shutdown_grace_ms is over; ending the answers still in flight");
}

/* The first SIGTERM or SIGINT drains: the listeners close, idle connections too, and the
 * answers in flight (streams) get shutdown_grace_ms to finish. A second signal ends them. */
static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    (void)what;
    daemon_parts_t *d = arg;
    if (d->draining) {
        stop_now(d, sig == SIGINT ? "second SIGINT" : "second signal");
        return;
    }
    d->draining = true;
    uint64_t grace = d->grace_ms;
    kvr_log(KVR_LOG_INFO,
            "signal %d: draining (no new connections; %llu answers in flight get up to %llu "
            "ms; a second signal ends them at once)",
            (int)sig, (unsigned long long)kvr_http_host_busy(d->host),
            (unsigned long long)grace);
    kvr_http_host_drain(d->host);
    d->drain_deadline_ms = kvr_now_ms() + grace;
    struct timeval tv = {0, 20000};
    if (grace == 0 || d->drain == NULL || event_add(d->drain, &tv) != 0)
        stop_now(d, "no grace period");
    else
        on_drain_tick(-1, 0, d);
}

static void teardown(daemon_parts_t *d)
{
    if (d->drain)
        event_free(d->drain);
    if (d->sigint)
        event_free(d->sigint);
    if (d->sigterm)
        event_free(d->sigterm);
    /* freeing them restored the default action: a later signal must not cut the orderly end
     * short (the ingest thread, the NATS entry) and turn exit 0 into death by signal */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    kvr_ui_free(d->ui);
    kvr_cluster_free(d->cluster); /* sync's last batch, the presence entry, the link */
    kvr_ix_serve_free(d->ixs);
    kvr_remote_ix_free(d->rix); /* before the scheduler: its lookups end without a callback */
    kvr_frontend_free(d->fe); /* before the host: it answers what is in flight */
    kvr_api_free(d->api);      /* before the host: it watches its queued clients' connections */
    kvr_http_host_free(d->host);
    kvr_fleet_free(d->fleet);
    kvr_sched_free(d->sched); /* after both front doors: they hold tickets and handles */
    kvr_ingest_free(d->g);
    kvr_router_free(d->r);
    kvr_index_free(d->ix);
    if (d->base)
        event_base_free(d->base);
}

/* The state file is this router's alone (PATH.lock held until exit; a crash releases it):
 * a second router on the same path, or a path that is not absent or a regular file (a FIFO
 * would block the read, a link would be written through), stops the start: the operator must
 * fix the configuration, and starting cold would let the save at exit overwrite another
 * router's file or a link's target. */
static int claim_state(kvr_ingest_t *g, const char *path)
{
    char err[600] = "";
    int rc = kvr_ingest_claim_state_file(g, path, err, sizeof err);
    if (rc != KVR_OK)
        serve_fail(err[0] ? err : kvr_strerror(rc));
    return rc;
}

/* Warm restart: a missing file is a cold start; a bad one is refused whole (named in the
 * log) and the router starts cold rather than not at all. */
static void load_state(kvr_ingest_t *g, const char *path)
{
    char err[400] = "";
    kvr_ingest_snap_report_t rep;
    uint64_t t0 = kvr_now_ms();
    int rc = kvr_ingest_load(g, path, &rep, err, sizeof err);
    if (rc == KVR_ENOTFOUND)
        kvr_log(KVR_LOG_INFO, "state_file %s: none yet, starting cold", path);
    else if (rc != KVR_OK)
        kvr_log(KVR_LOG_WARN, "%s; starting cold", err);
    else
        kvr_log(KVR_LOG_INFO,
                "state_file %s: %u ranks resumed (%u skipped), %llu events reloaded (%llu "
                "refused), %llu bytes in %llu ms; each resumed rank is confirmed from its "
                "engine's replay buffer",
                path, rep.ranks, rep.ranks_skipped, (unsigned long long)rep.events,
                (unsigned long long)rep.events_failed, (unsigned long long)rep.bytes,
                (unsigned long long)(kvr_now_ms() - t0));
}

/* The index is as it will start (a peer's, else the state file's, else cold): the ingest
 * thread starts, and the router is listed among the replicas, now that it can answer a
 * joining one. */
static int index_ready(daemon_parts_t *d, bool from_peer)
{
    const kvr_router_config_t *c = d->cfg;
    if (!from_peer && d->g != NULL && c->state_file[0] != '\0')
        load_state(d->g, c->state_file);
    if (!from_peer && d->g != NULL)
        kvr_fleet_set_index_origin(d->fleet, c->state_file[0] != '\0'
                                                    ? "state_file (or cold if it had none)"
                                                    : "cold: only events received since start");
    kvr_fleet_set_index_loading(d->fleet, false);
    int st;
    if (d->g != NULL && (st = kvr_ingest_start(d->g)) != KVR_OK) {
        fprintf(stderr, "kvrouter serve: ingest: %s\n", kvr_strerror(st));
        return st;
    }
    if ((st = kvr_cluster_announce(d->cluster)) != KVR_OK) {
        fprintf(stderr, "kvrouter serve: replicas: %s\n", kvr_strerror(st));
        return st;
    }
    return KVR_OK;
}

/* A peer's snapshot was applied (loaded), or none came: the start goes on. */
static void on_index_from_peer(void *arg, bool loaded)
{
    daemon_parts_t *d = arg;
    if (index_ready(d, loaded) != KVR_OK)
        stop_now(d, "the index could not start");
}

static void save_state(kvr_ingest_t *g, const char *path)
{
    char err[400] = "";
    kvr_ingest_snap_report_t rep;
    uint64_t t0 = kvr_now_ms();
    if (kvr_ingest_save(g, path, &rep, err, sizeof err) != KVR_OK)
        kvr_log(KVR_LOG_ERROR, "%s", err);
    else
        kvr_log(rep.ranks_lost > 0 ? KVR_LOG_WARN : KVR_LOG_INFO,
                "state_file %s: %u exact ranks saved (%u of them with their engine unreachable "
                "now; %u not exact, left out); %u ranks kept as loaded at start (their engine "
                "has not confirmed them), %u dropped (their engine refused them), %u lost; "
                "%llu events, %llu bytes in %llu ms",
                path, rep.ranks, rep.ranks_unreachable, rep.ranks_skipped, rep.ranks_kept,
                rep.ranks_stale, rep.ranks_lost, (unsigned long long)rep.events,
                (unsigned long long)rep.bytes, (unsigned long long)(kvr_now_ms() - t0));
}

static int build(daemon_parts_t *d, const serve_args_t *a)
{
    const kvr_router_config_t *c = &a->cfg;
    char err[300] = "";
    int st = KVR_OK;
    evthread_use_pthreads();
    /* the changelist folds the per-request enable/disable of write events into one
     * epoll_ctl, which otherwise costs more than the routing decision itself */
    struct event_config *ec = event_config_new();
    if (ec != NULL)
        event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    d->base = ec != NULL ? event_base_new_with_config(ec) : event_base_new();
    if (ec != NULL)
        event_config_free(ec);
    if (d->base == NULL)
        return KVR_ENOMEM;
    bool kv = c->router_mode == KVR_MODE_KV, approx = c->router_mode == KVR_MODE_APPROX;
    if (kvr_config_uses_index(c)) {
        kvr_index_config_t ic = {.max_pairs = c->index_max_pairs,
                                 .max_workers = c->max_workers,
                                 .sync = approx ? KVR_SYNC_NONE : KVR_SYNC_RCU};
        if ((d->ix = kvr_index_new(&ic, &st)) == NULL) {
            fprintf(stderr, "kvrouter serve: index: %s\n", kvr_strerror(st));
            return st;
        }
    }
    if (kv && d->ix != NULL) {
        kvr_ingest_config_t gc = {.block_size = c->block_size, .max_ranks = c->max_workers};
        if ((d->g = kvr_ingest_new(d->ix, &gc, &st)) == NULL) {
            fprintf(stderr, "kvrouter serve: ingest: %s\n", kvr_strerror(st));
            return st;
        }
    }
    if ((d->r = kvr_router_new(c, d->ix, &st, err, sizeof err)) == NULL) {
        serve_fail(err);
        return st;
    }
    kvr_router_set_clock(d->r, kvr_now_ns); /* the decision timings of /metrics */
    kvr_sched_config_t sc;
    kvr_sched_config_from(&sc, c);
    const char *field;
    if ((d->sched = kvr_sched_new(d->r, &sc, &st, &field)) == NULL) {
        fprintf(stderr, "kvrouter serve: %s: %s\n", field ? field : "scheduler", kvr_strerror(st));
        return st;
    }
    if ((d->host = kvr_http_host_new(d->base, c, &st, err, sizeof err)) == NULL ||
        (d->fleet = kvr_fleet_new(d->base, d->sched, d->g, c, &st, err, sizeof err)) == NULL ||
        (d->api = kvr_api_new(d->host, d->fleet, c, &st, err, sizeof err)) == NULL) {
        serve_fail(err);
        return st;
    }
    if ((d->fe = kvr_frontend_new(d->base, d->host, d->fleet, c, &st, err, sizeof err)) == NULL) {
        serve_fail(err);
        return st;
    }
    if (c->serve_indexer && (d->ixs = kvr_ix_serve_new(d->host, d->fleet, d->ix, d->g, &st)) == NULL) {
        fprintf(stderr, "kvrouter serve: --serve-indexer: %s\n", kvr_strerror(st));
        return st;
    }
    for (size_t i = 0; i < a->n_workers; i++) {
        if ((st = kvr_fleet_add_worker(d->fleet, &a->workers[i], err, sizeof err)) != KVR_OK) {
            char spelt[600];
            fprintf(stderr, "kvrouter serve: --worker id=%llu: %s\n",
                    (unsigned long long)a->workers[i].worker_id, as_flags(err, spelt, sizeof spelt));
            return st;
        }
    }
    kvr_cluster_config_t cc = {.base = d->base, .host = d->host, .fleet = d->fleet, .cfg = c};
    if ((d->cluster = kvr_cluster_new(&cc, &st, err, sizeof err)) == NULL) {
        serve_fail(err[0] ? err : kvr_strerror(st));
        return st;
    }
    /* the live view last: its first reading sees every service's families */
    kvr_ui_config_t uc = {.loop = d->base, .host = d->host, .fleet = d->fleet, .cfg = c};
    if ((d->ui = kvr_ui_new(&uc, &st, err, sizeof err)) == NULL) {
        serve_fail(err);
        return st;
    }
    kvr_nats_t *nats = kvr_cluster_nats(d->cluster);
    if (d->ixs != NULL && nats != NULL &&
        (st = kvr_ix_serve_attach_nats(d->ixs, nats, c->nats_namespace)) != KVR_OK) {
        fprintf(stderr, "kvrouter serve: serve_indexer over NATS: %s\n", kvr_strerror(st));
        return st;
    }
    if (c->remote_indexer[0] != '\0') {
        char key[KVR_SECRET_MAX] = "", admin[KVR_SECRET_MAX] = "";
        if ((c->remote_indexer_key_file[0] != '\0' &&
             (st = kvr_secret_read("remote_indexer_key_file", c->remote_indexer_key_file, key,
                                   err, sizeof err)) != KVR_OK) ||
            (c->remote_indexer_admin_key_file[0] != '\0' &&
             (st = kvr_secret_read("remote_indexer_admin_key_file",
                                   c->remote_indexer_admin_key_file, admin, err, sizeof err)) !=
                 KVR_OK)) {
            serve_fail(err);
            return st;
        }
        kvr_remote_ix_config_t rc = {.base = d->base,
                                     .bearer = key,
                                     .record_bearer = admin[0] ? admin : key,
                                     .host = d->host,
                                     .sched = d->sched,
                                     .url = c->remote_indexer,
                                     .nats = nats,
                                     .ns = c->nats_namespace,
                                     .timeout_ms = c->remote_indexer_timeout_ms,
                                     .block_size = c->block_size,
                                     .record_decisions = approx};
        if ((d->rix = kvr_remote_ix_new(&rc, &st, err, sizeof err)) == NULL) {
            serve_fail(err[0] ? err : kvr_strerror(st));
            return st;
        }
    }
    if (d->g != NULL && c->state_file[0] != '\0' &&
        (st = claim_state(d->g, c->state_file)) != KVR_OK)
        return st;
    /* the index: a peer's (fresher; asked while serving cold), else the state file, else
     * cold */
    d->cfg = c;
    if (d->g != NULL &&
        kvr_cluster_load_index(d->cluster, d->g, on_index_from_peer, d) == KVR_OK) {
        kvr_fleet_set_index_loading(d->fleet, true);
        kvr_fleet_set_index_origin(d->fleet, "cold: a peer's snapshot is on its way");
    } else if ((st = index_ready(d, false)) != KVR_OK) {
        return st;
    }
    d->grace_ms = c->shutdown_grace_ms;
    d->drain = event_new(d->base, -1, EV_PERSIST, on_drain_tick, d);
    d->sigint = evsignal_new(d->base, SIGINT, on_signal, d);
    d->sigterm = evsignal_new(d->base, SIGTERM, on_signal, d);
    if (d->sigint == NULL || d->sigterm == NULL || event_add(d->sigint, NULL) != 0 ||
        event_add(d->sigterm, NULL) != 0)
        return KVR_ENOMEM;
    return KVR_OK;
}

int kvr_cmd_serve(int argc, char **argv)
{
    serve_args_t a = {0};
    a.workers = calloc(MAX_CLI_WORKERS, sizeof *a.workers);
    if (a.workers == NULL)
        return 1;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0) {
        free(a.workers);
        return rc == 1 ? 0 : rc;
    }
    kvr_log_set_level(a.log_level);
    for (char *line = a.notes, *end; *line != '\0'; line = end + 1) {
        end = strchr(line, '\n');
        if (end == NULL)
            break;
        bool warn = *line == '!'; /* a name not read: said as a warning */
        kvr_log(warn ? KVR_LOG_WARN : KVR_LOG_INFO, "%.*s", (int)(end - line - warn),
                line + warn);
    }
    for (char *line = a.derived, *end; *line != '\0'; line = end + 1) {
        end = strchr(line, '\n');
        if (end == NULL)
            break;
        kvr_log(KVR_LOG_INFO, "%.*s", (int)(end - line), line);
    }
    signal(SIGPIPE, SIG_IGN);
    daemon_parts_t d = {0};
    int st = build(&d, &a);
    if (st == KVR_OK) {
        kvr_log(KVR_LOG_INFO,
                "kvrouter serving on http://%s:%u (block size %u, mode %s, policy %s, %zu "
                "workers)",
                a.cfg.bind, kvr_http_host_port(d.host), a.cfg.block_size,
                kvr_config_mode_name(&a.cfg), kvr_config_policy_name(&a.cfg), a.n_workers);
        if (a.cfg.session_ttl_secs > 0)
            kvr_log(KVR_LOG_INFO,
                    "sticky sessions on (session_ttl_secs %llu): a request naming a session "
                    "(x-session-id, x-dynamo-session-id, nvext.session_control) prefers its "
                    "session's worker while it is healthy and not busy",
                    (unsigned long long)a.cfg.session_ttl_secs);
        /* a line scripts can wait for */
        printf("listening %s:%u\n", a.cfg.bind, kvr_http_host_port(d.host));
        if (a.cfg.admin_port.set) {
            kvr_log(KVR_LOG_INFO, "admin listener on http://%s:%u (fleet changes)",
                    a.cfg.admin_bind, kvr_http_host_admin_port(d.host));
            printf("admin listening %s:%u\n", a.cfg.admin_bind, kvr_http_host_admin_port(d.host));
        }
        fflush(stdout);
        event_base_dispatch(d.base);
        if (d.g != NULL && a.cfg.state_file[0] != '\0')
            save_state(d.g, a.cfg.state_file);
    }
    teardown(&d);
    free(a.workers);
    return st == KVR_OK ? 0 : 1;
}
