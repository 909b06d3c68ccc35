/*
 * nats_link.c: see nats_link.h.
 *
 * Invariants:
 *   - the inbox is touched under mu only; the loop drains it by swapping the whole list out,
 *     so a callback that publishes or subscribes never waits on nats.c's threads;
 *   - kept entries and queued deletes are touched under mu; the kv thread takes a copy of
 *     what is due and does the blocking JetStream calls without mu;
 *   - conn_gen moves on at each reconnect: a watcher thread that sees it move recreates its
 *     watcher (an ephemeral consumer the server may have lost), and the kv thread re-puts
 *     every kept entry at once (the server may have lost the bucket: it is created again);
 *   - state is written by nats.c's callbacks under mu and read by anyone under mu.
 * Threads: nats.c's own (connection, subscription delivery), one kv thread, one per watch,
 * and the owner's loop, which runs every callback.
 */
#include "nats/nats_link.h"
#include "base/clock.h"

#include <event2/event.h>
#include <nats/nats.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/namelist.h"
#include "kvrouter.h"
#include "base/log.h"

#define INBOX_MAX 65536u
#define MAX_KEEP 64
#define MAX_WATCH 8
#define MAX_SUBS 16
#define MAX_LISTENERS 4
#define NAME_BYTES 128
#define DROP_DEADLINE_MS 2000u

typedef enum item_kind { IT_MSG = 0, IT_KV, IT_STATE } item_kind_t;

typedef struct item {
    struct item *next;
    item_kind_t kind;
    kvr_nats_msg_fn msg_fn; /* IT_MSG */
    kvr_nats_kv_fn kv_fn;   /* IT_KV */
    void *arg;
    int op;         /* IT_KV: kvr_kv_op_t; IT_STATE: kvr_nats_state_t */
    size_t len;
    char *subject, *reply; /* IT_MSG; subject is the key for IT_KV */
    uint8_t data[];        /* subject, reply and payload follow, NUL-terminated strings */
} item_t;

typedef struct keep {
    char bucket[NAME_BYTES], key[NAME_BYTES];
    uint64_t ttl_ms, period_ms, due_ms;
    uint8_t *val;
    size_t len;
    bool used, drop; /* drop: delete it, then free the slot */
} keep_t;

typedef struct watch {
    kvr_nats_t *n;
    char bucket[NAME_BYTES], prefix[NAME_BYTES + 8];
    natsSubscription *sub;
    uint64_t ttl_ms;
    kvr_nats_kv_fn fn;
    void *arg;
    pthread_t th;
    bool started;
} watch_t;

typedef struct sub {
    kvr_nats_t *n;
    natsSubscription *s;
    kvr_nats_msg_fn fn;
    void *arg;
} sub_t;

struct kvr_nats {
    natsConnection *nc;
    natsOptions *opts;
    jsCtx *js;
    struct event_base *base;
    struct event *wake;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    /* under mu */
    item_t *head, *tail;
    size_t n_items;
    kvr_nats_state_t state;
    uint64_t conn_gen;
    keep_t keep[MAX_KEEP];
    kvr_nats_stats_t st; /* the link's own counters (nats.c's are read on demand) */
    kvr_ratelimit_t rl;
    /* owner thread */
    kvr_nats_state_fn state_fn[MAX_LISTENERS];
    void *state_arg[MAX_LISTENERS];
    size_t n_listeners;
    sub_t *subs[MAX_SUBS];
    size_t n_subs;
    watch_t *watches[MAX_WATCH];
    size_t n_watches;
    pthread_t kv_th;
    bool kv_started;
};

const char *kvr_nats_state_name(kvr_nats_state_t s)
{
    static const char *const names[] = {"connecting", "connected", "disconnected"};
    return (unsigned)s < 3 ? names[s] : "?";
}

/* ---- the inbox: any thread in, the loop out ---- */

static void post(kvr_nats_t *n, item_t *it)
{
    pthread_mutex_lock(&n->mu);
    if (n->stop) { /* closing: nothing will run it */
        pthread_mutex_unlock(&n->mu);
        free(it);
        return;
    }
    if (n->n_items >= INBOX_MAX) {
        n->st.inbox_dropped++;
        kvr_log_limited(&n->rl, KVR_LOG_WARN,
                        "nats: a delivery was dropped (%zu waiting: the event loop is stalled)",
                        n->n_items);
        pthread_mutex_unlock(&n->mu);
        free(it);
        return;
    }
    it->next = NULL;
    if (n->tail != NULL)
        n->tail->next = it;
    else
        n->head = it;
    n->tail = it;
    n->n_items++;
    bool first = n->n_items == 1;
    pthread_mutex_unlock(&n->mu);
    if (first)
        event_active(n->wake, EV_READ, 0);
}

static item_t *item_new(item_kind_t kind, const char *subject, const char *reply,
                        const void *data, size_t len)
{
    size_t ls = subject ? strlen(subject) : 0, lr = reply ? strlen(reply) : 0;
    item_t *it = malloc(sizeof *it + len + ls + lr + 3);
    if (it == NULL)
        return NULL;
    it->kind = kind;
    it->len = len;
    if (len > 0)
        memcpy(it->data, data, len);
    it->data[len] = 0;
    it->subject = (char *)it->data + len + 1;
    memcpy(it->subject, subject ? subject : "", ls + 1);
    it->reply = it->subject + ls + 1;
    memcpy(it->reply, reply ? reply : "", lr + 1);
    return it;
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_nats_t *n = arg;
    pthread_mutex_lock(&n->mu);
    item_t *it = n->head;
    n->head = n->tail = NULL;
    n->n_items = 0;
    pthread_mutex_unlock(&n->mu);
    while (it != NULL) {
        item_t *next = it->next;
        switch (it->kind) {
        case IT_MSG:
            it->msg_fn(it->arg, it->subject, it->reply, it->data, it->len);
            break;
        case IT_KV:
            it->kv_fn(it->arg, (kvr_kv_op_t)it->op, it->subject,
                                     it->op == KVR_KV_CAUGHT_UP ? NULL : it->data, it->len);
            break;
        case IT_STATE:
            for (size_t i = 0; i < n->n_listeners; i++)
                n->state_fn[i](n->state_arg[i], (kvr_nats_state_t)it->op);
            break;
        }
        free(it);
        it = next;
    }
}

static bool stopping(kvr_nats_t *n)
{
    pthread_mutex_lock(&n->mu);
    bool s = n->stop;
    pthread_mutex_unlock(&n->mu);
    return s;
}

/* ---- connection ---- */

static void set_state(kvr_nats_t *n, kvr_nats_state_t st)
{
    pthread_mutex_lock(&n->mu);
    bool changed = n->state != st;
    n->state = st;
    if (st == KVR_NATS_CONNECTED)
        n->conn_gen++;
    else if (changed)
        n->st.disconnects++;
    for (size_t i = 0; st == KVR_NATS_CONNECTED && i < MAX_KEEP; i++)
        n->keep[i].due_ms = 0; /* re-put at once: the server may have restarted */
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    if (!changed || n->base == NULL)
        return;
    item_t *it = item_new(IT_STATE, NULL, NULL, NULL, 0);
    if (it != NULL) {
        it->op = (int)st;
        post(n, it);
    }
}

static void on_connected(natsConnection *nc, void *arg)
{
    (void)nc;
    kvr_nats_t *n = arg;
    set_state(n, KVR_NATS_CONNECTED);
    kvr_log(KVR_LOG_INFO, "nats: connected");
}

static void on_disconnected(natsConnection *nc, void *arg)
{
    kvr_nats_t *n = arg;
    kvr_nats_state_t was = kvr_nats_state(n);
    if (stopping(n))
        return;
    const char *text = NULL;
    if (nc != NULL && natsConnection_GetLastError(nc, &text) != NATS_OK && text != NULL &&
        text[0] != '\0') /* why the server closed: an authorization violation says so here */
        kvr_log_limited(&n->rl, KVR_LOG_WARN, "nats: %s", text);
    if (was == KVR_NATS_CONNECTED)
        kvr_log(KVR_LOG_WARN, "nats: disconnected; reconnecting (routing goes on with what "
                              "this router knows)");
    if (was != KVR_NATS_CONNECTING)
        set_state(n, KVR_NATS_DISCONNECTED);
}

/* The server closed the connection for good (nats.c gives up on an authorization failure):
 * said once, with the server's reason, since nothing will work after it. */
static void on_closed(natsConnection *nc, void *arg)
{
    kvr_nats_t *n = arg;
    const char *text = NULL;
    if (stopping(n) || nc == NULL || natsConnection_GetLastError(nc, &text) == NATS_OK ||
        text == NULL)
        return;
    kvr_log(KVR_LOG_ERROR, "nats: the server closed the connection: %s%s", text,
            strstr(text, "uthoriz") != NULL
                ? " (check nats_token_file, nats_nkey_file or nats_creds_file, and the "
                  "server's authorization block)"
                : "");
}

/* nats.c's asynchronous errors (a permission violation, a slow consumer): logged, limited. */
static void on_async_error(natsConnection *nc, natsSubscription *sub, natsStatus err, void *arg)
{
    (void)sub;
    kvr_nats_t *n = arg;
    const char *text = NULL;
    if (nc != NULL)
        (void)natsConnection_GetLastError(nc, &text);
    kvr_log_limited(&n->rl, KVR_LOG_WARN, "nats: %s%s%s", natsStatus_GetText(err),
                    text != NULL && text[0] != '\0' ? ": " : "", text != NULL ? text : "");
}

static int64_t backoff(natsConnection *nc, int attempts, void *arg)
{
    (void)nc;
    int64_t base = *(int64_t *)arg, cap = base * 8;
    int64_t d = base << (attempts < 4 ? attempts : 3);
    d = d > cap ? cap : d;
    return d / 2 + (int64_t)((uint64_t)rand() % (uint64_t)(d / 2 + 1));
}

static int64_t g_backoff_ms; /* nats.c passes the closure; one value for the process */

static int fail_nats(natsStatus s, const char *what, char *err, size_t err_len)
{
    snprintf(err, err_len, "nats: %s: %s", what, natsStatus_GetText(s));
    return KVR_EIO;
}

static int make_options(kvr_nats_t *n, const kvr_nats_config_t *cfg, char *err, size_t err_len)
{
    natsStatus s = natsOptions_Create(&n->opts);
    if (s == NATS_OK)
        s = natsOptions_SetURL(n->opts, cfg->url);
    if (s != NATS_OK)
        return snprintf(err, err_len, "nats_url: '%s' is not a NATS url (%s)", cfg->url,
                        natsStatus_GetText(s)),
               KVR_EINVAL;
    int rc = kvr_nats_auth_apply(n->opts, &cfg->auth, cfg->url, err, err_len);
    if (rc != KVR_OK)
        return rc;
    g_backoff_ms = cfg->reconnect_wait_ms ? (int64_t)cfg->reconnect_wait_ms : 250;
    if (s == NATS_OK && cfg->name != NULL)
        s = natsOptions_SetName(n->opts, cfg->name);
    if (s == NATS_OK)
        s = natsOptions_SetMaxReconnect(n->opts, -1);
    if (s == NATS_OK)
        s = natsOptions_SetCustomReconnectDelay(n->opts, backoff, &g_backoff_ms);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectBufSize(n->opts, 8 * 1024 * 1024);
    /* a publish is written at once by the publishing thread instead of waking nats.c's
     * flusher: our batches already coalesce (1 ms), and the wake-up (a condition signal and
     * a thread switch per publish) cost more than the write (bench sync, 2 cores) */
    if (s == NATS_OK)
        s = natsOptions_SetSendAsap(n->opts, true);
    /* the server does not send a connection its own messages back: a replica never has to
     * read (and check) its own batches to ignore them */
    if (s == NATS_OK)
        s = natsOptions_SetNoEcho(n->opts, true);
    if (s == NATS_OK)
        s = natsOptions_SetTimeout(n->opts, 2000);
    if (s == NATS_OK)
        s = natsOptions_SetPingInterval(n->opts, 2000);
    if (s == NATS_OK)
        s = natsOptions_SetMaxPingsOut(n->opts, 2);
    if (s == NATS_OK)
        s = natsOptions_SetDisconnectedCB(n->opts, on_disconnected, n);
    if (s == NATS_OK)
        s = natsOptions_SetReconnectedCB(n->opts, on_connected, n);
    if (s == NATS_OK)
        s = natsOptions_SetRetryOnFailedConnect(n->opts, true, on_connected, n);
    if (s == NATS_OK)
        s = natsOptions_SetErrorHandler(n->opts, on_async_error, n);
    if (s == NATS_OK)
        s = natsOptions_SetClosedCB(n->opts, on_closed, n);
    return s == NATS_OK ? KVR_OK : fail_nats(s, "options", err, err_len);
}

static void *kv_main(void *arg);

#define CONNECT_TRIES 3        /* a refusal must repeat before start-up fails on it */
#define CONNECT_RETRY_NS 250000000L

/* An unreachable server (none answered, or not in time): not an error, the link retries in the
 * background; anything else is the server refusing this process (identity, TLS, a handshake
 * it closed). */
static bool unreachable(natsStatus s)
{
    return s == NATS_NO_SERVER || s == NATS_TIMEOUT || s == NATS_NOT_YET_CONNECTED;
}

/* The first connection. Attempted in the foreground first, so that a server refusing this
 * process stops start-up with its reason; a refusal is believed only when it repeats
 * CONNECT_TRIES times (a valid nkey handshake was refused twice in ~130 test starts on a busy
 * machine, cause not found: one refusal is not taken for the configuration's). An unreachable
 * server: the connection is made in the background with retries, as before. */
static int first_connect(kvr_nats_t *n, const kvr_nats_config_t *cfg, char *err,
                         size_t err_len)
{
    natsStatus s = NATS_ERR;
    char why[300] = "";
    for (int i = 0; i < CONNECT_TRIES; i++) {
        if (i > 0) {
            struct timespec ts = {0, CONNECT_RETRY_NS};
            nanosleep(&ts, NULL);
        }
        natsOptions_SetRetryOnFailedConnect(n->opts, false, NULL, NULL);
        s = natsConnection_Connect(&n->nc, n->opts);
        if (s == NATS_OK) {
            on_connected(n->nc, n);
            break;
        }
        natsConnection_Destroy(n->nc);
        n->nc = NULL;
        if (unreachable(s))
            break;
        const char *t = nats_GetLastError(NULL);
        snprintf(why, sizeof why, "%s (%s)", natsStatus_GetText(s), t ? t : "no detail");
        kvr_log(KVR_LOG_WARN, "nats: %s refused this process (try %d of %d): %s", cfg->url,
                i + 1, CONNECT_TRIES, why);
    }
    natsOptions_SetRetryOnFailedConnect(n->opts, true, on_connected, n);
    if (s == NATS_OK)
        return KVR_OK;
    if (!unreachable(s)) {
        snprintf(err, err_len, "nats: %s refused this process: %s; check nats_url and the "
                 "nats_token_file, nats_nkey_file, nats_creds_file and nats_tls_* settings",
                 cfg->url, why);
        return KVR_EINVAL;
    }
    s = natsConnection_Connect(&n->nc, n->opts); /* in the background, retried */
    return s == NATS_OK || s == NATS_NOT_YET_CONNECTED ? KVR_OK
                                                       : fail_nats(s, "connect", err, err_len);
}

kvr_nats_t *kvr_nats_new(const kvr_nats_config_t *cfg, int *status, char *err, size_t err_len)
{
    int st_dummy;
    status = status ? status : &st_dummy;
    if (cfg == NULL || cfg->url == NULL || cfg->url[0] == '\0') {
        snprintf(err, err_len, "nats_url: empty");
        *status = KVR_EINVAL;
        return NULL;
    }
    kvr_nats_t *n = calloc(1, sizeof *n);
    if (n == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    n->rl = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 3);
    n->base = cfg->base;
    if (n->base != NULL && (n->wake = event_new(n->base, -1, 0, on_wake, n)) == NULL) {
        *status = KVR_ENOMEM;
        kvr_nats_free(n);
        return NULL;
    }
    int rc = make_options(n, cfg, err, err_len);
    natsStatus s = NATS_OK;
    if (rc == KVR_OK)
        rc = first_connect(n, cfg, err, err_len);
    if (rc == KVR_OK && (s = natsConnection_JetStream(&n->js, n->nc, NULL)) != NATS_OK)
        rc = fail_nats(s, "JetStream context", err, err_len);
    if (rc == KVR_OK) {
        if (pthread_create(&n->kv_th, NULL, kv_main, n) != 0)
            rc = KVR_ENOMEM;
        else
            n->kv_started = true;
    }
    if (rc != KVR_OK) {
        *status = rc;
        kvr_nats_free(n);
        return NULL;
    }
    *status = KVR_OK;
    return n;
}

int kvr_nats_on_state(kvr_nats_t *n, kvr_nats_state_fn fn, void *arg)
{
    if (n->n_listeners == MAX_LISTENERS)
        return KVR_EFULL;
    n->state_fn[n->n_listeners] = fn;
    n->state_arg[n->n_listeners++] = arg;
    return KVR_OK;
}

kvr_nats_state_t kvr_nats_state(const kvr_nats_t *n)
{
    pthread_mutex_lock((pthread_mutex_t *)&n->mu);
    kvr_nats_state_t st = n->state;
    pthread_mutex_unlock((pthread_mutex_t *)&n->mu);
    return st;
}

static void on_msg(natsConnection *nc, natsSubscription *s, natsMsg *m, void *arg)
{
    (void)nc;
    (void)s;
    sub_t *sb = arg;
    item_t *it = item_new(IT_MSG, natsMsg_GetSubject(m), natsMsg_GetReply(m), natsMsg_GetData(m),
                          (size_t)natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
    if (it == NULL)
        return;
    it->msg_fn = sb->fn;
    it->arg = sb->arg;
    post(sb->n, it);
}

int kvr_nats_subscribe(kvr_nats_t *n, const char *subject, kvr_nats_msg_fn fn, void *arg)
{
    if (n == NULL || n->base == NULL || subject == NULL || fn == NULL || n->n_subs == MAX_SUBS)
        return KVR_EINVAL;
    sub_t *sb = calloc(1, sizeof *sb);
    if (sb == NULL)
        return KVR_ENOMEM;
    *sb = (sub_t){.n = n, .fn = fn, .arg = arg};
    natsStatus s = natsConnection_Subscribe(&sb->s, n->nc, subject, on_msg, sb);
    if (s == NATS_OK)
        s = natsSubscription_SetPendingLimits(sb->s, -1, 256 * 1024 * 1024);
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "nats: subscribe %s: %s", subject, natsStatus_GetText(s));
        natsSubscription_Destroy(sb->s);
        free(sb);
        return KVR_EIO;
    }
    n->subs[n->n_subs++] = sb;
    return KVR_OK;
}

int kvr_nats_publish(kvr_nats_t *n, const char *subject, const char *reply, const void *data,
                     size_t len)
{
    natsStatus s = reply != NULL
                       ? natsConnection_PublishRequest(n->nc, subject, reply, data, (int)len)
                       : natsConnection_Publish(n->nc, subject, data, (int)len);
    if (s == NATS_OK)
        return KVR_OK;
    pthread_mutex_lock(&n->mu);
    n->st.publish_errors++;
    kvr_log_limited(&n->rl, KVR_LOG_WARN, "nats: publish on %s (%zu bytes): %s", subject, len,
                    natsStatus_GetText(s));
    pthread_mutex_unlock(&n->mu);
    return KVR_EIO;
}

size_t kvr_nats_max_payload(kvr_nats_t *n)
{
    int64_t m = natsConnection_GetMaxPayload(n->nc);
    return m > 0 ? (size_t)m : (size_t)1 << 20;
}

/* ---- buckets ---- */

/* The bucket, created (max age ttl_ms) or bound; NULL with the reason logged (rate-limited). */
static kvStore *open_bucket(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms)
{
    kvStore *kv = NULL;
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = bucket;
    kc.History = 1;
    kc.TTL = (int64_t)ttl_ms * 1000000; /* nanoseconds */
    natsStatus s = js_CreateKeyValue(&kv, n->js, &kc);
    char why[256];
    snprintf(why, sizeof why, "%s", nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
    if (s != NATS_OK)
        s = js_KeyValue(&kv, n->js, bucket); /* exists with other settings: use it */
    if (s != NATS_OK) {
        pthread_mutex_lock(&n->mu);
        kvr_log_limited(&n->rl, KVR_LOG_WARN,
                        "nats: bucket %s: cannot create it (%s) nor bind it (%s); is "
                        "JetStream enabled on the server?", bucket, why, natsStatus_GetText(s));
        pthread_mutex_unlock(&n->mu);
        return NULL;
    }
    return kv;
}

static void post_kv(watch_t *w, kvr_kv_op_t op, const char *key, const void *val, size_t len)
{
    item_t *it = item_new(IT_KV, key, NULL, val, len);
    if (it == NULL)
        return;
    it->kv_fn = w->fn;
    it->arg = w->arg;
    it->op = (int)op;
    post(w->n, it);
}


static uint64_t conn_gen(kvr_nats_t *n)
{
    pthread_mutex_lock(&n->mu);
    uint64_t g = n->state == KVR_NATS_CONNECTED ? n->conn_gen : 0;
    pthread_mutex_unlock(&n->mu);
    return g;
}

static void count(kvr_nats_t *n, uint64_t *c)
{
    pthread_mutex_lock(&n->mu);
    (*c)++;
    pthread_mutex_unlock(&n->mu);
}

/* Waits up to ms for a state change or stop (the threads' idle wait). */
static void nap(kvr_nats_t *n, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&n->mu);
    if (!n->stop)
        pthread_cond_timedwait(&n->cv, &n->mu, &ts);
    pthread_mutex_unlock(&n->mu);
}

/* A live change of a watched bucket: a core message on $KV.<bucket>.<key> (a delete or purge
 * says so in its KV-Operation header). */
static void on_kv_msg(natsConnection *nc, natsSubscription *sub, natsMsg *m, void *arg)
{
    (void)nc;
    (void)sub;
    watch_t *w = arg;
    const char *subject = natsMsg_GetSubject(m), *op = NULL;
    size_t skip = strlen(w->prefix);
    if (strncmp(subject, w->prefix, skip) == 0 && subject[skip] != '\0') {
        bool del = natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK && op != NULL &&
                   (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0);
        count(w->n, &w->n->st.kv_entries_seen);
        if (del)
            post_kv(w, KVR_KV_DELETE, subject + skip, NULL, 0);
        else
            post_kv(w, KVR_KV_PUT, subject + skip, natsMsg_GetData(m),
                    (size_t)natsMsg_GetDataLength(m));
    }
    natsMsg_Destroy(m);
}

/* Every entry the bucket holds now, then CAUGHT_UP. False when the bucket could not be read
 * (retried). */
static bool load_entries(watch_t *w)
{
    kvStore *kv = open_bucket(w->n, w->bucket, w->ttl_ms);
    if (kv == NULL)
        return false;
    kvKeysList keys = {0};
    natsStatus s = kvStore_Keys(&keys, kv, NULL);
    if (s != NATS_OK && s != NATS_NOT_FOUND) {
        kvStore_Destroy(kv);
        return false;
    }
    for (int i = 0; s == NATS_OK && i < keys.Count; i++) {
        kvEntry *e = NULL;
        if (kvStore_Get(&e, kv, keys.Keys[i]) == NATS_OK && e != NULL) {
            count(w->n, &w->n->st.kv_entries_seen);
            post_kv(w, KVR_KV_PUT, kvEntry_Key(e), kvEntry_Value(e),
                    (size_t)kvEntry_ValueLen(e));
        }
        kvEntry_Destroy(e);
    }
    kvKeysList_Destroy(&keys);
    kvStore_Destroy(kv);
    post_kv(w, KVR_KV_CAUGHT_UP, "", NULL, 0);
    return true;
}

/* One watch's thread: at each (re)connection, the entries present (the live changes come by
 * the subscription, which nats.c keeps across reconnects). A JetStream watcher is not used:
 * its consumer does not survive a server restart, and tearing it down then hits a
 * use-after-free inside libnats 3.4 (found by ASan in test_replicas' outage scenario). */
static void *watch_main(void *arg)
{
    watch_t *w = arg;
    kvr_nats_t *n = w->n;
    uint64_t loaded = 0;
    while (!stopping(n)) {
        uint64_t g = conn_gen(n);
        if (g == 0 || g == loaded) {
            nap(n, 100);
            continue;
        }
        if (load_entries(w)) {
            if (loaded != 0)
                count(n, &n->st.kv_watch_restarts);
            loaded = g;
        } else {
            nap(n, 500);
        }
    }
    return NULL;
}

int kvr_nats_kv_watch(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, kvr_nats_kv_fn fn,
                      void *arg)
{
    if (n == NULL || n->base == NULL || fn == NULL || !kvr_token_ok(bucket) ||
        n->n_watches == MAX_WATCH)
        return KVR_EINVAL;
    watch_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return KVR_ENOMEM;
    *w = (watch_t){.n = n, .ttl_ms = ttl_ms, .fn = fn, .arg = arg};
    snprintf(w->bucket, sizeof w->bucket, "%s", bucket);
    snprintf(w->prefix, sizeof w->prefix, "$KV.%s.", bucket);
    char subject[NAME_BYTES + 16];
    snprintf(subject, sizeof subject, "%s>", w->prefix);
    natsStatus s = natsConnection_Subscribe(&w->sub, n->nc, subject, on_kv_msg, w);
    if (s != NATS_OK) {
        kvr_log(KVR_LOG_ERROR, "nats: subscribe %s: %s", subject, natsStatus_GetText(s));
        free(w);
        return KVR_EIO;
    }
    natsSubscription_SetPendingLimits(w->sub, -1, 64 * 1024 * 1024);
    if (pthread_create(&w->th, NULL, watch_main, w) != 0) {
        natsSubscription_Destroy(w->sub);
        free(w);
        return KVR_ENOMEM;
    }
    w->started = true;
    n->watches[n->n_watches++] = w;
    return KVR_OK;
}

int kvr_nats_kv_list(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, uint64_t wait_ms,
                     kvr_nats_entry_fn fn, void *arg)
{
    if (n == NULL || fn == NULL || !kvr_token_ok(bucket))
        return KVR_EINVAL;
    uint64_t end = kvr_now_ms() + wait_ms;
    while (conn_gen(n) == 0 && kvr_now_ms() < end)
        nap(n, 20);
    if (conn_gen(n) == 0)
        return KVR_EIO;
    kvStore *kv = open_bucket(n, bucket, ttl_ms);
    if (kv == NULL)
        return KVR_EIO;
    kvKeysList keys = {0};
    natsStatus s = kvStore_Keys(&keys, kv, NULL);
    int64_t now_ns = (int64_t)kvr_wall_ns();
    for (int i = 0; s == NATS_OK && i < keys.Count; i++) {
        kvEntry *e = NULL;
        if (kvStore_Get(&e, kv, keys.Keys[i]) == NATS_OK && e != NULL) {
            int64_t age = now_ns - kvEntry_Created(e);
            fn(arg, kvEntry_Key(e), kvEntry_Value(e), (size_t)kvEntry_ValueLen(e),
               age > 0 ? (uint64_t)age / 1000000u : 0);
        }
        kvEntry_Destroy(e);
    }
    kvKeysList_Destroy(&keys);
    kvStore_Destroy(kv);
    return s == NATS_OK || s == NATS_NOT_FOUND ? KVR_OK : KVR_EIO;
}

/* ---- kept entries: the kv thread ---- */

static keep_t *find_keep(kvr_nats_t *n, const char *bucket, const char *key)
{
    for (size_t i = 0; i < MAX_KEEP; i++)
        if (n->keep[i].used && strcmp(n->keep[i].bucket, bucket) == 0 &&
            strcmp(n->keep[i].key, key) == 0)
            return &n->keep[i];
    return NULL;
}

int kvr_nats_kv_keep(kvr_nats_t *n, const char *bucket, uint64_t ttl_ms, const char *key,
                     const void *val, size_t len, uint64_t period_ms)
{
    if (n == NULL || !kvr_token_ok(bucket) || key == NULL || key[0] == '\0' ||
        strlen(key) >= NAME_BYTES || period_ms == 0)
        return KVR_EINVAL;
    uint8_t *copy = malloc(len ? len : 1);
    if (copy == NULL)
        return KVR_ENOMEM;
    memcpy(copy, val, len);
    pthread_mutex_lock(&n->mu);
    keep_t *k = find_keep(n, bucket, key);
    for (size_t i = 0; k == NULL && i < MAX_KEEP; i++)
        if (!n->keep[i].used)
            k = &n->keep[i];
    if (k == NULL) {
        pthread_mutex_unlock(&n->mu);
        free(copy);
        return KVR_EFULL;
    }
    free(k->val);
    *k = (keep_t){.ttl_ms = ttl_ms, .period_ms = period_ms, .val = copy, .len = len,
                  .used = true};
    snprintf(k->bucket, sizeof k->bucket, "%s", bucket);
    snprintf(k->key, sizeof k->key, "%s", key);
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    return KVR_OK;
}

int kvr_nats_kv_drop(kvr_nats_t *n, const char *bucket, const char *key)
{
    if (n == NULL || bucket == NULL || key == NULL)
        return KVR_EINVAL;
    pthread_mutex_lock(&n->mu);
    keep_t *k = find_keep(n, bucket, key);
    if (k != NULL) {
        k->drop = true;
        k->due_ms = 0;
        pthread_cond_broadcast(&n->cv);
    }
    pthread_mutex_unlock(&n->mu);
    return k != NULL ? KVR_OK : KVR_ENOTFOUND;
}

/* Bucket handles the kv thread keeps open (by name). */
typedef struct kv_open {
    char bucket[NAME_BYTES];
    kvStore *kv;
    uint64_t gen;
} kv_open_t;

static kvStore *bucket_for(kvr_nats_t *n, kv_open_t *open, const keep_t *k, uint64_t gen)
{
    size_t free_slot = MAX_KEEP;
    for (size_t i = 0; i < MAX_KEEP; i++) {
        if (open[i].kv != NULL && strcmp(open[i].bucket, k->bucket) == 0) {
            if (open[i].gen == gen)
                return open[i].kv;
            kvStore_Destroy(open[i].kv); /* reconnected: bind (or create) it again */
            open[i].kv = NULL;
            free_slot = i;
            break;
        }
        if (open[i].kv == NULL && free_slot == MAX_KEEP)
            free_slot = i;
    }
    if (free_slot == MAX_KEEP)
        return NULL;
    kvStore *kv = open_bucket(n, k->bucket, k->ttl_ms);
    if (kv != NULL) {
        snprintf(open[free_slot].bucket, NAME_BYTES, "%s", k->bucket);
        open[free_slot].kv = kv;
        open[free_slot].gen = gen;
    }
    return kv;
}

/* Does one due keep (put or delete) without mu; true if it did something. */
static bool kv_step(kvr_nats_t *n, kv_open_t *open)
{
    uint64_t now = kvr_now_ms(), gen = conn_gen(n);
    if (gen == 0)
        return false;
    keep_t job;
    size_t idx = MAX_KEEP;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < MAX_KEEP && idx == MAX_KEEP; i++)
        if (n->keep[i].used && n->keep[i].due_ms <= now)
            idx = i;
    if (idx != MAX_KEEP) {
        job = n->keep[idx];
        job.val = malloc(job.len ? job.len : 1);
        if (job.val != NULL)
            memcpy(job.val, n->keep[idx].val, job.len);
        n->keep[idx].due_ms = now + n->keep[idx].period_ms; /* a failure retries then */
    }
    pthread_mutex_unlock(&n->mu);
    if (idx == MAX_KEEP || job.val == NULL)
        return false;
    kvStore *kv = bucket_for(n, open, &job, gen);
    natsStatus s = NATS_ERR;
    if (kv != NULL)
        s = job.drop ? kvStore_Delete(kv, job.key)
                     : kvStore_Put(NULL, kv, job.key, job.val, (int)job.len);
    pthread_mutex_lock(&n->mu);
    if (job.drop) {
        n->st.kv_deletes += s == NATS_OK;
        if (s == NATS_OK || n->stop) {
            free(n->keep[idx].val);
            n->keep[idx] = (keep_t){0};
        }
    } else if (s == NATS_OK) {
        n->st.kv_puts++;
    } else {
        n->st.kv_put_errors++;
        n->keep[idx].due_ms = now + 250; /* retry soon */
        kvr_log_limited(&n->rl, KVR_LOG_WARN, "nats: put %s/%s: %s", job.bucket, job.key,
                        natsStatus_GetText(s));
        for (size_t i = 0; kv != NULL && i < MAX_KEEP; i++)
            if (open[i].kv == kv) { /* rebind next time (the bucket may be gone) */
                kvStore_Destroy(kv);
                open[i].kv = NULL;
            }
    }
    pthread_mutex_unlock(&n->mu);
    free(job.val);
    return true;
}

static bool drops_pending(kvr_nats_t *n)
{
    pthread_mutex_lock(&n->mu);
    bool any = false;
    for (size_t i = 0; i < MAX_KEEP; i++)
        any |= n->keep[i].used && n->keep[i].drop;
    pthread_mutex_unlock(&n->mu);
    return any;
}

static void *kv_main(void *arg)
{
    kvr_nats_t *n = arg;
    kv_open_t open[MAX_KEEP];
    memset(open, 0, sizeof open);
    while (!stopping(n)) {
        if (!kv_step(n, open))
            nap(n, 50);
    }
    /* stopping: the deletes asked for (free drops every kept entry) get DROP_DEADLINE_MS */
    uint64_t end = kvr_now_ms() + DROP_DEADLINE_MS;
    while (drops_pending(n) && kvr_now_ms() < end && conn_gen(n) != 0)
        if (!kv_step(n, open))
            nap(n, 20);
    for (size_t i = 0; i < MAX_KEEP; i++)
        kvStore_Destroy(open[i].kv);
    return NULL;
}

/* ---- figures and teardown ---- */

void kvr_nats_stats(kvr_nats_t *n, kvr_nats_stats_t *out)
{
    pthread_mutex_lock(&n->mu);
    *out = n->st;
    out->state = n->state;
    pthread_mutex_unlock(&n->mu);
    natsStatistics *ns = NULL;
    if (n->nc != NULL && natsStatistics_Create(&ns) == NATS_OK &&
        natsConnection_GetStats(n->nc, ns) == NATS_OK)
        natsStatistics_GetCounts(ns, &out->in_msgs, &out->in_bytes, &out->out_msgs,
                                 &out->out_bytes, &out->reconnects);
    natsStatistics_Destroy(ns);
}

void kvr_nats_free(kvr_nats_t *n)
{
    if (n == NULL)
        return;
    pthread_mutex_lock(&n->mu);
    for (size_t i = 0; i < MAX_KEEP; i++)
        if (n->keep[i].used) {
            n->keep[i].drop = true;
            n->keep[i].due_ms = 0;
        }
    n->stop = true;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    for (size_t i = 0; i < n->n_watches; i++)
        pthread_join(n->watches[i]->th, NULL);
    if (n->kv_started)
        pthread_join(n->kv_th, NULL);
    for (size_t i = 0; i < n->n_subs; i++) {
        natsSubscription_Unsubscribe(n->subs[i]->s);
        natsSubscription_Destroy(n->subs[i]->s);
    }
    for (size_t i = 0; i < n->n_watches; i++) {
        natsSubscription_Unsubscribe(n->watches[i]->sub);
        natsSubscription_Destroy(n->watches[i]->sub);
    }
    jsCtx_Destroy(n->js);
    if (n->nc != NULL) {
        natsConnection_Close(n->nc);
        natsConnection_Destroy(n->nc);
    }
    natsOptions_Destroy(n->opts);
    /* every library thread gone before what its callbacks use is freed: nats.c may still
     * deliver the close's disconnect callback, or a message, after Close returns */
    nats_CloseAndWait(5000);
    for (size_t i = 0; i < n->n_subs; i++)
        free(n->subs[i]);
    for (size_t i = 0; i < n->n_watches; i++)
        free(n->watches[i]);
    for (size_t i = 0; i < MAX_KEEP; i++)
        free(n->keep[i].val);
    for (item_t *it = n->head, *next; it != NULL; it = next) {
        next = it->next;
        free(it);
    }
    if (n->wake != NULL)
        event_free(n->wake);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    free(n);
}
