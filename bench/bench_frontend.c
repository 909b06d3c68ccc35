/*
 * bench_frontend.c: `kvrouter bench frontend`: what the router's OpenAI front end adds to the
 * time to first token (TTFT).
 *
 * It spawns `kvrouter mocker` (/proc/self/exe, KV events on, --speedup S so the modelled prefill
 * of an 8K-token prompt is ~0.17 ms and the HTTP path dominates) and `kvrouter serve` in front
 * of it (kv mode, subscribed to the mocker's events), waits for the router's /ready, then sends
 * streaming completions from one client, one at a time, alternately straight to the mocker and
 * through the router (each path on its own keep-alive connection, TCP_NODELAY, the order
 * swapped every other pair). Every prompt is new (random ids), so both paths do the same
 * prefill work and the router hashes, looks up and books a full prompt each time. TTFT is the
 * time from the request's first byte sent to the first SSE `data:` event received.
 *
 * Figures per point (medians of --runs runs): p50 / p99 of each path, the difference of the
 * p50s and the median of the paired differences (router minus direct for neighbouring
 * requests, which cancels slow drift on a shared machine); target: <= 200 us added at p50.
 * --disagg: a prefill and a decode mocker (vLLM's pull convention, the modelled KV transfer made
 * negligible: --kv-transfer-gbps 1e9) behind a router with their roles; the direct path is the
 * client doing vLLM's proxy protocol itself (the prefill request with max_tokens 1 and
 * kv_transfer_params, then the streaming request to the decode mocker with the answer's
 * parameters), so both paths do the same engine work and the same KV read between the
 * mockers, and the difference is what the router's two legs add; target: <= 150 us at p50.
 * --tokenizer DIR: chats instead, to a mocker that tokenizes with DIR (`--tokenizer`, as vLLM
 * tokenizes) and through two routers: one that tokenizes in process (`--tokenizer m=DIR`) and
 * one that asks the mocker's POST /tokenize (the router's path without a tokenizer). Three
 * paths, the order rotated; the added figures are the paired medians against the direct path.
 * Two rows, their runs interleaved: frontend-chat, every chat new (a system prompt and a user
 * message of random words, about --tokens tokens by DIR's tokenizer: no cache answers), and
 * frontend-chat-turns, conversations (each path its own: a history of exchanges sent first as
 * a new chat, not timed, then CONV_TURNS timed turns, each adding a user message to the history
 * and then the assistant's answer, as chat clients resend the whole history; the timed prompts
 * average about --tokens). The mocker's /tokenize costs what our C tokenizer costs (its
 * segment cache included) plus the HTTP hop: a floor for a real engine, whose API server
 * tokenizes in HF tokenizers under Python (`kvrouter bench tokenize --compare` measures that
 * tokenizer against ours). Target: <= 300 us added by the in-process path at p50.
 * --rate R paces the requests (both paths together) to R per second: the gap lets the
 * router's ingest thread apply the previous request's KV events before the next is timed,
 * which on a 2-core machine otherwise competes with the request path for a core.
 * Memory: one request body and one response buffer, reused (and each path's conversation). Threads: one (the children are
 * processes). A failed request, a child that does not start within 10 s, or a non-200 answer
 * fails the run (exit 1).
 * Invariants: both paths use the same requests' shape and one keep-alive connection each; only
 * the interval from a request's first byte to its first event is timed. The connections, heads
 * and reads are http/client.h's (a blocking client: a recv per piece, no poll in the timed
 * path). Cost: the client's own per request is a few syscalls and one search per read.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>

#include "apps/child.h"
#include "base/grow.h"
#include "tokenizer/model.h"
#include "http/http.h"
#include "bench.h"
#include "wire/disagg.h"

/* Declared here and in bench_main.c (bench.h belongs to the benchmarks shared by others). */
int kvr_bench_frontend(const kvr_bench_opts_t *o);

#define FB_READY_MS 10000
#define FB_IO_TIMEOUT_MS 30000 /* connect, send and receive on the client's connections */
#define FB_WARMUP 10
#define FB_DEFAULT_REQUESTS 200
#define FB_TARGET_US 200.0
#define FB_DISAGG_TARGET_US 150.0
#define FB_CHAT_TARGET_US 300.0

typedef struct child {
    pid_t pid;
    int out_fd; /* its stdout, kept open so it never gets SIGPIPE */
    int port;
} child_t;

static const kvr_bench_col_t COLS[] = {
    {"bench", KVR_BENCH_STR, 15, 0},            {"tokens", KVR_BENCH_INT, 6, 0},
    {"runs", KVR_BENCH_INT, 4, 0},             {"requests", KVR_BENCH_INT, 8, 0},
    {"direct_p50_us", KVR_BENCH_NUM, 13, 1},   {"direct_p99_us", KVR_BENCH_NUM, 13, 1},
    {"router_p50_us", KVR_BENCH_NUM, 13, 1},   {"router_p99_us", KVR_BENCH_NUM, 13, 1},
    {"added_p50_us", KVR_BENCH_NUM, 12, 1},    {"added_paired_us", KVR_BENCH_NUM, 15, 1},
    {"target_us", KVR_BENCH_NUM, 9, 0},        {"speedup", KVR_BENCH_NUM, 0, 1},
    {"max_tokens", KVR_BENCH_INT, 0, 0},       {"rate_per_s", KVR_BENCH_NUM, 0, 0},
};
#define N_COLS (sizeof COLS / sizeof COLS[0])

/* ---- children ------------------------------------------------------------------------- */

/* fork + exec of /proc/self/exe args; its port once it printed "listening HOST:PORT". */
static bool spawn(char *const *args, const char *what, child_t *c)
{
    int pfd[2];
    if (pipe(pfd) != 0) {
        fprintf(stderr, "kvrouter bench frontend: pipe: %s\n", strerror(errno));
        return false;
    }
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        close(pfd[0]);
        close(pfd[1]);
        execv(kvr_child_self(), args);
        _exit(127);
    }
    close(pfd[1]);
    if (pid < 0) {
        close(pfd[0]);
        fprintf(stderr, "kvrouter bench frontend: fork: %s\n", strerror(errno));
        return false;
    }
    c->pid = pid;
    c->out_fd = pfd[0];
    char line[256];
    size_t n = 0;
    uint64_t end = kvr_bench_now_ns() + (uint64_t)FB_READY_MS * 1000000u;
    while (n < sizeof line - 1) {
        uint64_t now = kvr_bench_now_ns();
        struct pollfd p = {.fd = c->out_fd, .events = POLLIN};
        if (now >= end || poll(&p, 1, (int)((end - now) / 1000000u) + 1) <= 0)
            break;
        if (read(c->out_fd, line + n, 1) != 1)
            break;
        if (line[n++] == '\n')
            break;
    }
    line[n] = '\0';
    const char *colon = strrchr(line, ':');
    if (strncmp(line, "listening ", 10) != 0 || colon == NULL || atoi(colon + 1) <= 0) {
        fprintf(stderr, "kvrouter bench frontend: the %s did not print 'listening HOST:PORT' "
                "within %d s (got '%.100s')\n", what, FB_READY_MS / 1000, line);
        return false;
    }
    c->port = atoi(colon + 1);
    return true;
}

static void reap(child_t *c)
{
    if (c->pid > 0) {
        kill(c->pid, SIGTERM);
        int st;
        for (int i = 0; i < 200 && waitpid(c->pid, &st, WNOHANG) == 0; i++)
            kvr_bench_sleep_ns(50000000u);
        if (waitpid(c->pid, &st, WNOHANG) == 0) {
            kill(c->pid, SIGKILL);
            waitpid(c->pid, &st, 0);
        }
    }
    if (c->out_fd >= 0)
        close(c->out_fd);
    c->pid = 0;
    c->out_fd = -1;
}

/* ---- requests on keep-alive connections (http/client.h) ---------------------------------- */

/* A connection to 127.0.0.1:port (TCP_NODELAY, 30 s timeouts); -1 on failure. */
static int connect_to(int port)
{
    kvr_http_target_t t = {.addr = "127.0.0.1", .port = (uint16_t)port};
    int err;
    return kvr_http_connect(&t, FB_IO_TIMEOUT_MS, &err);
}

/* Sends head and body; false (why printed) on failure. */
static bool send_request(int fd, const char *head, size_t head_len, const char *body,
                         size_t body_len, kvr_http_resp_t *r, const char *path_name)
{
    kvr_http_resp_reset(r);
    if (kvr_http_send_all(fd, head, head_len) && kvr_http_send_all(fd, body, body_len))
        return true;
    fprintf(stderr, "kvrouter bench frontend: %s: send failed\n", path_name);
    return false;
}

/* Reads more of the answer into r (r->body_at once its head is in; a non-200 answer is a
 * failure). False (why printed) on failure. */
static bool recv_more(int fd, kvr_http_resp_t *r, const char *path_name)
{
    int rc = kvr_http_recv(fd, r);
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter bench frontend: %s: %s\n", path_name,
                rc == KVR_EIO ? "connection closed or timed out" : kvr_strerror(rc));
        return false;
    }
    if (r->body_at != 0 && r->status != 200) {
        fprintf(stderr, "kvrouter bench frontend: %s: answer '%.60s'\n", path_name, r->buf);
        return false;
    }
    return true;
}

/* One request on a keep-alive connection: its TTFT (send to the first `data:` event) in ns,
 * 0 on failure (why printed). The whole streamed answer is read. */
static uint64_t ttft_once(int fd, const char *head, size_t head_len, const char *body,
                          size_t body_len, kvr_http_resp_t *r, const char *path_name)
{
    uint64_t t0 = kvr_bench_now_ns(), first = 0;
    if (!send_request(fd, head, head_len, body, body_len, r, path_name))
        return 0;
    for (;;) {
        if (!recv_more(fd, r, path_name))
            return 0;
        size_t at = r->body_at;
        if (at == 0)
            continue;
        if (first == 0 && kvr_http_find(r->buf + at, r->len - at, "data: ") != NULL)
            first = kvr_bench_now_ns();
        if (first != 0 && r->len >= 5 && memcmp(r->buf + r->len - 5, "0\r\n\r\n", 5) == 0 &&
            kvr_http_find(r->buf + at, r->len - at, "[DONE]") != NULL)
            return first - t0;
    }
}

/* One whole (Content-Length) answer on a keep-alive connection into r; the body's offset, 0
 * on failure (why printed). */
static size_t whole_once(int fd, const char *head, size_t head_len, const char *body,
                         size_t body_len, kvr_http_resp_t *r, const char *path_name)
{
    if (!send_request(fd, head, head_len, body, body_len, r, path_name))
        return 0;
    while (r->body_at == 0)
        if (!recv_more(fd, r, path_name))
            return 0;
    size_t n;
    if (kvr_http_header(r, "Content-Length", &n) == NULL) {
        fprintf(stderr, "kvrouter bench frontend: %s: no Content-Length\n", path_name);
        return 0;
    }
    int rc = kvr_http_read_whole(fd, r, SIZE_MAX, 0); /* the socket's 30 s receive timeout */
    if (rc != KVR_OK) {
        fprintf(stderr, "kvrouter bench frontend: %s: %s\n", path_name,
                rc == KVR_EIO ? "connection closed or timed out" : kvr_strerror(rc));
        return 0;
    }
    return r->body_at;
}

/* The request line and headers for a body of len bytes. */
static size_t make_head(char *out, size_t cap, size_t len)
{
    return kvr_http_head(out, cap, "POST", "/v1/completions", "127.0.0.1", "application/json",
                         len, false);
}

/* A fresh streaming completion of `tokens` random ids. */
static size_t make_body(char **buf, size_t *cap, kvr_bench_rng_t *rng, uint64_t tokens,
                        uint64_t max_tokens)
{
    size_t need = tokens * 12 + 128;
    if (*cap < need) {
        char *b = realloc(*buf, need);
        if (b == NULL)
            return 0;
        *buf = b;
        *cap = need;
    }
    char *o = *buf;
    o += sprintf(o, "{\"model\":\"m\",\"prompt\":[");
    for (uint64_t i = 0; i < tokens; i++)
        o += sprintf(o, i ? ",%u" : "%u", (unsigned)(1000 + kvr_bench_rng_below(rng, 30000)));
    o += sprintf(o, "],\"max_tokens\":%llu,\"stream\":true}", (unsigned long long)max_tokens);
    return (size_t)(o - *buf);
}

/* The direct path of --disagg: the client runs vLLM's proxy protocol on the prompt of body
 * (a make_body result): the prefill request to fds[0], then the decode request with the
 * answer's kv_transfer_params to fds[1]. TTFT from the prefill request's first byte to the
 * decode stream's first event; 0 on failure. */
static uint64_t ttft_disagg_direct(const int fds[2], const char *body, size_t bl,
                                   kvr_http_resp_t *r)
{
    static const char tail[] = ",\"max_tokens\":1,\"stream\":false,\"kv_transfer_params\":{"
                               "\"do_remote_decode\":true,\"do_remote_prefill\":false,"
                               "\"remote_engine_id\":null,\"remote_block_ids\":null,"
                               "\"remote_host\":null,\"remote_port\":null}}";
    const char *mt = kvr_http_find(body, bl, ",\"max_tokens\"");
    if (mt == NULL)
        return 0;
    size_t plen = (size_t)(mt - body);
    char *pb = malloc(plen + sizeof tail), head[256];
    if (pb == NULL)
        return 0;
    memcpy(pb, body, plen);
    memcpy(pb + plen, tail, sizeof tail - 1);
    size_t pbl = plen + sizeof tail - 1, hl = make_head(head, sizeof head, pbl);
    uint64_t t0 = kvr_bench_now_ns();
    size_t at = hl ? whole_once(fds[0], head, hl, pb, pbl, r, "prefill (direct)") : 0;
    free(pb);
    kvr_disagg_answer_t a;
    if (at == 0 || kvr_disagg_scan_answer(r->buf + at, r->len - at, &a) != KVR_OK ||
        a.kvt != KVR_KVT_OBJECT) {
        fprintf(stderr, "kvrouter bench frontend: the prefill mocker's answer has no "
                        "kv_transfer_params\n");
        return 0;
    }
    /* the decode body: the client's, with the parameters before its closing brace */
    char *db = malloc(bl + a.kvt_len + 32);
    if (db == NULL)
        return 0;
    size_t dl = bl - 1;
    memcpy(db, body, dl);
    dl += (size_t)sprintf(db + dl, ",\"kv_transfer_params\":");
    memcpy(db + dl, r->buf + at + a.kvt_at, a.kvt_len);
    dl += a.kvt_len;
    db[dl++] = '}';
    hl = make_head(head, sizeof head, dl);
    uint64_t t1 = kvr_bench_now_ns();
    uint64_t d = hl ? ttft_once(fds[1], head, hl, db, dl, r, "decode (direct)") : 0;
    free(db);
    return d ? t1 - t0 + d : 0;
}

static bool wait_ready(int port)
{
    kvr_http_target_t t = {.addr = "127.0.0.1", .host_hdr = "127.0.0.1", .port = (uint16_t)port};
    kvr_http_resp_t r = {0};
    char err[200];
    bool ok = false;
    for (int i = 0; i < 200 && !ok; i++) {
        ok = kvr_http_get(&t, "/ready", FB_IO_TIMEOUT_MS, 4096, &r, err, sizeof err) == KVR_OK &&
             r.status == 200;
        if (!ok)
            kvr_bench_sleep_ns(50000000u);
    }
    kvr_http_resp_free(&r);
    return ok;
}

/* ---- the benchmark ---------------------------------------------------------------------- */

typedef struct run_fig {
    double d50, d99, r50, r99, paired;
} run_fig_t;

static bool one_run(int mport, int dport, int rport, uint64_t tokens, uint64_t max_tokens,
                    size_t n, double rate, kvr_bench_rng_t *rng, run_fig_t *f)
{
    uint64_t gap_ns = rate > 0 ? (uint64_t)(1e9 / rate) : 0, next = kvr_bench_now_ns();
    int fds[2] = {connect_to(mport), connect_to(rport)};
    int dfds[2] = {fds[0], dport > 0 ? connect_to(dport) : -1}; /* --disagg: prefill, decode */
    double *lat[2] = {malloc(n * sizeof(double)), malloc(n * sizeof(double))};
    double *diff = malloc(n * sizeof(double));
    char *body = NULL, head[256];
    size_t cap = 0;
    kvr_http_resp_t r = {0};
    bool ok = fds[0] >= 0 && fds[1] >= 0 && lat[0] && lat[1] && diff &&
              (dport <= 0 || dfds[1] >= 0);
    static const char *const names[2] = {"direct", "via router"};
    for (size_t i = 0; ok && i < FB_WARMUP + n; i++) {
        uint64_t t[2];
        for (int k = 0; k < 2 && ok; k++) {
            int path = (i & 1) ? 1 - k : k; /* swap the order every other pair */
            size_t bl = make_body(&body, &cap, rng, tokens, max_tokens);
            size_t hl = make_head(head, sizeof head, bl);
            uint64_t now = kvr_bench_now_ns();
            if (gap_ns && now < next)
                kvr_bench_sleep_ns(next - now);
            next = (now > next ? now : next) + gap_ns;
            if (dport > 0 && path == 0)
                t[path] = bl ? ttft_disagg_direct(dfds, body, bl, &r) : 0;
            else
                t[path] = bl && hl ? ttft_once(fds[path], head, hl, body, bl, &r, names[path])
                                   : 0;
            ok = t[path] != 0;
        }
        if (ok && i >= FB_WARMUP) {
            lat[0][i - FB_WARMUP] = (double)t[0];
            lat[1][i - FB_WARMUP] = (double)t[1];
            diff[i - FB_WARMUP] = ((double)t[1] - (double)t[0]) / 1000.0;
        }
    }
    if (ok) {
        kvr_bench_lat_t a, b;
        kvr_bench_summarize(lat[0], n, &a);
        kvr_bench_summarize(lat[1], n, &b);
        *f = (run_fig_t){a.p50_us, a.p99_us, b.p50_us, b.p99_us, kvr_bench_median(diff, n)};
    }
    for (int k = 0; k < 2; k++) {
        if (fds[k] >= 0)
            close(fds[k]);
        free(lat[k]);
    }
    if (dfds[1] >= 0)
        close(dfds[1]);
    free(diff);
    free(body);
    kvr_http_resp_free(&r);
    return ok;
}

/* ---- --tokenizer: chats tokenized in the router or by the worker's /tokenize ------------ */

static const char *const WORDS[] = {
    "the",    "router",  "holds",  "a",       "cache",  "of",      "prompt", "blocks",
    "and",    "weighs",  "overlap", "against", "load",   "when",   "it",     "picks",
    "worker", "engine",  "tokens", "prefill", "decode", "latency", "naïve",  "café",
    "東京",   "данные",  "über",   "2026",    "3.14",   "it's",    "we'll",  "(x+y)",
    "model",  "answer",  "quickly", "system", "user",   "turn",    "chat",   "template",
};
#define N_WORDS (sizeof WORDS / sizeof WORDS[0])

#define CHAT_SYSTEM "You are a helpful assistant."

/* `words` random words at o; the end. */
static char *put_words(char *o, kvr_bench_rng_t *rng, size_t words)
{
    for (size_t i = 0; i < words; i++)
        o += sprintf(o, i ? " %s" : "%s", WORDS[kvr_bench_rng_below(rng, N_WORDS)]);
    return o;
}

/* The chat's messages at o: a short system prompt, then `words` random words from the user. */
static char *put_messages(char *o, kvr_bench_rng_t *rng, size_t words)
{
    o += sprintf(o, "[{\"role\":\"system\",\"content\":\"" CHAT_SYSTEM "\"},"
                    "{\"role\":\"user\",\"content\":\"");
    o = put_words(o, rng, words);
    return o + sprintf(o, "\"}]");
}

/* A fresh streaming chat of about `words` words. */
static size_t make_chat(char **buf, size_t *cap, kvr_bench_rng_t *rng, size_t words,
                        uint64_t max_tokens)
{
    size_t need = words * 16 + 256;
    if (*cap < need) {
        char *b = realloc(*buf, need);
        if (b == NULL)
            return 0;
        *buf = b;
        *cap = need;
    }
    char *o = *buf;
    o += sprintf(o, "{\"model\":\"m\",\"messages\":");
    o = put_messages(o, rng, words);
    o += sprintf(o, ",\"max_tokens\":%llu,\"stream\":true}", (unsigned long long)max_tokens);
    return (size_t)(o - *buf);
}

/* The ids of a chat of messages msgs[0..ml) by m's tokenizer and template: their number, 0
 * when the template does not render it. */
static size_t chat_tokens(const kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s, const char *msgs,
                          size_t ml)
{
    kvr_tokmodel_input_t in = {
        .add_special = -1,
        .chat = {.messages = msgs, .messages_len = ml, .add_generation_prompt = true}};
    size_t n = 0;
    char why[256];
    uint32_t *ids = malloc(((size_t)1 << 20) * sizeof *ids);
    if (ids == NULL || kvr_tokmodel_ids(m, s, &in, ids, (size_t)1 << 20, &n, NULL, NULL, why,
                                        sizeof why) != KVR_OK)
        n = 0;
    free(ids);
    return n;
}

/* How many words make a chat of about `tokens` tokens by m's tokenizer and template (two
 * passes of a proportional correction); *measured: the tokens of the last chat sized. 0 when
 * its template does not render the chat. */
static size_t calibrate_words(const kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s, uint64_t tokens,
                              kvr_bench_rng_t *rng, size_t *measured)
{
    size_t words = (size_t)tokens, n = 0;
    for (int pass = 0; pass < 2; pass++) {
        char *msgs = malloc(words * 16 + 256);
        if (msgs == NULL)
            break;
        n = chat_tokens(m, s, msgs, (size_t)(put_messages(msgs, rng, words) - msgs));
        free(msgs);
        if (n == 0)
            break;
        words = (size_t)((double)words * (double)tokens / (double)n + 0.5);
    }
    *measured = n;
    return n ? words : 0;
}

typedef struct chat_fig {
    double d50, d99, i50, i99, w50, w99, ipaired, wpaired;
} chat_fig_t;

/* ---- multi-turn conversations (--tokenizer's second row) ---------------------------------
 * Each path has its own conversation, all of the same shape: a system prompt and a history of
 * exchanges (a user message of CONV_USER_WORDS words, an assistant answer of CONV_ANSWER_WORDS)
 * sent first as a new chat (not timed), then CONV_TURNS timed turns, each adding a user message
 * to the history and, after it, the assistant's answer: a chat client resends the whole
 * history every turn. The history starts so that the timed prompts average about --tokens. */
#define CONV_TURNS 8
#define CONV_USER_WORDS 100
#define CONV_ANSWER_WORDS 200

typedef struct conv {
    char *msgs; /* the messages array so far, without its closing bracket */
    size_t len, cap;
} conv_t;

static bool conv_fit(conv_t *c, size_t more)
{
    return kvr_grow((void **)&c->msgs, &c->cap, c->len + more + 1, SIZE_MAX, 1) == KVR_OK;
}

/* Appends a message of `words` random words. */
static bool conv_add(conv_t *c, const char *role, kvr_bench_rng_t *rng, size_t words)
{
    if (!conv_fit(c, words * 16 + 64))
        return false;
    char *o = c->msgs + c->len;
    o += sprintf(o, ",{\"role\":\"%s\",\"content\":\"", role);
    o = put_words(o, rng, words);
    o += sprintf(o, "\"}");
    c->len = (size_t)(o - c->msgs);
    return true;
}

/* A new conversation: the system prompt, then exchanges up to about start_words words. */
static bool conv_start(conv_t *c, kvr_bench_rng_t *rng, size_t start_words)
{
    c->len = 0;
    if (!conv_fit(c, 64))
        return false;
    c->len = (size_t)sprintf(c->msgs, "[{\"role\":\"system\",\"content\":\"" CHAT_SYSTEM "\"}");
    bool ok = true;
    for (size_t w = 0; ok && w + CONV_USER_WORDS + CONV_ANSWER_WORDS <= start_words;
         w += CONV_USER_WORDS + CONV_ANSWER_WORDS)
        ok = conv_add(c, "user", rng, CONV_USER_WORDS) &&
             conv_add(c, "assistant", rng, CONV_ANSWER_WORDS);
    return ok;
}

/* The streaming chat of the conversation so far. */
static size_t conv_body(const conv_t *c, char **buf, size_t *cap, uint64_t max_tokens)
{
    size_t need = c->len + 128;
    if (*cap < need) {
        char *b = realloc(*buf, need);
        if (b == NULL)
            return 0;
        *buf = b;
        *cap = need;
    }
    int n = snprintf(*buf, *cap,
                     "{\"model\":\"m\",\"messages\":%.*s],\"max_tokens\":%llu,"
                     "\"stream\":true}",
                     (int)c->len, c->msgs, (unsigned long long)max_tokens);
    return n > 0 && (size_t)n < *cap ? (size_t)n : 0;
}

/* The history's words at a conversation's start, so that the timed turns average `words`. */
static size_t conv_start_words(size_t words)
{
    size_t grow = CONV_TURNS * (CONV_USER_WORDS + CONV_ANSWER_WORDS) / 2;
    return words > grow + CONV_USER_WORDS + CONV_ANSWER_WORDS ? words - grow
                                                              : CONV_USER_WORDS + CONV_ANSWER_WORDS;
}

/* The mean ids of a conversation's timed turns (one conversation sized by m), and its
 * first and last; 0 when the template does not render them. */
static size_t conv_tokens(const kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s, size_t words,
                          kvr_bench_rng_t *rng, size_t *first, size_t *last)
{
    conv_t c = {0};
    size_t sum = 0, n = 0;
    bool ok = conv_start(&c, rng, conv_start_words(words));
    for (int turn = 1; ok && turn <= CONV_TURNS; turn++) {
        ok = conv_add(&c, "user", rng, CONV_USER_WORDS) && conv_fit(&c, 1);
        if (ok) {
            c.msgs[c.len] = ']';
            n = chat_tokens(m, s, c.msgs, c.len + 1);
            ok = n > 0 && conv_add(&c, "assistant", rng, CONV_ANSWER_WORDS);
        }
        if (turn == 1)
            *first = n;
        *last = n;
        sum += n;
    }
    free(c.msgs);
    return ok ? sum / CONV_TURNS : 0;
}

/* One run of --tokenizer: n timed chats on each of the three paths (ports: direct, in-process
 * router, /tokenize router), the order rotated every request. turns: every chat new (false),
 * or the turns of conversations (true; the conversations' first chats are not timed). */
static bool chat_run(const int ports[3], bool turns, size_t words, uint64_t max_tokens, size_t n,
                     double rate, kvr_bench_rng_t *rng, chat_fig_t *f)
{
    static const char *const names[3] = {"direct", "router (in process)", "router (/tokenize)"};
    uint64_t gap_ns = rate > 0 ? (uint64_t)(1e9 / rate) : 0, next = kvr_bench_now_ns();
    int fds[3];
    double *lat[3], *diff[2];
    conv_t cv[3] = {{0}};
    bool ok = true;
    for (int k = 0; k < 3; k++) {
        fds[k] = connect_to(ports[k]);
        lat[k] = malloc(n * sizeof(double));
        ok = ok && fds[k] >= 0 && lat[k] != NULL;
    }
    diff[0] = malloc(n * sizeof(double));
    diff[1] = malloc(n * sizeof(double));
    ok = ok && diff[0] && diff[1];
    char *body = NULL, head[256];
    size_t cap = 0, timed = 0;
    kvr_http_resp_t r = {0};
    for (size_t i = 0; ok && timed < n; i++) {
        size_t turn = i % (CONV_TURNS + 1); /* turns: 0 starts a conversation (not timed) */
        uint64_t t[3];
        for (int k = 0; k < 3 && ok; k++) {
            int path = (int)((k + i) % 3);
            size_t bl;
            if (turns) {
                ok = (turn > 0 || conv_start(&cv[path], rng, conv_start_words(words))) &&
                     conv_add(&cv[path], "user", rng, CONV_USER_WORDS);
                bl = ok ? conv_body(&cv[path], &body, &cap, max_tokens) : 0;
            } else {
                bl = make_chat(&body, &cap, rng, words, max_tokens);
            }
            size_t hl = kvr_http_head(head, sizeof head, "POST", "/v1/chat/completions",
                                      "127.0.0.1", "application/json", bl, false);
            uint64_t now = kvr_bench_now_ns();
            if (gap_ns && now < next)
                kvr_bench_sleep_ns(next - now);
            next = (now > next ? now : next) + gap_ns;
            t[path] = bl && hl ? ttft_once(fds[path], head, hl, body, bl, &r, names[path]) : 0;
            ok = t[path] != 0 &&
                 (!turns || conv_add(&cv[path], "assistant", rng, CONV_ANSWER_WORDS));
        }
        if (ok && i >= FB_WARMUP && (!turns || turn > 0)) {
            for (int k = 0; k < 3; k++)
                lat[k][timed] = (double)t[k];
            diff[0][timed] = ((double)t[1] - (double)t[0]) / 1000.0;
            diff[1][timed] = ((double)t[2] - (double)t[0]) / 1000.0;
            timed++;
        }
    }
    if (ok) {
        kvr_bench_lat_t a, b, c;
        kvr_bench_summarize(lat[0], n, &a);
        kvr_bench_summarize(lat[1], n, &b);
        kvr_bench_summarize(lat[2], n, &c);
        *f = (chat_fig_t){a.p50_us, a.p99_us, b.p50_us, b.p99_us, c.p50_us, c.p99_us,
                          kvr_bench_median(diff[0], n), kvr_bench_median(diff[1], n)};
    }
    for (int k = 0; k < 3; k++) {
        if (fds[k] >= 0)
            close(fds[k]);
        free(lat[k]);
        free(cv[k].msgs);
    }
    free(diff[0]);
    free(diff[1]);
    free(body);
    kvr_http_resp_free(&r);
    return ok;
}

static const kvr_bench_col_t CHAT_COLS[] = {
    {"bench", KVR_BENCH_STR, 19, 0},
    {"tokens", KVR_BENCH_INT, 6, 0},
    {"runs", KVR_BENCH_INT, 4, 0},
    {"requests", KVR_BENCH_INT, 8, 0},
    {"direct_p50_us", KVR_BENCH_NUM, 13, 1},
    {"inproc_p50_us", KVR_BENCH_NUM, 13, 1},
    {"inproc_p99_us", KVR_BENCH_NUM, 13, 1},
    {"inproc_added_us", KVR_BENCH_NUM, 15, 1},
    {"tokenize_p50_us", KVR_BENCH_NUM, 15, 1},
    {"tokenize_p99_us", KVR_BENCH_NUM, 15, 1},
    {"tokenize_added_us", KVR_BENCH_NUM, 17, 1},
    {"target_us", KVR_BENCH_NUM, 9, 0},
    {"direct_p99_us", KVR_BENCH_NUM, 0, 1},
    {"speedup", KVR_BENCH_NUM, 0, 1},
};
#define N_CHAT_COLS (sizeof CHAT_COLS / sizeof CHAT_COLS[0])

/* A mocker with the bench's arguments and extra (NULL-terminated); ev: its events port. */
static bool spawn_mocker(const kvr_bench_opts_t *o, const char *speed, int ev,
                         const char *const *extra, const char *what, child_t *c)
{
    char kvcfg[160];
    snprintf(kvcfg, sizeof kvcfg, "{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\","
             "\"endpoint\":\"tcp://*:%d\"}", ev);
    char *margs[24 + KVR_BENCH_MAX_MOCKER_ARGS];
    size_t na = 0;
    const char *base_m[] = {"kvrouter", "mocker", "--host", "127.0.0.1", "--port", "0",
                            "--model", "m", "--speedup", speed, "--kv-events-config", kvcfg,
                            "--log-level", "warn"};
    for (size_t i = 0; i < sizeof base_m / sizeof base_m[0]; i++)
        margs[na++] = (char *)base_m[i];
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++)
        margs[na++] = (char *)extra[i];
    for (size_t i = 0; i < o->n_mocker_args; i++)
        margs[na++] = (char *)o->mocker_args[i];
    margs[na] = NULL;
    return spawn(margs, what, c);
}

/* Polls the router's /metrics until its tokenizer's probe agreed with the worker (10 s). */
static bool wait_probe(int port)
{
    kvr_http_target_t t = {.addr = "127.0.0.1", .host_hdr = "127.0.0.1", .port = (uint16_t)port};
    kvr_http_resp_t r = {0};
    char err[200];
    bool ok = false;
    for (int i = 0; i < 200 && !ok; i++) {
        ok = kvr_http_get(&t, "/metrics", FB_IO_TIMEOUT_MS, 1 << 22, &r, err, sizeof err) ==
                 KVR_OK && r.status == 200 && r.body_at > 0 &&
             kvr_http_find(r.buf + r.body_at, r.len - r.body_at,
                           "kvr_frontend_tokenizer_probe{model=\"m\",state=\"same\"} 1") != NULL;
        if (!ok)
            kvr_bench_sleep_ns(50000000u);
    }
    kvr_http_resp_free(&r);
    return ok;
}

/* --tokenizer: the chat bench (see the file's comment). */
static int frontend_chat(const kvr_bench_opts_t *o, const kvr_bench_list_t *tl, size_t n)
{
    int ev = kvr_free_port();
    char speed[32], worker[256], tok[1100];
    snprintf(speed, sizeof speed, "%g", o->speedup);
    snprintf(tok, sizeof tok, "m=%s", o->tokenizer);
    /* the engine tokenizes every prompt itself, as vLLM does (it ignores the nvext.token_data
     * the router adds): each path's added time is then the router's whole work, not that work
     * less the engine's tokenization it would spare a Dynamo-style backend */
    const char *const m_args[] = {"--tokenizer", o->tokenizer, "--token-data", "ignore", NULL};
    child_t m = {.out_fd = -1}, ra = {.out_fd = -1}, rb = {.out_fd = -1};
    kvr_tokmodel_t *tm = NULL;
    kvr_tokmodel_scratch_t *ts = NULL;
    int rc = 1;
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, o->seed);
    if (ev <= 0 || !spawn_mocker(o, speed, ev, m_args, "mocker", &m))
        goto out;
    snprintf(worker, sizeof worker, "id=1,url=http://127.0.0.1:%d,events=tcp://127.0.0.1:%d,"
             "model=m", m.port, ev);
    /* what a vLLM fleet runs: no nvext.token_data the engine would only parse and drop */
    char td[] = "--frontend-chat-token-data", off[] = "false";
    char *a_args[] = {"kvrouter", "serve", "--http-port", "0", "--log-level", "warn", td, off,
                      "--worker", worker, "--tokenizer", tok, NULL};
    char *b_args[] = {"kvrouter", "serve", "--http-port", "0", "--log-level", "warn", td, off,
                      "--worker", worker, NULL};
    if (!spawn(a_args, "router (in process)", &ra) || !spawn(b_args, "router (/tokenize)", &rb))
        goto out;
    if (!wait_ready(ra.port) || !wait_ready(rb.port) || !wait_probe(ra.port)) {
        fprintf(stderr, "kvrouter bench frontend: the routers never became ready (or the "
                "in-process tokenizer's probe did not agree with the mocker's /tokenize)\n");
        goto out;
    }
    int st;
    char err[512];
    tm = kvr_tokmodel_load(o->tokenizer, &st, err, sizeof err);
    ts = tm != NULL ? kvr_tokmodel_scratch_new(tm) : NULL;
    if (ts == NULL) {
        fprintf(stderr, "kvrouter bench frontend: --tokenizer: %s\n", tm ? "out of memory" : err);
        goto out;
    }
    if (!o->json)
        printf("# TTFT of streaming chats, 1 client: direct to `kvrouter mocker --tokenizer %s "
               "--token-data ignore --speedup %s` (the engine tokenizes every prompt, as vLLM "
               "does), through `kvrouter serve --tokenizer m=DIR` (in process) and through "
               "`kvrouter serve` asking the mocker's /tokenize, both with "
               "--frontend-chat-token-data false; %zu timed requests per path per run, %s; "
               "*_added_us: the paired median (router minus direct, neighbouring requests)\n"
               "# frontend-chat: every chat new (a system prompt and one user message of random "
               "words), so no cache answers\n"
               "# frontend-chat-turns: conversations, each path its own: a history of exchanges "
               "(user %d words, assistant %d) sent first as a new chat (not timed), then %d "
               "timed turns, each adding a user message to the history and then the assistant's "
               "answer, as chat clients resend the whole history; the mocker's /tokenize and its "
               "own tokenization keep a segment cache too (a vLLM engine's would not)\n",
               o->tokenizer, speed, n, o->rate_per_s > 0 ? "paced (--rate)" : "back to back",
               CONV_USER_WORDS, CONV_ANSWER_WORDS, CONV_TURNS);
    rc = 0;
    for (size_t t = 0; t < tl->n && rc == 0; t++) {
        size_t measured = 0, words = calibrate_words(tm, ts, tl->v[t], &rng, &measured);
        size_t first = 0, last = 0,
               turn_tokens = words ? conv_tokens(tm, ts, words, &rng, &first, &last) : 0;
        if (words == 0 || turn_tokens == 0) {
            fprintf(stderr,
                    "kvrouter bench frontend: --tokenizer: %s's chat template does not "
                    "render the bench's chats\n",
                    o->tokenizer);
            rc = 1;
            break;
        }
        if (!o->json)
            printf("# %zu tokens: new chats of %zu tokens; conversation turns of %zu to %zu "
                   "tokens (mean %zu)\n",
                   (size_t)tl->v[t], measured, first, last, turn_tokens);
        if (t == 0)
            kvr_bench_print_header(o, CHAT_COLS, N_CHAT_COLS);
        unsigned runs = o->runs > 64 ? 64 : o->runs;
        double v[2][8][64];
        const int ports[3] = {m.port, ra.port, rb.port};
        for (unsigned k = 0; k < runs && rc == 0; k++) {
            for (int mode = 0; mode < 2 && rc == 0; mode++) { /* new, turns: interleaved */
                chat_fig_t f = {0};
                if (!chat_run(ports, mode == 1, words, o->max_tokens, n, o->rate_per_s, &rng, &f)) {
                    rc = 1;
                    break;
                }
                double row[8] = {f.d50, f.d99, f.i50, f.i99, f.w50, f.w99, f.ipaired, f.wpaired};
                for (int j = 0; j < 8; j++)
                    v[mode][j][k] = row[j];
            }
        }
        for (int mode = 0; mode < 2 && rc == 0; mode++) {
            kvr_bench_row_t row;
            kvr_bench_row_init(&row, CHAT_COLS, N_CHAT_COLS);
            kvr_bench_set_str(&row, "bench", mode ? "frontend-chat-turns" : "frontend-chat");
            kvr_bench_set_int(&row, "tokens", (int64_t)(mode ? turn_tokens : measured));
            kvr_bench_set_int(&row, "runs", runs);
            kvr_bench_set_int(&row, "requests", (int64_t)n);
            kvr_bench_set_num(&row, "direct_p50_us", kvr_bench_median(v[mode][0], runs));
            kvr_bench_set_num(&row, "direct_p99_us", kvr_bench_median(v[mode][1], runs));
            kvr_bench_set_num(&row, "inproc_p50_us", kvr_bench_median(v[mode][2], runs));
            kvr_bench_set_num(&row, "inproc_p99_us", kvr_bench_median(v[mode][3], runs));
            kvr_bench_set_num(&row, "tokenize_p50_us", kvr_bench_median(v[mode][4], runs));
            kvr_bench_set_num(&row, "tokenize_p99_us", kvr_bench_median(v[mode][5], runs));
            kvr_bench_set_num(&row, "inproc_added_us", kvr_bench_median(v[mode][6], runs));
            kvr_bench_set_num(&row, "tokenize_added_us", kvr_bench_median(v[mode][7], runs));
            kvr_bench_set_num(&row, "target_us", FB_CHAT_TARGET_US);
            kvr_bench_set_num(&row, "speedup", o->speedup);
            kvr_bench_print_row(o, &row);
        }
    }
out:
    kvr_tokmodel_scratch_free(ts);
    kvr_tokmodel_free(tm);
    reap(&rb);
    reap(&ra);
    reap(&m);
    return rc;
}

int kvr_bench_frontend(const kvr_bench_opts_t *o)
{
    static const kvr_bench_list_t def_tokens = {1, {8192}};
    const kvr_bench_list_t *tl = kvr_bench_pick(&o->tokens, &def_tokens);
    size_t n = o->requests ? (size_t)o->requests : FB_DEFAULT_REQUESTS;
    if (o->tokenizer != NULL)
        return frontend_chat(o, tl, n);
    int ev = kvr_free_port(), ev2 = o->disagg ? kvr_free_port() : 0;
    char speed[32], worker[256], worker2[256];
    snprintf(speed, sizeof speed, "%g", o->speedup);
    static const char *const pf_args[] = {"--role", "prefill", NULL};
    static const char *const dc_args[] = {"--role", "decode", "--kv-transfer-gbps", "1e9", NULL};
    child_t m = {.out_fd = -1}, d = {.out_fd = -1}, rt = {.out_fd = -1};
    int rc = 1;
    if (ev <= 0 || (o->disagg && (ev2 <= 0 || ev2 == ev)) ||
        !spawn_mocker(o, speed, ev, o->disagg ? pf_args : NULL,
                      o->disagg ? "prefill mocker" : "mocker", &m) ||
        (o->disagg && !spawn_mocker(o, speed, ev2, dc_args, "decode mocker", &d)))
        goto out;
    snprintf(worker, sizeof worker, "id=1,url=http://127.0.0.1:%d,events=tcp://127.0.0.1:%d%s",
             m.port, ev, o->disagg ? ",role=prefill" : "");
    snprintf(worker2, sizeof worker2,
             "id=2,url=http://127.0.0.1:%d,events=tcp://127.0.0.1:%d,role=decode", d.port, ev2);
    char *rargs[] = {"kvrouter", "serve",  "--http-port",                     "0",
                     "--log-level", "warn", "--worker",                        worker,
                     o->disagg ? "--worker" : NULL, worker2, NULL};
    if (!spawn(rargs, "router", &rt))
        goto out;
    if (!wait_ready(rt.port)) {
        fprintf(stderr, "kvrouter bench frontend: the router never became ready\n");
        goto out;
    }
    if (!o->json && o->disagg)
        printf("# TTFT of streaming completions, 1 client: vLLM's disaggregation protocol run "
               "by the client against a prefill and a decode `kvrouter mocker --speedup %s` "
               "(transfer time ~0) vs the same through `kvrouter serve` with their roles; %zu "
               "requests per path per run, %s\n",
               speed, n, o->rate_per_s > 0 ? "paced (--rate)" : "back to back");
    else if (!o->json)
        printf("# TTFT of streaming completions, 1 client, direct to `kvrouter mocker --speedup "
               "%s` vs through `kvrouter serve` (kv mode) on loopback; %zu requests per path "
               "per run, %s\n", speed, n, o->rate_per_s > 0 ? "paced (--rate)" : "back to back");
    kvr_bench_print_header(o, COLS, N_COLS);
    kvr_bench_rng_t rng;
    kvr_bench_rng_seed(&rng, o->seed);
    rc = 0;
    for (size_t t = 0; t < tl->n && rc == 0; t++) {
        unsigned runs = o->runs;
        double d50[64], d99[64], r50[64], r99[64], pd[64], add[64];
        if (runs > 64)
            runs = 64;
        for (unsigned k = 0; k < runs && rc == 0; k++) {
            run_fig_t f;
            if (!one_run(m.port, o->disagg ? d.port : 0, rt.port, tl->v[t], o->max_tokens, n,
                         o->rate_per_s, &rng, &f)) {
                rc = 1;
                break;
            }
            d50[k] = f.d50, d99[k] = f.d99, r50[k] = f.r50, r99[k] = f.r99, pd[k] = f.paired;
            add[k] = f.r50 - f.d50;
        }
        if (rc != 0)
            break;
        kvr_bench_row_t row;
        kvr_bench_row_init(&row, COLS, N_COLS);
        kvr_bench_set_str(&row, "bench", o->disagg ? "frontend-disagg" : "frontend");
        kvr_bench_set_int(&row, "tokens", (int64_t)tl->v[t]);
        kvr_bench_set_int(&row, "runs", runs);
        kvr_bench_set_int(&row, "requests", (int64_t)n);
        kvr_bench_set_num(&row, "direct_p50_us", kvr_bench_median(d50, runs));
        kvr_bench_set_num(&row, "direct_p99_us", kvr_bench_median(d99, runs));
        kvr_bench_set_num(&row, "router_p50_us", kvr_bench_median(r50, runs));
        kvr_bench_set_num(&row, "router_p99_us", kvr_bench_median(r99, runs));
        kvr_bench_set_num(&row, "added_p50_us", kvr_bench_median(add, runs));
        kvr_bench_set_num(&row, "added_paired_us", kvr_bench_median(pd, runs));
        kvr_bench_set_num(&row, "target_us", o->disagg ? FB_DISAGG_TARGET_US : FB_TARGET_US);
        kvr_bench_set_num(&row, "speedup", o->speedup);
        kvr_bench_set_int(&row, "max_tokens", (int64_t)o->max_tokens);
        kvr_bench_set_num(&row, "rate_per_s", o->rate_per_s > 0 ? o->rate_per_s : NAN);
        kvr_bench_print_row(o, &row);
    }
out:
    reap(&rt);
    reap(&d);
    reap(&m);
    return rc;
}
