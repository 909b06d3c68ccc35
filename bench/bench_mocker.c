/*
 * bench_mocker.c: `kvrouter bench mocker`: how many simulated requests per second one
 * `kvrouter mocker` process serves on one CPU, and what that costs it. The target (the issue's):
 * one mocker sustains >= 2,000 requests/s of 1K-token prompts at --speedup 1000 on one core,
 * so that a 2-core machine can drive 8 mockers and a router at once.
 *
 * Setup (unless --url names a running mocker): the benchmark binds a ZeroMQ SUB socket on
 * tcp://127.0.0.1:P (an ephemeral port; P, P+1, ... with --data-parallel-size N among the
 * mocker's flags) and drains it on a thread, then fork + execs /proc/self/exe as
 *   kvrouter mocker --host 127.0.0.1 --port 0 --speedup S --log-level warn
 *     --kv-events-config '{"enable_kv_cache_events":true,"publisher":"zmq",
 *                          "endpoint":"tcp://127.0.0.1:P"}'  [--mocker-arg ... | -- ...]
 * so KV events are on as in production (no '*' in the endpoint: by vLLM's rule the mocker
 * connects to the benchmark's SUB, and nothing it publishes is lost to a slow joiner). The
 * child is pinned to --mocker-cpu (sched_setaffinity before exec; its ZeroMQ I/O thread
 * inherits the mask, so the whole process gets one core) and dies with the benchmark
 * (PR_SET_PDEATHSIG). The benchmark's own threads (client loops, SUB drain, ZeroMQ I/O,
 * the monitor) are pinned to the other CPUs when there are any. The child's stdout is a pipe:
 * its "listening HOST:PORT" line must come within 10 s, else a clear error (and the child's
 * own message on stderr when it exited). One mocker serves all the runs of a point (clients x
 * tokens); it is then stopped (SIGTERM, SIGKILL after 2 s) and reaped, on error paths too.
 *
 * Load: --clients keep-alive connections (libevent evhttp client, --threads event loops), a
 * closed loop as in bench_route.c: each client sends its next request from the previous one's
 * completion callback. Bodies, `{"prompt":[ids],"max_tokens":M,"stream":true,
 * "stream_options":{"include_usage":true}}` (or `"stream":false`) with --tokens ids < 32000,
 * are generated before timing from --seed and sent by reference: the first --prefix-share of
 * each prompt is one of 8 shared prefixes, the rest is unique to the body, and the pool is
 * large enough (up to 4096 bodies, 64 MB) that a body's own blocks are evicted from the
 * default 16384-block cache before it comes round again, so the prefix cache hits about
 * --prefix-share of the prompt (hit_rate, from /metrics, shows it). Every response is checked:
 * status 200; streamed: the SSE events are parsed as they arrive (evhttp_request_set_chunked_cb,
 * a byte scanner that keeps the first 2 KB of each event), each must be "data: ...", the usage
 * event's completion_tokens must be M, and the body must end with "data: [DONE]"; non-streamed:
 * a JSON body with "choices" and usage completion_tokens = M. Anything else is an error, counted
 * by kind; a run with more than 1% errors fails the benchmark (exit 1), as in bench route.
 *
 * A run: --warmup seconds (connections open, the cache fills), then --duration seconds
 * measured, then in-flight requests drain (not counted) so the mocker is idle between runs.
 * Client figures cover responses completing in the window: per_s, tokens_per_s (verified
 * completion tokens), whole-request latency p50/p99 (one CLOCK_MONOTONIC interval from just
 * before evhttp_make_request to the completion callback). The main thread samples the mocker
 * at the window's start and end: utime+stime from /proc/PID/stat (all its threads) ->
 * mocker_cores = CPU seconds / wall seconds (pinned, so <= 1 by construction: at 1.0 the
 * mocker is CPU-bound) and cpu_us_per_req = its CPU per completed request (the transferable
 * figure: 2,000/s on a core needs <= 500 us); a GET /metrics scrape ->
 * lag_per_s = growth of kvr_mocker_step_lag_seconds_total (summed over ranks) per second, the
 * real time by which steps overran their modelled time (0: the simulation keeps model time;
 * a CPU-bound mocker runs its steps back to back and lags), srv_per_s = growth of
 * vllm:request_success_total per second (cross-checks per_s), hit_rate and steps_per_s; and
 * the SUB's counters -> kv_batches_per_s, kv_mb_per_s (msgpack payload bytes) and kv_gaps
 * (sequence numbers skipped: the mocker's PUB dropped at its HWM, i.e. this drain lagged).
 * gen_cores is this process's own CPU in the window (getrusage): the generator's cost.
 * A row per run, then the median of the runs ("median"; errors and requests are totals).
 * target_per_s = 2000 where the issue sets it (1024 tokens, max_tokens 16, speedup 1000);
 * target = met when the median per_s reaches it.
 *
 * Generator cost (2-core EPYC VM; gen_cores includes the SUB drain, ZeroMQ's I/O thread and
 * the loopback receive path): ~60-100 us of CPU per streamed request (M = 16: 17 SSE events,
 * each its own TCP segment and wake-up), ~30 us per non-streamed one, so one loop thread
 * drives ~10,000 streamed or ~30,000 non-streamed requests/s, more than one mocker core
 * serves; a warning names the generator when it passes 0.9 cores. CPU figures come from
 * clock ticks (10 ms), so they are coarse below a few hundred requests per second.
 * With --url the mocker's CPU, the KV figures and the pinning are not available.
 *
 * Measured (that VM, shared with other work, defaults: 1024 tokens, M = 16, 64 clients,
 * --speedup 1000): streamed 1,405-1,453 requests/s, p50 44 ms, the mocker at 0.23-0.33 cores
 * (~165-225 us of CPU a request): each streamed response stalls ~40 ms on Nagle's algorithm
 * against the client's delayed ACK (the mocker's sockets had no TCP_NODELAY), so per_s is
 * clients / 44 ms (16 clients: 363/s; 128: 2,740-2,900/s) and the CPU is mostly idle.
 * Non-streamed: 11,500-16,000/s at 0.93 cores (60-80 us a request). Every run keeps <= 1 core,
 * hit_rate 0.50, no KV gap; lag_per_s is ~0.67 whenever the mocker is CPU-bound, even at 2
 * clients: at --speedup 1000 a step's CPU cost exceeds its modelled time (microseconds).
 *
 * Memory: bodies, samples and the child's bookkeeping are owned here and freed per point.
 * Threads: main (setup, the window's samples), one per client loop (owning its clients and
 * samples; they share only the run's atomics), the SUB drain thread (atomic counters), and
 * ZeroMQ's I/O thread.
 * Invariants: one mocker per point, stopped and reaped on every path; a run's verdict is the
 * load generator's (loadgen.h) plus "the mocker is alive". Cost: the generator's CPU is
 * reported (gen_cores); the probe and the /metrics scrapes use http/client.h outside the window.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_* macros, pipe2 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <zmq.h>

#include "apps/child.h"
#include "bench.h"
#include "loadgen.h"
#include "http/http.h"

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 6, 0},           {"run", KVR_BENCH_STR, 6, 0},
    {"clients", KVR_BENCH_INT, 7, 0},         {"tokens", KVR_BENCH_INT, 6, 0},
    {"max_tokens", KVR_BENCH_INT, 10, 0},     {"stream", KVR_BENCH_STR, 6, 0},
    {"requests", KVR_BENCH_INT, 8, 0},        {"per_s", KVR_BENCH_NUM, 6, 0},
    {"tokens_per_s", KVR_BENCH_NUM, 12, 0},   {"p50_ms", KVR_BENCH_NUM, 7, 2},
    {"p99_ms", KVR_BENCH_NUM, 7, 2},          {"mocker_cores", KVR_BENCH_NUM, 12, 2},
    {"cpu_us_per_req", KVR_BENCH_NUM, 14, 0}, {"lag_per_s", KVR_BENCH_NUM, 9, 3},
    {"srv_per_s", KVR_BENCH_NUM, 9, 0},       {"kv_batches_per_s", KVR_BENCH_NUM, 16, 0},
    {"kv_mb_per_s", KVR_BENCH_NUM, 11, 2},    {"errors", KVR_BENCH_INT, 6, 0},
    {"target_per_s", KVR_BENCH_NUM, 12, 0},   {"target", KVR_BENCH_STR, 6, 0},
    {"gen_cores", KVR_BENCH_NUM, 0, 2},       {"hit_rate", KVR_BENCH_NUM, 0, 3},
    {"steps_per_s", KVR_BENCH_NUM, 0, 0},     {"kv_gaps", KVR_BENCH_INT, 0, 0},
    {"events_per_req", KVR_BENCH_NUM, 0, 2},  {"concurrency", KVR_BENCH_NUM, 0, 1},
    {"error_kinds", KVR_BENCH_STR, 0, 0},     {"prefix_share", KVR_BENCH_NUM, 0, 2},
    {"duration_s", KVR_BENCH_NUM, 0, 3},      {"speedup", KVR_BENCH_NUM, 0, 3},
    {"mocker_cpu", KVR_BENCH_INT, 0, 0},      {"url", KVR_BENCH_STR, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

#define MK_VOCAB 32000
#define MK_N_PREFIXES 8
#define MK_MAX_BODIES 4096                 /* the pool, shared by the clients */
#define MK_BODY_BUDGET ((size_t)64 << 20)  /* all bodies of a point */
#define MK_PROBE_MS 2000                   /* TCP connect probe and /metrics scrape */
#define MK_METRICS_BYTES ((size_t)64 << 20) /* a /metrics answer at most */
#define MK_READY_MS 10000                  /* the child's "listening" line */
#define MK_TERM_MS 2000                    /* SIGTERM, then SIGKILL */
#define MK_TIMEOUT_S 5                     /* per request (and connect) */
#define MK_DRAIN_NS ((uint64_t)(MK_TIMEOUT_S + 1) * 1000000000u)
#define MK_RETRY_MS 1                      /* pause after a connection failure */
#define MK_TICK_MS 20
#define MK_FAIL_FRACTION 0.01
#define MK_ABORT_ERRORS 1000 /* errors (and 10 x the successes) that end a run early */
#define MK_EVENT_CAP 2048    /* bytes kept of one SSE event */
#define MK_MAX_DP 64
#define MK_SUB_HWM 1000000
#define MK_TARGET_PER_S 2000.0

/* The driver's own error kinds (loadgen.h has the HTTP and connection ones). */
enum {
    KIND_NO_DONE = -2,   /* stream without a final data: [DONE] */
    KIND_BAD_SSE = -3,   /* an event that is not "data: ...", or data after [DONE] */
    KIND_BAD_USAGE = -4, /* usage missing, or completion_tokens != max_tokens */
    KIND_BAD_BODY = -5,  /* non-streamed body without choices */
};

static const char *driver_kind(int code)
{
    switch (code) {
    case KIND_NO_DONE:
        return "no-[DONE]";
    case KIND_BAD_SSE:
        return "bad-sse";
    case KIND_BAD_USAGE:
        return "bad-usage";
    case KIND_BAD_BODY:
        return "bad-body";
    default:
        return "connect";
    }
}

/* ---- small helpers ---------------------------------------------------------------------- */

static const char *find_bytes(const char *s, size_t n, const char *pat)
{
    size_t m = strlen(pat);
    for (size_t i = 0; m <= n && i <= n - m; i++)
        if (s[i] == pat[0] && memcmp(s + i, pat, m) == 0)
            return s + i;
    return NULL;
}

/* The unsigned integer after `"key":` in s[0..n), or -1. */
static int64_t find_uint(const char *s, size_t n, const char *key)
{
    const char *p = find_bytes(s, n, key);
    if (p == NULL)
        return -1;
    p += strlen(key);
    const char *end = s + n;
    while (p < end && *p == ' ')
        p++;
    if (p >= end || *p < '0' || *p > '9')
        return -1;
    int64_t v = 0;
    while (p < end && *p >= '0' && *p <= '9' && v < ((int64_t)1 << 40))
        v = v * 10 + (*p++ - '0');
    return v;
}

/* ---- the target ------------------------------------------------------------------------- */

typedef kvr_http_target_t target_t; /* http/client.h */

/* http://host[:port] (the mocker serves at the root: no path). */
static bool parse_url(const char *url, target_t *t)
{
    char err[512];
    return kvr_http_target_parse(url, t, err, sizeof err) == KVR_OK && t->base_path[0] == '\0';
}

/* ---- /metrics and /proc ------------------------------------------------------------------ */

typedef struct metrics {
    bool ok;
    double lag_s, success, gen_tokens, prefix_q, prefix_h, published, steps;
} metrics_t;

static void metrics_line(const char *l, size_t n, metrics_t *m)
{
    static const struct {
        const char *name;
        size_t off;
    } WANT[] = {
        {"kvr_mocker_step_lag_seconds_total", offsetof(metrics_t, lag_s)},
        {"vllm:request_success_total", offsetof(metrics_t, success)},
        {"vllm:generation_tokens_total", offsetof(metrics_t, gen_tokens)},
        {"vllm:prefix_cache_queries_total", offsetof(metrics_t, prefix_q)},
        {"vllm:prefix_cache_hits_total", offsetof(metrics_t, prefix_h)},
        {"kvr_mocker_kv_event_batches_published_total", offsetof(metrics_t, published)},
        {"kvr_mocker_steps_total", offsetof(metrics_t, steps)},
    };
    if (n == 0 || l[0] == '#')
        return;
    size_t name_len = 0;
    while (name_len < n && l[name_len] != '{' && l[name_len] != ' ')
        name_len++;
    for (size_t k = 0; k < sizeof WANT / sizeof WANT[0]; k++) {
        if (strlen(WANT[k].name) != name_len || memcmp(l, WANT[k].name, name_len) != 0)
            continue;
        size_t v = name_len;
        if (v < n && l[v] == '{') { /* the value follows the labels' closing brace */
            size_t close = n;
            while (close > v && l[close - 1] != '}')
                close--;
            v = close;
        }
        char buf[64];
        size_t len = n - v < sizeof buf - 1 ? n - v : sizeof buf - 1;
        memcpy(buf, l + v, len);
        buf[len] = '\0';
        char *end;
        double x = strtod(buf, &end);
        if (end != buf && isfinite(x)) {
            *(double *)((char *)m + WANT[k].off) += x;
            if (k == 0)
                m->ok = true;
        }
        return;
    }
}

/* GET /metrics over a fresh connection (http/client.h): the counters summed over ranks. */
static bool scrape(target_t *t, metrics_t *m)
{
    memset(m, 0, sizeof *m);
    kvr_http_resp_t r = {0};
    char err[200];
    if (kvr_http_get(t, "/metrics", MK_PROBE_MS, MK_METRICS_BYTES, &r, err, sizeof err) !=
            KVR_OK || r.status != 200 || r.truncated) {
        kvr_http_resp_free(&r);
        return false;
    }
    for (const char *p = r.buf + r.body_at, *end = r.buf + r.len; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        metrics_line(p, n, m);
        p += n + 1;
    }
    kvr_http_resp_free(&r);
    return m->ok;
}

/* utime + stime of a process (all its threads), in seconds; NAN when unreadable. */
static double proc_cpu_s(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NAN;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return NAN;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (p == NULL)
        return NAN;
    /* after ')': state (3) ... utime (14), stime (15) */
    unsigned long long ut = 0, st = 0;
    int field = 2;
    for (const char *q = p + 1; *q && field < 15; q++) {
        if (*q != ' ')
            continue;
        field++;
        if (field == 14)
            ut = strtoull(q + 1, NULL, 10);
        else if (field == 15)
            st = strtoull(q + 1, NULL, 10);
    }
    if (field < 15)
        return NAN;
    return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static double self_cpu_s(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return NAN;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* ---- the KV-event SUB ------------------------------------------------------------------- */

typedef struct kvsub {
    void *ctx;
    void *socks[MK_MAX_DP];
    uint32_t n;
    int port; /* rank r's publisher connects to port + r */
    pthread_t th;
    bool running;
    atomic_bool stop;
    atomic_uint_fast64_t batches, bytes, gaps;
    uint64_t next_seq[MK_MAX_DP];
    bool seen[MK_MAX_DP];
} kvsub_t;

static void kvsub_close(kvsub_t *s)
{
    if (s->running) {
        atomic_store(&s->stop, true);
        pthread_join(s->th, NULL);
        s->running = false;
    }
    for (uint32_t i = 0; i < s->n; i++)
        if (s->socks[i])
            zmq_close(s->socks[i]);
    s->n = 0;
}

static void *kvsub_main(void *arg)
{
    kvsub_t *s = arg;
    zmq_pollitem_t items[MK_MAX_DP];
    for (uint32_t i = 0; i < s->n; i++)
        items[i] = (zmq_pollitem_t){.socket = s->socks[i], .events = ZMQ_POLLIN};
    zmq_msg_t f;
    zmq_msg_init(&f);
    while (!atomic_load(&s->stop)) {
        if (zmq_poll(items, (int)s->n, 100) <= 0)
            continue;
        for (uint32_t i = 0; i < s->n; i++) {
            if (!(items[i].revents & ZMQ_POLLIN))
                continue;
            /* every message waiting: [topic, seq u64 BE, payload] */
            for (int budget = 0; budget < 4096; budget++) {
                int frame = 0, more = 1;
                uint64_t seq = 0;
                size_t last = 0;
                bool has_seq = false;
                while (more) {
                    if (zmq_msg_recv(&f, s->socks[i], frame == 0 ? ZMQ_DONTWAIT : 0) < 0) {
                        more = -1;
                        break;
                    }
                    last = zmq_msg_size(&f);
                    if (frame == 1 && last == 8) {
                        const uint8_t *b = zmq_msg_data(&f);
                        for (int k = 0; k < 8; k++)
                            seq = seq << 8 | b[k];
                        has_seq = true;
                    }
                    more = zmq_msg_more(&f);
                    frame++;
                }
                if (more < 0)
                    break; /* nothing (more) waiting */
                atomic_fetch_add(&s->batches, 1);
                atomic_fetch_add(&s->bytes, last);
                if (has_seq) {
                    if (s->seen[i] && seq != s->next_seq[i])
                        atomic_fetch_add(&s->gaps, 1);
                    s->seen[i] = true;
                    s->next_seq[i] = seq + 1;
                }
            }
        }
    }
    zmq_msg_close(&f);
    return NULL;
}

static void *sub_socket(void *ctx)
{
    void *so = zmq_socket(ctx, ZMQ_SUB);
    if (so == NULL)
        return NULL;
    int linger = 0, hwm = MK_SUB_HWM;
    zmq_setsockopt(so, ZMQ_LINGER, &linger, sizeof linger);
    zmq_setsockopt(so, ZMQ_RCVHWM, &hwm, sizeof hwm);
    zmq_setsockopt(so, ZMQ_SUBSCRIBE, "", 0);
    return so;
}

/* Binds n SUB sockets on consecutive loopback ports and starts the drain thread. */
static bool kvsub_open(kvsub_t *s, void *ctx, uint32_t n)
{
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    atomic_init(&s->stop, false);
    atomic_init(&s->batches, 0);
    atomic_init(&s->bytes, 0);
    atomic_init(&s->gaps, 0);
    for (int attempt = 0; attempt < 50 && s->n < n; attempt++) {
        kvsub_close(s);
        void *so = sub_socket(ctx);
        if (so == NULL || zmq_bind(so, "tcp://127.0.0.1:*") != 0) {
            if (so)
                zmq_close(so);
            break;
        }
        char ep[128];
        size_t len = sizeof ep;
        zmq_getsockopt(so, ZMQ_LAST_ENDPOINT, ep, &len);
        const char *colon = strrchr(ep, ':');
        s->port = colon ? atoi(colon + 1) : 0;
        s->socks[s->n++] = so;
        while (s->port > 0 && s->n < n && s->port + (int)s->n <= 65535) {
            char addr[64];
            snprintf(addr, sizeof addr, "tcp://127.0.0.1:%d", s->port + (int)s->n);
            void *so2 = sub_socket(ctx);
            if (so2 == NULL)
                break;
            if (zmq_bind(so2, addr) != 0) {
                zmq_close(so2);
                break; /* taken: start again elsewhere */
            }
            s->socks[s->n++] = so2;
        }
    }
    if (s->n < n) {
        fprintf(stderr, "kvrouter bench mocker: cannot bind %u ZeroMQ SUB socket(s) on "
                        "127.0.0.1: %s\n", n, zmq_strerror(zmq_errno()));
        kvsub_close(s);
        return false;
    }
    if (pthread_create(&s->th, NULL, kvsub_main, s) != 0) {
        fprintf(stderr, "kvrouter bench mocker: cannot start the KV-event drain thread\n");
        kvsub_close(s);
        return false;
    }
    s->running = true;
    return true;
}

/* ---- the child -------------------------------------------------------------------------- */

typedef struct child {
    pid_t pid;
    int out_fd; /* its stdout */
} child_t;

static void describe_status(int status, char *buf, size_t len)
{
    if (WIFEXITED(status))
        snprintf(buf, len, "exit code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
    else
        snprintf(buf, len, "status %d", status);
}

/* Stops and reaps the child: SIGTERM, SIGKILL after MK_TERM_MS. */
static void child_stop(child_t *c)
{
    if (c->pid > 0) {
        int status = 0;
        pid_t r = waitpid(c->pid, &status, WNOHANG);
        if (r == 0) {
            kill(c->pid, SIGTERM);
            uint64_t deadline = kvr_bench_now_ns() + (uint64_t)MK_TERM_MS * 1000000u;
            while ((r = waitpid(c->pid, &status, WNOHANG)) == 0 &&
                   kvr_bench_now_ns() < deadline)
                kvr_bench_sleep_ns(5000000);
            if (r == 0) {
                fprintf(stderr, "kvrouter bench mocker: the mocker (pid %d) ignored SIGTERM "
                                "for %d ms; killing it\n", (int)c->pid, MK_TERM_MS);
                kill(c->pid, SIGKILL);
                while (waitpid(c->pid, &status, 0) < 0 && errno == EINTR)
                    ;
            } else if (r == c->pid && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
                char why[96];
                describe_status(status, why, sizeof why);
                fprintf(stderr, "kvrouter bench mocker: the mocker ended with %s\n", why);
            }
        }
        c->pid = 0;
    }
    if (c->out_fd >= 0)
        close(c->out_fd);
    c->out_fd = -1;
}

/* Whether the child is still running; if not, why into buf (and it is reaped). */
static bool child_alive(child_t *c, char *why, size_t len)
{
    int status;
    pid_t r = waitpid(c->pid, &status, WNOHANG);
    if (r == 0)
        return true;
    if (r == c->pid)
        describe_status(status, why, len);
    else
        snprintf(why, len, "waitpid: %s", strerror(errno));
    c->pid = 0;
    return false;
}

/* The mocker's argv; args[] must hold 16 + o->n_mocker_args entries. */
static void child_argv(const kvr_bench_opts_t *o, const char *speedup, const char *kvcfg,
                       char **args)
{
    size_t k = 0;
    const char *fixed[] = {"kvrouter", "mocker", "--host", "127.0.0.1", "--port", "0",
                           "--speedup", speedup, "--log-level", "warn", "--kv-events-config",
                           kvcfg};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        args[k++] = (char *)fixed[i];
    for (size_t i = 0; i < o->n_mocker_args; i++)
        args[k++] = (char *)o->mocker_args[i];
    args[k] = NULL;
}

/* fork + exec of the mocker pinned to cpu, publishing to kv_port; its HTTP port into
 * *port once it printed "listening HOST:PORT". false with a message printed. */
static bool child_start(const kvr_bench_opts_t *o, int kv_port, child_t *c, int *port)
{
    c->pid = 0;
    c->out_fd = -1;
    char speedup[64], kvcfg[256];
    snprintf(speedup, sizeof speedup, "%.17g", o->speedup);
    snprintf(kvcfg, sizeof kvcfg,
             "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\","
             "\"endpoint\":\"tcp://127.0.0.1:%d\"}", kv_port);
    char **args = calloc(16 + o->n_mocker_args, sizeof *args);
    int pfd[2];
    if (args == NULL || pipe2(pfd, O_CLOEXEC) != 0) {
        fprintf(stderr, "kvrouter bench mocker: cannot spawn the mocker: %s\n",
                args ? strerror(errno) : "out of memory");
        free(args);
        return false;
    }
    child_argv(o, speedup, kvcfg, args);
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(o->mocker_cpu, &one);
    pid_t parent = getpid();
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) { /* async-signal-safe calls only until exec */
        if (dup2(pfd[1], STDOUT_FILENO) < 0)
            _exit(127);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent)
            _exit(127);
        if (sched_setaffinity(0, sizeof one, &one) != 0)
            _exit(126);
        execv(kvr_child_self(), args);
        _exit(127);
    }
    int fork_err = errno;
    close(pfd[1]);
    free(args);
    if (pid < 0) {
        close(pfd[0]);
        fprintf(stderr, "kvrouter bench mocker: fork: %s\n", strerror(fork_err));
        return false;
    }
    c->pid = pid;
    c->out_fd = pfd[0];

    char line[512];
    size_t len = 0;
    uint64_t deadline = kvr_bench_now_ns() + (uint64_t)MK_READY_MS * 1000000u;
    char why[160] = "";
    for (;;) {
        char *nl = memchr(line, '\n', len);
        if (nl != NULL) {
            *nl = '\0';
            const char *colon = strrchr(line, ':');
            if (strncmp(line, "listening ", 10) == 0 && colon && atoi(colon + 1) > 0) {
                *port = atoi(colon + 1);
                return true;
            }
            snprintf(why, sizeof why, "printed '%.100s' instead of 'listening HOST:PORT'",
                     line);
            break;
        }
        uint64_t now = kvr_bench_now_ns();
        if (now >= deadline) {
            snprintf(why, sizeof why, "did not print 'listening HOST:PORT' within %d s",
                     MK_READY_MS / 1000);
            break;
        }
        struct pollfd p = {c->out_fd, POLLIN, 0};
        int left_ms = (int)((deadline - now) / 1000000u) + 1;
        int rc = poll(&p, 1, left_ms < 100 ? left_ms : 100);
        if (rc < 0 && errno != EINTR) {
            snprintf(why, sizeof why, "poll: %s", strerror(errno));
            break;
        }
        if (rc > 0) {
            ssize_t r = read(c->out_fd, line + len, sizeof line - 1 - len);
            if (r > 0) {
                len += (size_t)r;
                if (len == sizeof line - 1 && memchr(line, '\n', len) == NULL) {
                    snprintf(why, sizeof why, "printed a line too long to be 'listening'");
                    break;
                }
                continue;
            }
            if (r < 0 && errno == EINTR)
                continue;
        }
        char st[96];
        if (!child_alive(c, st, sizeof st)) {
            snprintf(why, sizeof why, "exited (%s) before it was ready; its own message, if "
                                      "any, is above", st);
            break;
        }
        if (rc > 0) { /* EOF on stdout while still running */
            snprintf(why, sizeof why, "closed its stdout before it was ready");
            break;
        }
    }
    fprintf(stderr, "kvrouter bench mocker: the mocker (/proc/self/exe mocker ..., pinned to "
                    "CPU %u) %s\n", o->mocker_cpu, why);
    child_stop(c);
    return false;
}

/* ---- bodies ----------------------------------------------------------------------------- */

static bool make_body(kvr_lg_body_t *b, const uint32_t *tok, size_t n, uint64_t max_tokens,
                      bool stream)
{
    static const char head[] = "{\"prompt\":[";
    char tail[160];
    snprintf(tail, sizeof tail, "],\"max_tokens\":%llu,%s}", (unsigned long long)max_tokens,
             stream ? "\"stream\":true,\"stream_options\":{\"include_usage\":true}"
                    : "\"stream\":false");
    size_t tl = strlen(tail);
    b->data = malloc(sizeof head + n * 11 + tl + 1);
    if (b->data == NULL)
        return false;
    char *p = b->data;
    memcpy(p, head, sizeof head - 1);
    p += sizeof head - 1;
    for (size_t i = 0; i < n; i++) {
        if (i)
            *p++ = ',';
        p = kvr_lg_put_u32(p, tok[i]);
    }
    memcpy(p, tail, tl);
    kvr_lg_body_done(b, p + tl);
    return true;
}

/* The pool's size: MK_MAX_BODIES within the budget, at least one per client. */
static size_t pool_size(uint64_t clients, uint64_t tokens)
{
    size_t one = (size_t)tokens * 6 + 128;
    size_t n = MK_BODY_BUDGET / one;
    if (n > MK_MAX_BODIES)
        n = MK_MAX_BODIES;
    return n < clients ? (size_t)clients : n;
}

static bool mk_body(kvr_lg_body_t *b, const uint32_t *tok, size_t n, void *arg)
{
    const kvr_bench_opts_t *o = arg;
    return make_body(b, tok, n, o->max_tokens, o->stream);
}

static kvr_lg_body_t *make_bodies(const kvr_bench_opts_t *o, uint64_t tokens, size_t n_bodies)
{
    return kvr_lg_make_bodies(o->seed ^ kvr_bench_mix64(tokens ^ 0x30c4e7u), tokens,
                              o->prefix_share, MK_N_PREFIXES, MK_VOCAB, n_bodies, mk_body,
                              (void *)o);
}

/* ---- SSE -------------------------------------------------------------------------------- */

typedef struct sse {
    char ev[MK_EVENT_CAP]; /* the current event's first bytes */
    size_t len;            /* bytes kept (<= MK_EVENT_CAP) */
    size_t seen;           /* bytes of the current event seen */
    bool prev_nl;          /* the last byte was '\n' */
    bool done;             /* data: [DONE] seen */
    bool bad;              /* an event that is not "data: ..." or data after [DONE] */
    uint32_t events;       /* data events, [DONE] excluded */
    int64_t usage;         /* completion_tokens of the usage event; -1 none */
} sse_t;

static void sse_reset(sse_t *s)
{
    s->len = s->seen = 0;
    s->prev_nl = s->done = s->bad = false;
    s->events = 0;
    s->usage = -1;
}

/* One complete event: ev[0..n) without its final "\n\n". */
static void sse_event(sse_t *s, const char *ev, size_t n, bool truncated)
{
    if (s->done || n < 6 || memcmp(ev, "data: ", 6) != 0) {
        s->bad = true;
        return;
    }
    if (n == 12 && memcmp(ev + 6, "[DONE]", 6) == 0) {
        s->done = true;
        return;
    }
    s->events++;
    if (truncated || find_bytes(ev, n, "\"usage\":{") == NULL)
        return;
    if (s->usage >= 0)
        s->bad = true;
    s->usage = find_uint(ev, n, "\"completion_tokens\":");
}

static void sse_feed(sse_t *s, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\n' && s->prev_nl) {
            bool trunc = s->seen > s->len;
            /* drop the first '\n' of the terminator */
            size_t len = trunc ? s->len : s->len - 1;
            sse_event(s, s->ev, len, trunc);
            s->len = s->seen = 0;
            s->prev_nl = false;
            continue;
        }
        if (s->len < MK_EVENT_CAP)
            s->ev[s->len++] = c;
        s->seen++;
        s->prev_nl = c == '\n';
    }
}

/* ---- the driver: POST /v1/completions, every answer verified ---------------------------- */

typedef struct mk_run {
    uint64_t max_tokens;
    bool stream;
} mk_run_t;

static void on_chunk(struct evhttp_request *req, void *arg)
{
    sse_t *sse = kvr_lg_state(arg);
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    const char *p = n ? (const char *)evbuffer_pullup(in, -1) : NULL;
    if (p != NULL)
        sse_feed(sse, p, n);
    evbuffer_drain(in, n);
}

static void mk_prepare(kvr_lg_client_t *c, struct evhttp_request *req)
{
    const mk_run_t *r = kvr_lg_arg(c);
    if (r->stream) {
        sse_reset(kvr_lg_state(c));
        evhttp_request_set_chunked_cb(req, on_chunk);
    }
}

/* KVR_LG_GOOD for a good response (its completion tokens and SSE events), else the kind. */
static int mk_check(kvr_lg_client_t *c, struct evhttp_request *req, uint64_t *tokens,
                    uint64_t *events)
{
    const mk_run_t *r = kvr_lg_arg(c);
    int code = evhttp_request_get_response_code(req);
    if (code != 200)
        return code;
    if (r->stream) {
        const sse_t *s = kvr_lg_state(c);
        if (s->bad || s->seen > 0)
            return KIND_BAD_SSE;
        if (!s->done)
            return KIND_NO_DONE;
        if (s->usage < 0 || (uint64_t)s->usage != r->max_tokens || s->events < 2)
            return KIND_BAD_USAGE;
        *tokens = (uint64_t)s->usage;
        *events = s->events;
        return KVR_LG_GOOD;
    }
    struct evbuffer *in = evhttp_request_get_input_buffer(req);
    size_t n = evbuffer_get_length(in);
    const char *p = n ? (const char *)evbuffer_pullup(in, -1) : NULL;
    if (p == NULL || p[0] != '{' || find_bytes(p, n, "\"choices\":[{") == NULL)
        return KIND_BAD_BODY;
    int64_t u = find_uint(p, n, "\"completion_tokens\":");
    if (u < 0 || (uint64_t)u != r->max_tokens)
        return KIND_BAD_USAGE;
    *tokens = (uint64_t)u;
    return KVR_LG_GOOD;
}

static const kvr_lg_driver_t MK_DRIVER = {
    .prepare = mk_prepare, .check = mk_check, .state_bytes = sizeof(sse_t)};

/* What the main thread samples at the window's edges. */
typedef struct sample {
    uint64_t ns;
    double mocker_cpu_s, self_cpu_s;
    uint64_t kv_batches, kv_bytes, kv_gaps;
    metrics_t m;
} sample_t;

static void take_sample(target_t *t, pid_t pid, kvsub_t *sub, sample_t *s)
{
    s->ns = kvr_bench_now_ns();
    s->mocker_cpu_s = pid > 0 ? proc_cpu_s(pid) : NAN;
    s->self_cpu_s = self_cpu_s();
    s->kv_batches = sub ? atomic_load(&sub->batches) : 0;
    s->kv_bytes = sub ? atomic_load(&sub->bytes) : 0;
    s->kv_gaps = sub ? atomic_load(&sub->gaps) : 0;
    if (!scrape(t, &s->m))
        s->m.ok = false;
}

typedef struct run_result {
    double per_s, tokens_per_s, p50_ms, p99_ms, concurrency, events_per_req;
    double mocker_cores, cpu_us_per_req, gen_cores, lag_per_s, srv_per_s, hit_rate;
    double steps_per_s, kv_batches_per_s, kv_mb_per_s;
    uint64_t ok, kv_gaps;
    double window_s;
    kvr_lg_errs_t errs;
    uint64_t stuck;
    bool aborted;
} run_result_t;

/* The server-side figures from the two samples. */
static void sample_figures(const sample_t *a, const sample_t *b, bool spawned,
                           run_result_t *res)
{
    double dt = (double)(b->ns - a->ns) / 1e9;
    double cpu = b->mocker_cpu_s - a->mocker_cpu_s;
    res->mocker_cores = cpu / dt;
    res->cpu_us_per_req = res->ok ? cpu * 1e6 / ((double)res->ok * dt / res->window_s) : NAN;
    res->gen_cores = (b->self_cpu_s - a->self_cpu_s) / dt;
    if (a->m.ok && b->m.ok) {
        res->lag_per_s = (b->m.lag_s - a->m.lag_s) / dt;
        res->srv_per_s = (b->m.success - a->m.success) / dt;
        res->steps_per_s = (b->m.steps - a->m.steps) / dt;
        double q = b->m.prefix_q - a->m.prefix_q;
        res->hit_rate = q > 0 ? (b->m.prefix_h - a->m.prefix_h) / q : NAN;
    } else {
        res->lag_per_s = res->srv_per_s = res->steps_per_s = res->hit_rate = NAN;
    }
    if (spawned) {
        res->kv_batches_per_s = (double)(b->kv_batches - a->kv_batches) / dt;
        res->kv_mb_per_s = (double)(b->kv_bytes - a->kv_bytes) / dt / 1e6;
        res->kv_gaps = b->kv_gaps - a->kv_gaps;
    } else {
        res->kv_batches_per_s = res->kv_mb_per_s = NAN;
    }
}

typedef struct point_env {
    target_t *t;
    pid_t pid;    /* the spawned mocker, 0 with --url */
    kvsub_t *sub; /* NULL with --url */
} point_env_t;

typedef struct window {
    const point_env_t *env;
    sample_t a, b;
} window_t;

static void at_window(void *arg, bool end)
{
    window_t *w = arg;
    take_sample(w->env->t, w->env->pid, w->env->sub, end ? &w->b : &w->a);
}

/* One run of one point. false on a setup failure (message printed). */
static bool run_once(const kvr_bench_opts_t *o, const point_env_t *env, size_t clients,
                     const kvr_lg_body_t *bodies, size_t n_bodies, run_result_t *res)
{
    memset(res, 0, sizeof *res);
    mk_run_t mr = {.max_tokens = o->max_tokens, .stream = o->stream};
    window_t w = {.env = env};
    kvr_lg_config_t cfg = {
        .drv = &MK_DRIVER,
        .drv_arg = &mr,
        .addr = env->t->addr,
        .host_hdr = env->t->host_hdr,
        .port = (uint16_t)env->t->port,
        .path = "/v1/completions",
        .clients = clients,
        .threads = o->threads,
        .bodies = bodies,
        .n_bodies = n_bodies,
        .warmup_s = o->warmup_s,
        .duration_s = o->duration_s,
        .timeout_s = MK_TIMEOUT_S,
        .tick_ms = MK_TICK_MS,
        .retry_ms = MK_RETRY_MS,
        .drain_ns = MK_DRAIN_NS,
        .abort_errors = MK_ABORT_ERRORS,
        .max_single_io = (size_t)4 << 20,
        .at_window = at_window,
        .window_arg = &w,
    };
    kvr_lg_result_t lg;
    if (!kvr_lg_run(&cfg, "kvrouter bench mocker", &lg))
        return false;
    kvr_bench_lat_t lat;
    kvr_bench_summarize(lg.ns, lg.n_ns, &lat);
    free(lg.ns);
    double window_s = o->duration_s;
    size_t n = lg.n_ns;
    res->aborted = lg.aborted;
    res->errs = lg.errs;
    res->stuck = lg.stuck;
    res->ok = n;
    res->window_s = window_s;
    res->p50_ms = lat.p50_us / 1e3;
    res->p99_ms = lat.p99_us / 1e3;
    res->per_s = lg.aborted ? NAN : (double)n / window_s;
    res->tokens_per_s = lg.aborted ? NAN : (double)lg.units / window_s;
    res->concurrency = lg.aborted ? NAN : lg.sum_ns / (window_s * 1e9);
    res->events_per_req = o->stream && n ? (double)lg.events / (double)n : NAN;
    sample_figures(&w.a, &w.b, env->sub != NULL, res);
    return true;
}

/* ---- points ----------------------------------------------------------------------------- */

static double target_per_s(const kvr_bench_opts_t *o, uint64_t tokens)
{
    bool spawned = !o->url_set;
    return spawned && tokens == 1024 && o->max_tokens == 16 && o->speedup == 1000.0
               ? MK_TARGET_PER_S : NAN;
}

enum { F_PER_S, F_TOK, F_P50, F_P99, F_CORES, F_CPU_REQ, F_GEN, F_LAG, F_SRV, F_HIT, F_STEPS,
       F_KVB, F_KVMB, F_EVREQ, F_CONC, F_COUNT };

static double fig_of(const run_result_t *r, int f)
{
    switch (f) {
    case F_PER_S: return r->per_s;
    case F_TOK: return r->tokens_per_s;
    case F_P50: return r->p50_ms;
    case F_P99: return r->p99_ms;
    case F_CORES: return r->mocker_cores;
    case F_CPU_REQ: return r->cpu_us_per_req;
    case F_GEN: return r->gen_cores;
    case F_LAG: return r->lag_per_s;
    case F_SRV: return r->srv_per_s;
    case F_HIT: return r->hit_rate;
    case F_STEPS: return r->steps_per_s;
    case F_KVB: return r->kv_batches_per_s;
    case F_KVMB: return r->kv_mb_per_s;
    case F_EVREQ: return r->events_per_req;
    default: return r->concurrency;
    }
}

static const char *const FIG_COL[F_COUNT] = {
    "per_s", "tokens_per_s", "p50_ms", "p99_ms", "mocker_cores", "cpu_us_per_req", "gen_cores",
    "lag_per_s", "srv_per_s", "hit_rate", "steps_per_s", "kv_batches_per_s", "kv_mb_per_s",
    "events_per_req", "concurrency"};

/* The median over runs of the finite values of figure f (NAN when none). */
static double median_fig(const run_result_t *rs, unsigned runs, int f)
{
    double v[64];
    size_t n = 0;
    for (unsigned i = 0; i < runs && n < 64; i++) {
        double x = fig_of(&rs[i], f);
        if (isfinite(x))
            v[n++] = x;
    }
    return kvr_bench_median(v, n);
}

static bool header_printed; /* the table's header, once the first point is set up */

static void print_row(const kvr_bench_opts_t *o, uint64_t clients, uint64_t tokens, const char *run,
                      const double *fig, uint64_t requests, uint64_t gaps,
                      const kvr_lg_errs_t *errs, bool with_target)
{
    if (!header_printed) {
        kvr_bench_print_header(o, COLS, N_COLS);
        header_printed = true;
    }
    kvr_bench_row_t row;
    kvr_bench_row_init(&row, COLS, N_COLS);
    kvr_bench_set_str(&row, "bench", "mocker");
    kvr_bench_set_str(&row, "run", run);
    kvr_bench_set_int(&row, "clients", (int64_t)clients);
    kvr_bench_set_int(&row, "tokens", (int64_t)tokens);
    kvr_bench_set_int(&row, "max_tokens", (int64_t)o->max_tokens);
    kvr_bench_set_str(&row, "stream", o->stream ? "true" : "false");
    kvr_bench_set_int(&row, "requests", (int64_t)requests);
    for (int f = 0; f < F_COUNT; f++)
        kvr_bench_set_num(&row, FIG_COL[f], fig[f]);
    kvr_bench_set_int(&row, "errors", (int64_t)errs->total);
    char kinds[1024];
    kvr_lg_errs_format(errs, NULL, driver_kind, kinds, sizeof kinds);
    kvr_bench_set_str(&row, "error_kinds", errs->total ? kinds : NULL);
    double target = target_per_s(o, tokens);
    kvr_bench_set_num(&row, "target_per_s", target);
    if (with_target && isfinite(target))
        kvr_bench_set_str(&row, "target", fig[F_PER_S] >= target ? "met" : "missed");
    if (!o->url_set) {
        kvr_bench_set_int(&row, "kv_gaps", (int64_t)gaps);
        kvr_bench_set_num(&row, "speedup", o->speedup);
        kvr_bench_set_int(&row, "mocker_cpu", o->mocker_cpu);
    } else {
        kvr_bench_set_str(&row, "url", o->url);
    }
    kvr_bench_set_num(&row, "prefix_share", o->prefix_share);
    kvr_bench_set_num(&row, "duration_s", o->duration_s);
    kvr_bench_print_row(o, &row);
}

/* The spawned mocker's --data-parallel-size (1 when not among the extra flags). */
static uint32_t mocker_dp(const kvr_bench_opts_t *o)
{
    uint32_t dp = 1;
    for (size_t i = 0; i < o->n_mocker_args; i++) {
        const char *a = o->mocker_args[i], *v = NULL;
        static const char *names[] = {"--data-parallel-size", "-dp"};
        for (int k = 0; k < 2; k++) {
            size_t n = strlen(names[k]);
            if (strncmp(a, names[k], n) == 0 && a[n] == '=')
                v = a + n + 1;
            else if (strcmp(a, names[k]) == 0 && i + 1 < o->n_mocker_args)
                v = o->mocker_args[i + 1];
        }
        if (v != NULL) {
            long x = strtol(v, NULL, 10);
            dp = x >= 1 && x <= MK_MAX_DP ? (uint32_t)x : 1;
        }
    }
    return dp;
}

static int one_point(const kvr_bench_opts_t *o, void *zctx, target_t *t, uint64_t clients,
                     uint64_t tokens)
{
    size_t n_bodies = pool_size(clients, tokens);
    kvr_lg_body_t *bodies = make_bodies(o, tokens, n_bodies);
    run_result_t *rs = calloc(o->runs, sizeof *rs);
    if (bodies == NULL || rs == NULL) {
        fprintf(stderr, "kvrouter bench mocker: out of memory for %zu bodies of %llu tokens\n",
                n_bodies, (unsigned long long)tokens);
        kvr_lg_free_bodies(bodies, n_bodies);
        free(rs);
        return 1;
    }
    int rc = 0;
    child_t child = {0, -1};
    kvsub_t *sub = NULL;
    point_env_t env = {t, 0, NULL};
    if (!o->url_set) {
        int port = 0;
        sub = calloc(1, sizeof *sub);
        if (sub == NULL || !kvsub_open(sub, zctx, mocker_dp(o))) {
            free(sub);
            sub = NULL;
            rc = 1;
        } else if (!child_start(o, sub->port, &child, &port)) {
            rc = 1;
        } else {
            snprintf(t->host, sizeof t->host, "127.0.0.1");
            snprintf(t->addr, sizeof t->addr, "127.0.0.1");
            snprintf(t->host_hdr, sizeof t->host_hdr, "127.0.0.1:%d", port);
            t->port = port;
            env.pid = child.pid;
            env.sub = sub;
        }
    }
    unsigned runs = 0;
    uint64_t ok_total = 0, gaps_total = 0, stuck = 0;
    kvr_lg_errs_t errs;
    memset(&errs, 0, sizeof errs);
    char why[256] = "";
    while (rc == 0 && runs < o->runs) {
        run_result_t *res = &rs[runs];
        if (!run_once(o, &env, (size_t)clients, bodies, n_bodies, res)) {
            rc = 1;
            break;
        }
        runs++;
        ok_total += res->ok;
        gaps_total += res->kv_gaps;
        stuck += res->stuck;
        kvr_lg_errs_merge(&errs, &res->errs);
        double fig[F_COUNT];
        for (int f = 0; f < F_COUNT; f++)
            fig[f] = fig_of(res, f);
        char name[16];
        snprintf(name, sizeof name, "%u", runs);
        print_row(o, clients, tokens, name, fig, res->ok, res->kv_gaps, &res->errs, false);
        kvr_lg_verdict_in_t v = {.run = runs, .aborted = res->aborted, .ok = res->ok,
                                 .errors = res->errs.total,
                                 .attempts = (double)(res->ok + res->errs.total),
                                 .window_s = res->window_s, .fail_fraction = MK_FAIL_FRACTION};
        char st[96];
        if (env.pid > 0 && !child_alive(&child, st, sizeof st)) {
            snprintf(why, sizeof why, "the mocker exited during run %u (%s)", runs, st);
            rc = 1;
        } else if (kvr_lg_run_failed(&v, why, sizeof why)) {
            rc = 1;
        }
    }
    if (runs > 0) {
        double fig[F_COUNT];
        for (int f = 0; f < F_COUNT; f++)
            fig[f] = median_fig(rs, runs, f);
        print_row(o, clients, tokens, "median", fig, ok_total, gaps_total, &errs, true);
    }
    if (errs.total) {
        char kinds[1024];
        kvr_lg_errs_format(&errs, NULL, driver_kind, kinds, sizeof kinds);
        fprintf(stderr, "kvrouter bench mocker: %llu errors (clients %llu, tokens %llu): %s\n",
                (unsigned long long)errs.total, (unsigned long long)clients,
                (unsigned long long)tokens, kinds);
    }
    if (gaps_total)
        fprintf(stderr, "kvrouter bench mocker: %llu KV-event sequence gaps: the mocker's PUB "
                        "dropped batches (the SUB drain fell behind)\n",
                (unsigned long long)gaps_total);
    kvr_lg_report_stuck("kvrouter bench mocker", stuck, MK_DRAIN_NS);
    for (unsigned i = 0; i < runs; i++)
        if (isfinite(rs[i].gen_cores) && rs[i].gen_cores > 0.9) {
            fprintf(stderr, "kvrouter bench mocker: the generator used %.2f cores in run %u: "
                            "it may be the bottleneck (more --threads, fewer --clients?)\n",
                    rs[i].gen_cores, i + 1);
            break;
        }
    if (why[0])
        fprintf(stderr, "kvrouter bench mocker: FAILED: %s\n", why);
    child_stop(&child);
    if (sub != NULL) {
        kvsub_close(sub);
        free(sub);
    }
    kvr_lg_free_bodies(bodies, n_bodies);
    free(rs);
    return rc;
}

void kvr_bench_mocker_usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter bench mocker [options] [-- MOCKER-FLAGS...]\n"
            "\n"
            "Requests per second one `kvrouter mocker` process serves on one CPU. The benchmark\n"
            "binds a ZeroMQ SUB on 127.0.0.1 and drains it, spawns `kvrouter mocker --host\n"
            "127.0.0.1 --port 0 --speedup S` with KV events on (connecting to that SUB) pinned\n"
            "to --mocker-cpu, pins its own threads to the other CPUs, and drives the mocker with\n"
            "closed-loop keep-alive HTTP clients: POST /v1/completions with a token-id prompt,\n"
            "max_tokens M, streamed with usage. Every response is checked (200; SSE events\n"
            "\"data: ...\" ending with \"data: [DONE]\"; usage completion_tokens = M).\n"
            "A row per run, then the median of the runs:\n"
            "  per_s            completed good requests per second\n"
            "  tokens_per_s     completion tokens per second (verified usage)\n"
            "  p50_ms p99_ms    whole-request latency\n"
            "  mocker_cores     the mocker's CPU (utime+stime, all threads) / wall time\n"
            "  cpu_us_per_req   the mocker's CPU per completed request (2,000/s on a core\n"
            "                   needs <= 500 us)\n"
            "  lag_per_s        growth of kvr_mocker_step_lag_seconds_total per second (0: the\n"
            "                   model's time is kept; a CPU-bound mocker runs late)\n"
            "  srv_per_s        growth of vllm:request_success_total per second (cross-check)\n"
            "  kv_batches_per_s, kv_mb_per_s   KV event batches and bytes the SUB received\n"
            "  target_per_s     2000 at 1024 tokens, max_tokens 16, --speedup 1000; target:\n"
            "                   met or missed by the median\n"
            "  --json adds gen_cores (this process's CPU), hit_rate (prefix cache, from\n"
            "  /metrics), steps_per_s, kv_gaps, events_per_req, concurrency, error_kinds\n"
            "\n"
            "options:\n"
            "  --clients N       keep-alive connections, one request each in flight; a list\n"
            "                    gives several points (64)\n"
            "  --tokens N        prompt tokens; a list (1024; K = 1024)\n"
            "  --max-tokens M    completion tokens per request (16)\n"
            "  --stream B        true: SSE responses; false: one JSON body (true)\n"
            "  --prefix-share F  fraction of each prompt taken from 8 shared prefixes (0.5)\n"
            "  --duration S      measured seconds per run (10)\n"
            "  --warmup S        unmeasured seconds before each run (2)\n"
            "  --runs N          runs per point; one mocker serves a point's runs (3)\n"
            "  --threads N       client event-loop threads (1)\n"
            "  --seed N          prompt PRNG seed (1)\n"
            "  --json            one JSON object per line: each run, then the median\n"
            "  --speedup X       the mocker's --speedup (1000); it also gets --log-level warn\n"
            "  --mocker-cpu N    the CPU the mocker is pinned to (0); this process uses the\n"
            "                    others (all of them on a 1-CPU machine)\n"
            "  --mocker-arg A    one more flag for the mocker, repeatable (e.g. --mocker-arg\n"
            "                    --max-num-seqs --mocker-arg 512); so is everything after --\n"
            "  --url URL         drive a running mocker instead (http://host:port): nothing is\n"
            "                    spawned or pinned; no CPU or KV figures\n"
            "A run fails (exit 1) when more than 1%% of its requests fail, the mocker exits, or\n"
            "it does not print 'listening HOST:PORT' within 10 s of its start.\n");
}

int kvr_bench_mocker(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_clients = {1, {64}};
    static const kvr_bench_list_t def_tokens = {1, {1024}};
    const kvr_bench_list_t *clients = kvr_bench_pick(&o->clients, &def_clients);
    const kvr_bench_list_t *tokens = kvr_bench_pick(&o->tokens, &def_tokens);
    target_t t;
    memset(&t, 0, sizeof t);
    if (o->url_set) {
        if (!parse_url(o->url, &t)) {
            fprintf(stderr, "kvrouter bench mocker: --url: '%s': expects http://host:port\n",
                    o->url);
            return 2;
        }
        int err;
        int fd = kvr_http_connect(&t, MK_PROBE_MS, &err);
        if (fd < 0) {
            fprintf(stderr, "kvrouter bench mocker: cannot connect to %s: %s; is the mocker "
                            "(kvrouter mocker) running?\n", o->url, strerror(err));
            return 1;
        }
        close(fd);
    }

    /* Pinning: the mocker gets --mocker-cpu, this process (and every thread it starts from
     * here on, ZeroMQ's I/O thread included) the rest. */
    cpu_set_t allowed, gen;
    bool pinned = false;
    if (!o->url_set) {
        if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
            fprintf(stderr, "kvrouter bench mocker: sched_getaffinity: %s\n", strerror(errno));
            return 1;
        }
        if (o->mocker_cpu >= CPU_SETSIZE || !CPU_ISSET(o->mocker_cpu, &allowed)) {
            fprintf(stderr, "kvrouter bench mocker: --mocker-cpu %u: not a CPU this process may "
                            "use (%d available)\n", o->mocker_cpu, CPU_COUNT(&allowed));
            return 2;
        }
        gen = allowed;
        CPU_CLR(o->mocker_cpu, &gen);
        if (CPU_COUNT(&gen) == 0) {
            gen = allowed;
            fprintf(stderr, "kvrouter bench mocker: one CPU only: the clients share it with the "
                            "mocker, whose figures are then lower bounds\n");
        }
        pinned = sched_setaffinity(0, sizeof gen, &gen) == 0;
    }
    void *zctx = o->url_set ? NULL : zmq_ctx_new();
    if (!o->url_set && zctx == NULL) {
        fprintf(stderr, "kvrouter bench mocker: zmq_ctx_new: %s\n", zmq_strerror(zmq_errno()));
        return 1;
    }
    header_printed = false;
    int rc = 0;
    for (size_t ti = 0; ti < tokens->n && rc == 0; ti++)
        for (size_t ci = 0; ci < clients->n && rc == 0; ci++)
            rc = one_point(o, zctx, &t, clients->v[ci], tokens->v[ti]);
    if (zctx != NULL)
        zmq_ctx_term(zctx);
    if (pinned)
        sched_setaffinity(0, sizeof allowed, &allowed);
    return rc;
}
