/*
 * fe_tokload.c: see fe_tokload.h. The thread writes the eventfd once its load has ended; the
 * loop's event on that fd joins it and calls done. Nothing is shared while the thread runs
 * but the fields it writes (m, status, why), read by the loop only after the join.
 */
#include "frontend/fe_tokload.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "kvrouter/status.h"

struct fe_tokload {
    char dir[1024];
    fe_tokload_done_fn done;
    void *arg;
    int fd;
    struct event *ev;
    pthread_t th;
    bool started;
    kvr_tokmodel_t *m; /* written by the thread */
    int status;
    char why[512];
};

static void *load_main(void *arg)
{
    fe_tokload_t *l = arg;
    l->m = kvr_tokmodel_load(l->dir, &l->status, l->why, sizeof l->why);
    uint64_t one = 1;
    while (write(l->fd, &one, sizeof one) < 0) /* only EINTR can refuse an eventfd write */
        ;
    return NULL;
}

static void release(fe_tokload_t *l)
{
    if (l->ev != NULL)
        event_free(l->ev);
    if (l->fd >= 0)
        close(l->fd);
    free(l);
}

static void on_done(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    fe_tokload_t *l = arg;
    pthread_join(l->th, NULL);
    l->done(l->arg, l, l->m, l->status, l->why);
    release(l);
}

fe_tokload_t *fe_tokload_start(struct event_base *base, const char *dir, fe_tokload_done_fn done,
                               void *arg, int *status)
{
    fe_tokload_t *l = calloc(1, sizeof *l);
    if (l == NULL || strlen(dir) >= sizeof l->dir) {
        *status = l == NULL ? KVR_ENOMEM : KVR_EINVAL;
        free(l);
        return NULL;
    }
    snprintf(l->dir, sizeof l->dir, "%s", dir);
    l->done = done;
    l->arg = arg;
    l->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    l->ev = l->fd >= 0 ? event_new(base, l->fd, EV_READ, on_done, l) : NULL;
    if (l->ev == NULL || event_add(l->ev, NULL) != 0 ||
        pthread_create(&l->th, NULL, load_main, l) != 0) {
        *status = KVR_ENOMEM;
        release(l);
        return NULL;
    }
    l->started = true;
    *status = KVR_OK;
    return l;
}

void fe_tokload_cancel(fe_tokload_t *l)
{
    if (l == NULL)
        return;
    if (l->started)
        pthread_join(l->th, NULL);
    kvr_tokmodel_free(l->m);
    release(l);
}
