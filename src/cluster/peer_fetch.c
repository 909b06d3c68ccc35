/*
 * peer_fetch.c: see peer_fetch.h. The thread and the loop share one mutex-guarded word, who
 * frees the fetch: the loop (the thread ended and signalled the eventfd first) or the thread
 * (the loop abandoned it first). The thread never reads the loop's memory: everything it
 * needs was copied at start.
 */
#include "cluster/peer_fetch.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "base/log.h"
#include "http/http.h"
#include "kvrouter/status.h"
#include "wire/index_snapshot.h"

#define MAX_URLS 16

struct kvr_peer_fetch {
    char urls[MAX_URLS][256];
    size_t n;
    char bearer[512];
    uint64_t timeout_ms;
    size_t max_bytes;
    kvr_peer_fetch_done_fn done;
    void *arg;
    int fd;
    struct event *ev;
    pthread_t th;
    pthread_mutex_t mu;
    bool ended, abandoned; /* under mu */
    /* the result, written by the thread before ended */
    uint8_t *body;
    size_t len;
    size_t from; /* the url that gave it */
};

static void release(kvr_peer_fetch_t *f)
{
    if (f->ev != NULL)
        event_free(f->ev);
    if (f->fd >= 0)
        close(f->fd);
    pthread_mutex_destroy(&f->mu);
    free(f->body);
    free(f);
}

static void *fetch_main(void *arg)
{
    kvr_peer_fetch_t *f = arg;
    for (size_t i = 0; i < f->n && f->body == NULL; i++) {
        kvr_http_fetch_t q = {.url = f->urls[i], .path = "/v1/index/snapshot",
                              .bearer = f->bearer, .timeout_ms = f->timeout_ms,
                              .max_bytes = f->max_bytes, .magic = KVR_SNAP_MAGIC,
                              .magic_len = KVR_SNAP_MAGIC_LEN};
        uint8_t *body = NULL;
        size_t len = 0;
        int status = 0;
        char err[400] = "";
        int rc = kvr_http_fetch(&q, &body, &len, &status, err, sizeof err);
        if (rc == KVR_OK && status == 200) {
            f->body = body;
            f->len = len;
            f->from = i;
            break;
        }
        if (rc == KVR_OK)
            snprintf(err, sizeof err, "GET %s/v1/index/snapshot answered %d%s", f->urls[i],
                     status,
                     status == 401   ? " (the peers need the same peer_key_file)"
                     : status == 503 ? " (it is loading its own index)"
                                     : "");
        free(body);
        kvr_log(KVR_LOG_WARN, "index: peer %s: %s", f->urls[i], err);
    }
    pthread_mutex_lock(&f->mu);
    bool abandoned = f->abandoned;
    f->ended = true;
    pthread_mutex_unlock(&f->mu);
    if (abandoned) {
        release(f);
        return NULL;
    }
    uint64_t one = 1;
    while (write(f->fd, &one, sizeof one) < 0) /* only EINTR refuses an eventfd write */
        ;
    return NULL;
}

static void on_ended(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_peer_fetch_t *f = arg;
    pthread_join(f->th, NULL);
    uint8_t *body = f->body;
    f->body = NULL;
    f->done(f->arg, body != NULL ? f->urls[f->from] : NULL, body, f->len);
    release(f);
}

kvr_peer_fetch_t *kvr_peer_fetch_start(const kvr_peer_fetch_config_t *c, int *status)
{
    kvr_peer_fetch_t *f = calloc(1, sizeof *f);
    if (f == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    f->fd = -1;
    pthread_mutex_init(&f->mu, NULL);
    for (size_t i = 0; i < c->n_urls && f->n < MAX_URLS; i++)
        if (strlen(c->urls[i]) < sizeof f->urls[0])
            snprintf(f->urls[f->n++], sizeof f->urls[0], "%s", c->urls[i]);
    snprintf(f->bearer, sizeof f->bearer, "%s", c->bearer != NULL ? c->bearer : "");
    f->timeout_ms = c->timeout_ms;
    f->max_bytes = c->max_bytes;
    f->done = c->done;
    f->arg = c->arg;
    f->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    f->ev = f->fd >= 0 ? event_new(c->base, f->fd, EV_READ, on_ended, f) : NULL;
    if (f->ev == NULL || event_add(f->ev, NULL) != 0 ||
        pthread_create(&f->th, NULL, fetch_main, f) != 0) {
        release(f);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return f;
}

void kvr_peer_fetch_abandon(kvr_peer_fetch_t *f)
{
    if (f == NULL)
        return;
    event_free(f->ev); /* on the loop's thread: the loop never hears of it again */
    f->ev = NULL;
    pthread_mutex_lock(&f->mu);
    bool ended = f->ended;
    f->abandoned = true;
    pthread_mutex_unlock(&f->mu);
    if (ended) { /* its eventfd was written, but the loop will not read it now */
        pthread_join(f->th, NULL);
        release(f);
    } else {
        pthread_detach(f->th);
    }
}
