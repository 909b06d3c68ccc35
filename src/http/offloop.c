/*
 * offloop.c: see offloop.h. The thread and the loop share one mutex-guarded pair of flags that
 * decide who finishes the job: the loop (work ended first: its eventfd is read, the thread
 * joined, done called) or the thread (the loop abandoned it first: drop called there, the
 * thread detached). The event is freed on the loop's thread in every case, so the job's thread
 * never touches the loop's base.
 */
#include "http/offloop.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <event2/event.h>

#include "kvrouter/status.h"

struct kvr_offloop {
    kvr_offloop_job_t job;
    int fd;
    struct event *ev;
    pthread_t th;
    pthread_mutex_t mu;
    bool ended, abandoned; /* under mu */
};

static void release(kvr_offloop_t *o)
{
    if (o->fd >= 0)
        close(o->fd);
    pthread_mutex_destroy(&o->mu);
    free(o);
}

static void *job_main(void *arg)
{
    kvr_offloop_t *o = arg;
    o->job.work(o->job.arg);
    pthread_mutex_lock(&o->mu);
    bool abandoned = o->abandoned;
    o->ended = true;
    pthread_mutex_unlock(&o->mu);
    if (abandoned) {
        o->job.drop(o->job.arg);
        release(o);
        return NULL;
    }
    uint64_t one = 1;
    while (write(o->fd, &one, sizeof one) < 0) /* only EINTR refuses an eventfd write */
        ;
    return NULL;
}

static void on_ended(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    kvr_offloop_t *o = arg;
    pthread_join(o->th, NULL);
    event_free(o->ev);
    kvr_offloop_job_t job = o->job;
    release(o);
    job.done(job.arg);
}

kvr_offloop_t *kvr_offloop_start(struct event_base *base, const kvr_offloop_job_t *job,
                                 int *status)
{
    kvr_offloop_t *o = calloc(1, sizeof *o);
    if (o == NULL) {
        *status = KVR_ENOMEM;
        return NULL;
    }
    o->job = *job;
    pthread_mutex_init(&o->mu, NULL);
    o->fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    o->ev = o->fd >= 0 ? event_new(base, o->fd, EV_READ, on_ended, o) : NULL;
    if (o->ev == NULL || event_add(o->ev, NULL) != 0 ||
        pthread_create(&o->th, NULL, job_main, o) != 0) {
        if (o->ev != NULL)
            event_free(o->ev);
        release(o);
        *status = KVR_ENOMEM;
        return NULL;
    }
    *status = KVR_OK;
    return o;
}

void kvr_offloop_abandon(kvr_offloop_t *o)
{
    if (o == NULL)
        return;
    event_free(o->ev); /* on the loop's thread: the loop never hears of it again */
    pthread_mutex_lock(&o->mu);
    bool ended = o->ended;
    o->abandoned = true;
    pthread_mutex_unlock(&o->mu);
    if (ended) { /* it signalled, but the loop will not read the signal now */
        pthread_join(o->th, NULL);
        o->job.drop(o->job.arg);
        release(o);
    } else {
        pthread_detach(o->th);
    }
}
