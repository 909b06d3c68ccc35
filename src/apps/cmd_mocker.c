/*
 * cmd_mocker.c: `kvrouter mocker`, a simulated inference engine started like `vllm serve`, so
 * scripts can swap one for the other: the same flags (--port, --host, --model or a positional
 * model, --served-model-name, --block-size, --num-gpu-blocks[-override], --max-num-seqs,
 * --max-num-batched-tokens, --max-model-len, --data-parallel-size, --kv-events-config JSON,
 * --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill, --seed), plus the simulation's
 * own (--speedup, --event-format, timing polynomials, --max-waiting, --vocab-size, fault
 * injection). Every value is checked at start-up; a bad one stops it naming the flag.
 * Prints "listening HOST:PORT" on stdout once it serves (port 0 picks a free one).
 * Invariants: nothing serves until every flag is checked and the mocker is made; a signal stops
 * the loop and everything is freed in reverse order. Ownership: the event base, the ZeroMQ
 * context, the NATS registration and the mocker (mocker/mocker.h, its one header) are this
 * command's. Threads: the loop on main, plus ZeroMQ's and NATS's own. Cost: start-up only;
 * serving costs are the mocker's.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <zmq.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "kvrouter/router.h"
#include "cluster/cluster.h"
#include "nats/nats_link.h"
#include "kvrouter.h"
#include "base/log.h"
#include "mocker/mocker.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: kvrouter mocker [MODEL] [options]\n\n"
        "A simulated vLLM engine: paged KV cache with prefix caching, continuous batching,\n"
        "a timing model, KV events over ZeroMQ, an OpenAI-compatible HTTP API.\n\n"
        "vLLM-compatible options (defaults in brackets):\n"
        "  --host H                      HTTP bind address [0.0.0.0]\n"
        "  --port P                      HTTP port, 0 = any free port [8000]\n"
        "  --model NAME                  served model name (also positional) [kvrouter-mocker]\n"
        "  --served-model-name NAME      overrides --model for the API\n"
        "  --lora-modules NAME[=PATH],.. LoRA adapters served (repeatable; the path is not\n"
        "                                read): listed in /v1/models with the model as\n"
        "                                parent, taken as a request's model, their blocks\n"
        "                                their own, their KV events naming them\n"
        "  --enable-lora                 accepted (vLLM needs it with --lora-modules)\n"
        "  --block-size N                tokens per KV block [16]\n"
        "  --num-gpu-blocks N            KV blocks per rank (alias --num-gpu-blocks-override) "
        "[16384]\n"
        "  --max-num-seqs N              requests in a batch [256]\n"
        "  --max-num-batched-tokens N    tokens per step [8192]\n"
        "  --max-model-len N             prompt + output limit [num-gpu-blocks x block-size]\n"
        "  --data-parallel-size N        ranks, each with its own engine and event ports [1]\n"
        "  --kv-events-config JSON       vLLM's KVEventsConfig, e.g.\n"
        "      '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\n"
        "        \"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\"}'\n"
        "  --[no-]enable-prefix-caching  [on]\n"
        "  --[no-]enable-chunked-prefill [on]\n"
        "  --seed N                      generated tokens depend on it [0]\n"
        "  --tokenizer DIR               tokenize text and chats with DIR's tokenizer.json and\n"
        "                                chat template, as vLLM does [a toy tokenizer]\n"
        "  --token-data use|ignore       a request's nvext.token_data: its ids are the\n"
        "                                prompt (Dynamo's backends), or it is ignored and\n"
        "                                the text or chat tokenized here (vLLM) [use]\n"
        "Simulation options:\n"
        "  --speedup X                   the engine's clock: modelled times are divided by X\n"
        "                                (alias --speedup-ratio) [1]; sim and replay scale\n"
        "                                the arrivals with --rate-scale\n"
        "  --event-format array|map      vLLM's positional (< 0.26) or map encoding [array]\n"
        "  --prefill-poly A,B,C          prefill ms = A T^2 + B T + C, T new tokens\n"
        "                                [4.209989e-07,1.518344e-02,16.50142]\n"
        "  --decode-poly D,E,F           decode ms = D u^2 + E u + F, u = KV usage "
        "[-25.74,54.01,5.74]\n"
        "  --decode-min-ms X             floor of a decode step [1]\n"
        "  --max-waiting N               waiting-queue cap; beyond it 503 [65536]\n"
        "  --vocab-size N                generated ids are below it [32000]\n"
        "  --kv-events-drop-every N      fault injection: every Nth batch is lost (replayable)\n"
        "  --kv-events-fault F           silent fault injection: none | wrong (stored events\n"
        "                                name other tokens) | drop (events never sent) [none];\n"
        "                                POST /debug/kv_events_fault?mode=F changes it live\n"
        "  --log-level L                 debug | info | warn | error [info]\n");
    fputs(
        "Disaggregated prefill/decode:\n"
        "  --role prefill|decode|both    what this worker does [both]: a prefill worker keeps a\n"
        "                                prompt's KV until its decode worker reads it; a decode\n"
        "                                worker reads it, stores it and decodes without prefill\n"
        "  --kv-transfer pull|bootstrap  vLLM's kv_transfer_params (pull) or SGLang's bootstrap\n"
        "                                room [pull]\n"
        "  --bootstrap-port P            prefill + bootstrap: the bootstrap server's port, 0 =\n"
        "                                a free one (printed) [0]\n"
        "  --kv-host H                   the address decode workers reach this one at\n"
        "                                (remote_host) [127.0.0.1]\n"
        "  --kv-bytes-per-block N        modelled KV bytes of one block [2097152]\n"
        "  --kv-transfer-gbps X          modelled transfer bandwidth, Gbit/s [100]\n"
        "  --kv-hold-timeout S           held KV nobody reads is freed after S s [30]\n"
        "  --kv-wait-timeout S           a bootstrap read waits S s for its prefill [30]\n"
        "  --kv-load-failure fail|recompute  a decode worker's failed read [fail]\n"
        "  --kv-transfer-fault none|bad-params|bad-port  fault injection (prefill, pull): the\n"
        "                                answer's kv_transfer_params are a string, or name a\n"
        "                                port nobody listens on [none]\n\n",
        out);
    fputs(
        "Discovery (routers started with --discovery nats find it):\n"
        "  --nats-url URL                register in <namespace>_workers while running\n"
        "  --worker-id N                 its worker id there [the HTTP port]\n"
        "  --advertise-host H            the host routers reach it at [--host, or 127.0.0.1\n"
        "                                for 0.0.0.0]\n"
        "  --namespace NS                the fleet's namespace [kvrouter]\n"
        "  --nats-presence-ttl-ms MS     routers drop it when not refreshed this long [3000]\n"
        KVR_CLI_NATS_AUTH_USAGE,
        out);
}

typedef struct mocker_args {
    kvr_mocker_config_t cfg;
    kvr_cli_nats_t nats;  /* --nats-url: registers itself for discovery */
    uint64_t worker_id;   /* its id in the discovery entry */
    char advertise[256];  /* the host routers reach it at */
    kvr_log_level_t log_level;
    bool served_name_set, positional_seen;
} mocker_args_t;

static const char *const EVENT_FORMATS[] = {"array", "map"};
static const char *const ROLES[] = {"both", "prefill", "decode"};
static const char *const TRANSFERS[] = {"pull", "bootstrap"};
static const char *const LOAD_FAILURES[] = {"fail", "recompute"};
static const char *const KV_FAULTS[] = {"none", "bad-params", "bad-port"};

/* The disaggregation options; -1 when the option is not one of them. */
static int parse_disagg(kvr_cli_t *c, kvr_mocker_config_t *m)
{
    size_t k;
    int rc;
    uint32_t v;
    if (kvr_cli_is(c, "--role")) {
        if ((rc = kvr_cli_choice(c, kvr_cli_value(c), ROLES, 3, &k)) == 0)
            m->role = (kvr_mocker_role_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-transfer")) {
        if ((rc = kvr_cli_choice(c, kvr_cli_value(c), TRANSFERS, 2, &k)) == 0)
            m->kv_transfer = (kvr_mocker_kvt_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-load-failure")) {
        if ((rc = kvr_cli_choice(c, kvr_cli_value(c), LOAD_FAILURES, 2, &k)) == 0)
            m->kv_load_recompute = k == 1;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-transfer-fault")) {
        if ((rc = kvr_cli_choice(c, kvr_cli_value(c), KV_FAULTS, 3, &k)) == 0)
            m->kv_fault = (uint32_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--bootstrap-port")) {
        if ((rc = kvr_cli_u32(c, kvr_cli_value(c), 0, 65535, &v)) == 0)
            m->bootstrap_port = (uint16_t)v;
        return rc;
    }
    if (kvr_cli_is(c, "--tokenizer"))
        return kvr_cli_copy(c, kvr_cli_value(c), m->tokenizer, sizeof m->tokenizer);
    if (kvr_cli_is(c, "--token-data")) {
        static const char *const TOKEN_DATA[] = {"use", "ignore"};
        if ((rc = kvr_cli_choice(c, kvr_cli_value(c), TOKEN_DATA, 2, &k)) == 0)
            m->ignore_token_data = k == 1;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-host"))
        return kvr_cli_copy(c, kvr_cli_value(c), m->kv_host, sizeof m->kv_host);
    if (kvr_cli_is(c, "--kv-bytes-per-block"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_MAX / 8, &m->kv_bytes_per_block);
    if (kvr_cli_is(c, "--kv-transfer-gbps"))
        return kvr_cli_pos(c, kvr_cli_value(c), &m->kv_transfer_gbps);
    if (kvr_cli_is(c, "--kv-hold-timeout"))
        return kvr_cli_pos(c, kvr_cli_value(c), &m->kv_hold_timeout_s);
    if (kvr_cli_is(c, "--kv-wait-timeout"))
        return kvr_cli_pos(c, kvr_cli_value(c), &m->kv_wait_timeout_s);
    return -1;
}

/* --lora-modules NAME[=PATH][,NAME[=PATH]...]: the names, appended to list (';'-separated). */
static int add_loras(const kvr_cli_t *c, const char *v, char *list, size_t cap)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    for (const char *p = v; *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t n = comma ? (size_t)(comma - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        size_t name = eq ? (size_t)(eq - p) : n;
        size_t used = strlen(list);
        if (name == 0 || memchr(p, ';', name) != NULL || used + name + 2 > cap)
            return kvr_cli_bad(c, v, "NAME[=PATH] entries, names without ';', 1023 bytes in all");
        if (used > 0)
            list[used++] = ';';
        memcpy(list + used, p, name);
        list[used + name] = '\0';
        p += n + (comma ? 1 : 0);
    }
    return 0;
}

/* --model NAME or a positional model: ignored (but checked) once --served-model-name is set. */
static int set_model(kvr_cli_t *c, const char *v, mocker_args_t *a)
{
    char ignored[sizeof a->cfg.model];
    if (a->served_name_set)
        return kvr_cli_copy(c, v, ignored, sizeof ignored);
    return kvr_cli_copy(c, v, a->cfg.model, sizeof a->cfg.model);
}

/* One argument at c->argv[c->i] (kvr_cli_option_fn): the positional model, the engine's
 * flags (cli.h), the mocker's own. */
static int parse_option(kvr_cli_t *c, void *arg)
{
    mocker_args_t *a = arg;
    kvr_mocker_config_t *m = &a->cfg;
    kvr_engine_config_t *e = &m->engine;
    const char *word = c->argv[c->i];
    if (word[0] != '-') {
        c->flag = "MODEL";
        if (a->positional_seen)
            return kvr_cli_bad(c, word, "only one positional model is accepted");
        a->positional_seen = true;
        return set_model(c, word, a);
    }
    int rc = kvr_cli_engine_option(c, e);
    if (rc != -1)
        return rc;
    if ((rc = kvr_cli_nats_option(c, &a->nats)) != -1)
        return rc;
    if (kvr_cli_is(c, "--worker-id"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->worker_id);
    if (kvr_cli_is(c, "--advertise-host"))
        return kvr_cli_copy(c, kvr_cli_value(c), a->advertise, sizeof a->advertise);
    if (kvr_cli_is(c, "--host"))
        return kvr_cli_copy(c, kvr_cli_value(c), m->host, sizeof m->host);
    if (kvr_cli_is(c, "--port")) {
        uint32_t v;
        rc = kvr_cli_u32(c, kvr_cli_value(c), 0, 65535, &v);
        if (rc == 0)
            m->port = (uint16_t)v;
        return rc;
    }
    if (kvr_cli_is(c, "--model"))
        return set_model(c, kvr_cli_value(c), a);
    if (kvr_cli_is(c, "--served-model-name")) {
        a->served_name_set = true;
        return kvr_cli_copy(c, kvr_cli_value(c), m->model, sizeof m->model);
    }
    if (kvr_cli_is(c, "--lora-modules"))
        return add_loras(c, kvr_cli_value(c), m->loras, sizeof m->loras);
    if (strcmp(c->argv[c->i], "--enable-lora") == 0)
        return 0;
    if (kvr_cli_is(c, "--data-parallel-size") || kvr_cli_is(c, "-dp"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &m->dp_size);
    if (kvr_cli_is(c, "--vocab-size"))
        return kvr_cli_u32(c, kvr_cli_value(c), 257, UINT32_MAX, &e->vocab_size);
    if (kvr_cli_is(c, "--kv-events-fault")) {
        size_t k;
        rc = kvr_cli_choice(c, kvr_cli_value(c), KVR_MOCKER_EVFAULT_NAMES, 3, &k);
        if (rc == 0)
            m->kv_events_fault = (kvr_mocker_evfault_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-events-drop-every"))
        return kvr_cli_u32(c, kvr_cli_value(c), 2, UINT32_MAX, &m->drop_batches_every);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT32_MAX, &e->seed);
    if (kvr_cli_is(c, "--speedup") || kvr_cli_is(c, "--speedup-ratio"))
        return kvr_cli_pos(c, kvr_cli_value(c), &m->speedup);
    if (kvr_cli_is(c, "--event-format")) {
        size_t k;
        rc = kvr_cli_choice(c, kvr_cli_value(c), EVENT_FORMATS, 2, &k);
        if (rc == 0)
            m->event_format = k == 0 ? KVR_KV_FMT_VLLM_ARRAY : KVR_KV_FMT_VLLM_MAP;
        return rc;
    }
    if (kvr_cli_is(c, "--kv-events-config")) {
        const char *v = kvr_cli_value(c);
        char err[300];
        if (v == NULL)
            return kvr_cli_bad(c, v, "a value is required");
        if (kvr_kv_events_config_parse(v, &m->events, err, sizeof err) != KVR_OK)
            return kvr_cli_fail(c, "--kv-events-config: %s", err);
        return 0;
    }
    if ((rc = parse_disagg(c, m)) != -1)
        return rc;
    if (kvr_cli_is(c, "--log-level")) {
        int level;
        rc = kvr_cli_log_level(c, kvr_cli_value(c), &level);
        if (rc == 0)
            a->log_level = (kvr_log_level_t)level;
        return rc;
    }
    return -1;
}

static int parse_args(int argc, char **argv, mocker_args_t *a)
{
    memset(a, 0, sizeof *a);
    kvr_mocker_config_default(&a->cfg);
    kvr_cli_nats_defaults(&a->nats);
    a->log_level = KVR_LOG_INFO;
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter mocker", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, a, usage);
    if (rc != 0)
        return rc;
    char err[300];
    if (kvr_mocker_config_validate(&a->cfg, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "%s", err);
    return 0;
}

/* endpoint with its "*" (any interface) replaced by the advertised host. */
static void reachable(char *out, size_t cap, const char *endpoint, const char *host)
{
    const char *star = strstr(endpoint, "://*");
    if (star == NULL)
        snprintf(out, cap, "%s", endpoint);
    else
        snprintf(out, cap, "%.*s://%s%s", (int)(star - endpoint), endpoint, host, star + 4);
}

/* --nats-url: this mocker's discovery entry, kept until it stops. NULL when not asked for (or
 * on failure, reported). */
static kvr_nats_t *register_self(mocker_args_t *a, kvr_mocker_t *m, int *failed)
{
    *failed = 0;
    if (a->nats.url[0] == '\0')
        return NULL;
    const kvr_mocker_config_t *c = &a->cfg;
    const char *host = a->advertise[0] ? a->advertise
                       : (strcmp(c->host, "0.0.0.0") == 0 || c->host[0] == '\0') ? "127.0.0.1"
                                                                                : c->host;
    kvr_worker_spec_t w = {.worker_id = a->worker_id ? a->worker_id : kvr_mocker_port(m),
                           .dp_size = c->dp_size,
                           .block_size = c->engine.block_size,
                           .total_kv_blocks = c->engine.num_gpu_blocks,
                           .max_num_batched_tokens = c->engine.max_num_batched_tokens};
    snprintf(w.url, sizeof w.url, "http://%.200s:%u", host, kvr_mocker_port(m));
    snprintf(w.model, sizeof w.model, "%s", c->model);
    snprintf(w.loras, sizeof w.loras, "%s", c->loras);
    w.role = c->role == KVR_MOCKER_PREFILL  ? KVR_ROLE_PREFILL
             : c->role == KVR_MOCKER_DECODE ? KVR_ROLE_DECODE
                                            : KVR_ROLE_BOTH;
    if (kvr_mocker_bootstrap_port(m) != 0) {
        w.bootstrap_port = kvr_mocker_bootstrap_port(m);
        snprintf(w.bootstrap_host, sizeof w.bootstrap_host, "%s", host);
    }
    if (c->events.enabled) {
        reachable(w.events, sizeof w.events, c->events.endpoint, host);
        reachable(w.replay, sizeof w.replay, c->events.replay_endpoint, host);
    }
    char err[300] = "";
    int st;
    kvr_nats_config_t nc = {.url = a->nats.url, .name = "kvrouter mocker",
                            .auth = kvr_cli_nats_auth(&a->nats)};
    kvr_nats_t *n = kvr_nats_new(&nc, &st, err, sizeof err);
    if (n != NULL && (st = kvr_discovery_register(n, a->nats.ns, a->nats.ttl_ms, &w)) != KVR_OK) {
        snprintf(err, sizeof err, "discovery entry: %s", kvr_strerror(st));
        kvr_nats_free(n);
        n = NULL;
    }
    if (n == NULL) {
        fprintf(stderr, "kvrouter mocker: %s\n", err[0] ? err : kvr_strerror(st));
        *failed = 1;
        return NULL;
    }
    kvr_log(KVR_LOG_INFO, "mocker: registered as worker %llu in %s_workers",
            (unsigned long long)w.worker_id, a->nats.ns);
    return n;
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
    event_base_loopbreak(arg);
}

static struct event_base *new_base(void)
{
    /* precise timers: at --speedup 1000 a decode step lasts a few microseconds */
    struct event_config *ec = event_config_new();
    if (ec) {
        event_config_set_flag(ec, EVENT_BASE_FLAG_PRECISE_TIMER);
        event_config_set_flag(ec, EVENT_BASE_FLAG_EPOLL_USE_CHANGELIST);
    }
    struct event_base *b = ec ? event_base_new_with_config(ec) : event_base_new();
    if (ec)
        event_config_free(ec);
    return b;
}

int kvr_cmd_mocker(int argc, char **argv)
{
    mocker_args_t a;
    int rc = parse_args(argc, argv, &a);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    kvr_log_set_level(a.log_level);
    signal(SIGPIPE, SIG_IGN);
    struct event_base *base = new_base();
    void *zctx = zmq_ctx_new();
    if (!base || !zctx) {
        fprintf(stderr, "kvrouter mocker: out of memory\n");
        return 1;
    }
    int st;
    char err[300] = "";
    kvr_mocker_t *m = kvr_mocker_new(base, zctx, &a.cfg, &st, err, sizeof err);
    struct event *sigint = NULL, *sigterm = NULL;
    kvr_nats_t *nats = NULL;
    int nats_failed = 0;
    if (m)
        nats = register_self(&a, m, &nats_failed);
    if (m && !nats_failed) {
        sigint = evsignal_new(base, SIGINT, on_signal, base);
        sigterm = evsignal_new(base, SIGTERM, on_signal, base);
        if (sigint)
            event_add(sigint, NULL);
        if (sigterm)
            event_add(sigterm, NULL);
        const kvr_engine_config_t *e = &a.cfg.engine;
        kvr_log(KVR_LOG_INFO,
                "mocker %s on http://%s:%u: %u rank(s) x %u blocks x %u tokens, max_num_seqs %u, "
                "max_num_batched_tokens %u, speedup %g, kv events %s%s",
                a.cfg.model, a.cfg.host, kvr_mocker_port(m), a.cfg.dp_size, e->num_gpu_blocks,
                e->block_size, e->max_num_seqs, e->max_num_batched_tokens, a.cfg.speedup,
                a.cfg.events.enabled ? a.cfg.events.endpoint : "off",
                a.cfg.events.enabled && a.cfg.events.replay_endpoint[0] ? " (replay on)" : "");
        printf("listening %s:%u\n", a.cfg.host, kvr_mocker_port(m));
        if (kvr_mocker_bootstrap_port(m) != 0) /* after: launchers read "listening" first */
            printf("bootstrap %s:%u\n", a.cfg.host, kvr_mocker_bootstrap_port(m));
        fflush(stdout);
        event_base_dispatch(base);
    } else {
        fprintf(stderr, "kvrouter mocker: %s\n", err[0] ? err : kvr_strerror(st));
    }
    if (sigint)
        event_free(sigint);
    if (sigterm)
        event_free(sigterm);
    int code = m && !nats_failed ? 0 : 1;
    kvr_nats_free(nats); /* deletes its discovery entry */
    kvr_mocker_free(m);
    event_base_free(base);
    zmq_ctx_term(zctx);
    return code;
}
