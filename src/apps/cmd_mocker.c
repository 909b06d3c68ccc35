/*
 * cmd_mocker.c: `kvrouter mocker`, a simulated inference engine started like `vllm serve`, so
 * scripts can swap one for the other: the same flags (--port, --host, --model or a positional
 * model, --served-model-name, --block-size, --num-gpu-blocks[-override], --max-num-seqs,
 * --max-num-batched-tokens, --max-model-len, --data-parallel-size, --kv-events-config JSON,
 * --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill, --seed), plus the simulation's
 * own (--speedup, --event-format, timing polynomials, --max-waiting, --vocab-size, fault
 * injection). Every value is checked at start-up; a bad one stops it naming the flag.
 * Prints "listening HOST:PORT" on stdout once it serves (port 0 picks a free one).
 */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>
#include <zmq.h>

#include "apps/apps.h"
#include "kvrouter.h"
#include "net/log.h"
#include "net/mocker_server.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter mocker [MODEL] [options]\n\n"
            "A simulated vLLM engine: paged KV cache with prefix caching, continuous batching,\n"
            "a timing model, KV events over ZeroMQ, an OpenAI-compatible HTTP API.\n\n"
            "vLLM-compatible options (defaults in brackets):\n"
            "  --host H                      HTTP bind address [0.0.0.0]\n"
            "  --port P                      HTTP port, 0 = any free port [8000]\n"
            "  --model NAME                  served model name (also positional) [kvrouter-mocker]\n"
            "  --served-model-name NAME      overrides --model for the API\n"
            "  --block-size N                tokens per KV block [16]\n"
            "  --num-gpu-blocks N            KV blocks per rank (alias --num-gpu-blocks-override) [16384]\n"
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
            "Simulation options:\n"
            "  --speedup X                   modelled times are divided by X (alias --speedup-ratio) [1]\n"
            "  --event-format array|map      vLLM's positional (< 0.26) or map encoding [array]\n"
            "  --prefill-poly A,B,C          prefill ms = A T^2 + B T + C, T new tokens\n"
            "                                [4.209989e-07,1.518344e-02,16.50142]\n"
            "  --decode-poly D,E,F           decode ms = D u^2 + E u + F, u = KV usage [-25.74,54.01,5.74]\n"
            "  --decode-min-ms X             floor of a decode step [1]\n"
            "  --max-waiting N               waiting-queue cap; beyond it 503 [65536]\n"
            "  --vocab-size N                generated ids are below it [32000]\n"
            "  --kv-events-drop-every N      fault injection: every Nth batch is lost (replayable)\n"
            "  --log-level L                 debug | info | warn | error [info]\n");
}

typedef struct parser {
    int argc;
    char **argv;
    int i;
    const char *flag; /* the current flag, for messages */
} parser_t;

static int bad_value(const char *flag, const char *v, const char *why)
{
    fprintf(stderr, "kvrouter mocker: %s %s: %s\n", flag, v ? v : "(missing)", why);
    return 2;
}

static int parse_u32(const char *flag, const char *v, uint32_t lo, uint32_t *out)
{
    if (!v || !*v)
        return bad_value(flag, v, "a value is required");
    errno = 0;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end || errno || v[0] == '-' || x > UINT32_MAX || x < lo) {
        char why[80];
        snprintf(why, sizeof why, "must be an integer in [%u, 4294967295]", lo);
        return bad_value(flag, v, why);
    }
    *out = (uint32_t)x;
    return 0;
}

static int parse_double(const char *flag, const char *v, double *out)
{
    if (!v || !*v)
        return bad_value(flag, v, "a value is required");
    char *end;
    double x = strtod(v, &end);
    if (*end || !isfinite(x))
        return bad_value(flag, v, "must be a finite number");
    *out = x;
    return 0;
}

static int parse_poly(const char *flag, const char *v, double *a, double *b, double *c)
{
    if (!v)
        return bad_value(flag, v, "a value is required");
    char *end;
    double x[3];
    const char *p = v;
    for (int k = 0; k < 3; k++) {
        x[k] = strtod(p, &end);
        if (end == p || !isfinite(x[k]) || (k < 2 && *end != ',') || (k == 2 && *end))
            return bad_value(flag, v, "must be three finite numbers A,B,C");
        p = end + 1;
    }
    *a = x[0];
    *b = x[1];
    *c = x[2];
    return 0;
}

/* --flag VALUE or --flag=VALUE; NULL when missing. */
static const char *take_value(parser_t *p, const char *eq)
{
    if (eq)
        return eq + 1;
    if (p->i + 1 < p->argc)
        return p->argv[++p->i];
    return NULL;
}

static bool is(const char *arg, const char *name, const char **eq)
{
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0)
        return false;
    if (arg[n] == '\0') {
        *eq = NULL;
        return true;
    }
    if (arg[n] == '=') {
        *eq = arg + n;
        return true;
    }
    return false;
}

static int copy_str(const char *flag, const char *v, char *out, size_t cap)
{
    if (!v || !*v)
        return bad_value(flag, v, "a value is required");
    if (strlen(v) >= cap)
        return bad_value(flag, v, "too long");
    snprintf(out, cap, "%s", v);
    return 0;
}

typedef struct mocker_args {
    kvr_mocker_config_t cfg;
    kvr_log_level_t log_level;
    bool served_name_set;
} mocker_args_t;

static int parse_log_level(const char *v, kvr_log_level_t *out)
{
    static const char *names[] = {"debug", "info", "warn", "error"};
    for (int k = 0; v && k < 4; k++)
        if (strcmp(v, names[k]) == 0) {
            *out = (kvr_log_level_t)k;
            return 0;
        }
    return bad_value("--log-level", v, "must be debug, info, warn or error");
}

/* One option at p->argv[p->i]: 0 handled, 2 error, -1 unknown. */
static int parse_option(parser_t *p, mocker_args_t *a)
{
    const char *arg = p->argv[p->i], *eq;
    kvr_mocker_config_t *c = &a->cfg;
    kvr_engine_config_t *e = &c->engine;
    if (is(arg, "--host", &eq))
        return copy_str("--host", take_value(p, eq), c->host, sizeof c->host);
    if (is(arg, "--port", &eq)) {
        uint32_t v;
        int rc = parse_u32("--port", take_value(p, eq), 0, &v);
        if (rc == 0 && v > 65535)
            return bad_value("--port", p->argv[p->i], "must be in [0, 65535]");
        c->port = (uint16_t)v;
        return rc;
    }
    if (is(arg, "--model", &eq))
        return a->served_name_set ? (take_value(p, eq) ? 0 : 2)
                                  : copy_str("--model", take_value(p, eq), c->model,
                                             sizeof c->model);
    if (is(arg, "--served-model-name", &eq)) {
        a->served_name_set = true;
        return copy_str("--served-model-name", take_value(p, eq), c->model, sizeof c->model);
    }
    if (is(arg, "--block-size", &eq))
        return parse_u32("--block-size", take_value(p, eq), 1, &e->block_size);
    if (is(arg, "--num-gpu-blocks", &eq) || is(arg, "--num-gpu-blocks-override", &eq))
        return parse_u32("--num-gpu-blocks", take_value(p, eq), 1, &e->num_gpu_blocks);
    if (is(arg, "--max-num-seqs", &eq))
        return parse_u32("--max-num-seqs", take_value(p, eq), 1, &e->max_num_seqs);
    if (is(arg, "--max-num-batched-tokens", &eq))
        return parse_u32("--max-num-batched-tokens", take_value(p, eq), 1,
                         &e->max_num_batched_tokens);
    if (is(arg, "--max-model-len", &eq))
        return parse_u32("--max-model-len", take_value(p, eq), 2, &e->max_model_len);
    if (is(arg, "--data-parallel-size", &eq) || is(arg, "-dp", &eq))
        return parse_u32("--data-parallel-size", take_value(p, eq), 1, &c->dp_size);
    if (is(arg, "--max-waiting", &eq))
        return parse_u32("--max-waiting", take_value(p, eq), 1, &e->max_waiting);
    if (is(arg, "--vocab-size", &eq))
        return parse_u32("--vocab-size", take_value(p, eq), 257, &e->vocab_size);
    if (is(arg, "--kv-events-drop-every", &eq))
        return parse_u32("--kv-events-drop-every", take_value(p, eq), 2,
                         &c->drop_batches_every);
    if (is(arg, "--seed", &eq)) {
        uint32_t v;
        int rc = parse_u32("--seed", take_value(p, eq), 0, &v);
        e->seed = v;
        return rc;
    }
    if (is(arg, "--speedup", &eq) || is(arg, "--speedup-ratio", &eq)) {
        int rc = parse_double("--speedup", take_value(p, eq), &c->speedup);
        if (rc == 0 && !(c->speedup > 0))
            return bad_value("--speedup", p->argv[p->i], "must be > 0");
        return rc;
    }
    if (is(arg, "--decode-min-ms", &eq))
        return parse_double("--decode-min-ms", take_value(p, eq), &e->timing.decode_min_ms);
    if (is(arg, "--prefill-poly", &eq))
        return parse_poly("--prefill-poly", take_value(p, eq), &e->timing.prefill_a,
                          &e->timing.prefill_b, &e->timing.prefill_c);
    if (is(arg, "--decode-poly", &eq))
        return parse_poly("--decode-poly", take_value(p, eq), &e->timing.decode_a,
                          &e->timing.decode_b, &e->timing.decode_c);
    if (is(arg, "--event-format", &eq)) {
        const char *v = take_value(p, eq);
        if (v && strcmp(v, "array") == 0)
            c->event_format = KVR_KV_FMT_VLLM_ARRAY;
        else if (v && strcmp(v, "map") == 0)
            c->event_format = KVR_KV_FMT_VLLM_MAP;
        else
            return bad_value("--event-format", v, "must be array or map");
        return 0;
    }
    if (is(arg, "--kv-events-config", &eq)) {
        const char *v = take_value(p, eq);
        char err[300];
        if (!v)
            return bad_value("--kv-events-config", v, "a value is required");
        if (kvr_kv_events_config_parse(v, &c->events, err, sizeof err) != KVR_OK) {
            fprintf(stderr, "kvrouter mocker: --kv-events-config: %s\n", err);
            return 2;
        }
        return 0;
    }
    if (strcmp(arg, "--enable-prefix-caching") == 0 || strcmp(arg, "--no-enable-prefix-caching") == 0) {
        e->enable_prefix_caching = arg[2] != 'n';
        return 0;
    }
    if (strcmp(arg, "--enable-chunked-prefill") == 0 || strcmp(arg, "--no-enable-chunked-prefill") == 0) {
        e->enable_chunked_prefill = arg[2] != 'n';
        return 0;
    }
    if (is(arg, "--log-level", &eq))
        return parse_log_level(take_value(p, eq), &a->log_level);
    return -1;
}

static int parse_args(int argc, char **argv, mocker_args_t *a)
{
    kvr_mocker_config_default(&a->cfg);
    a->log_level = KVR_LOG_INFO;
    parser_t p = {.argc = argc, .argv = argv};
    bool positional_seen = false;
    for (p.i = 1; p.i < argc; p.i++) {
        const char *arg = argv[p.i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            usage(stdout);
            return 1;
        }
        if (arg[0] != '-') {
            if (positional_seen)
                return bad_value("MODEL", arg, "only one positional model is accepted");
            positional_seen = true;
            if (!a->served_name_set &&
                copy_str("MODEL", arg, a->cfg.model, sizeof a->cfg.model) != 0)
                return 2;
            continue;
        }
        int rc = parse_option(&p, a);
        if (rc == -1) {
            fprintf(stderr, "kvrouter mocker: unknown option %s (see --help)\n", arg);
            return 2;
        }
        if (rc != 0)
            return rc;
    }
    char err[300];
    if (kvr_mocker_config_validate(&a->cfg, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter mocker: %s\n", err);
        return 2;
    }
    return 0;
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
    if (m) {
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
        fflush(stdout);
        event_base_dispatch(base);
    } else {
        fprintf(stderr, "kvrouter mocker: %s\n", err[0] ? err : kvr_strerror(st));
    }
    if (sigint)
        event_free(sigint);
    if (sigterm)
        event_free(sigterm);
    int code = m ? 0 : 1;
    kvr_mocker_free(m);
    event_base_free(base);
    zmq_ctx_term(zctx);
    return code;
}
