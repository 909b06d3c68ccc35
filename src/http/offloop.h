/*
 * offloop.h: a blocking job run on a thread of its own while a serving loop goes on, its end
 * handed back on the loop (a tokenizer a registration names, a peer's index snapshot at
 * start-up: 0.1 s to tens of seconds a serving thread must never wait).
 *
 *   o = kvr_offloop_start(base, &job)   job.work(arg) on a new thread; then job.done(arg) on
 *                                       the loop (after the thread is joined)
 *   kvr_offloop_abandon(o)              the loop stops caring (shutdown): done is never
 *                                       called; job.drop(arg) is, once work has ended (at
 *                                       once if it had, else on the job's thread), never
 *                                       blocking the caller
 *
 * Ownership: a job owns its thread, eventfd and event, and frees them itself after done, or
 * after drop; arg is the caller's until done or drop is called with it. work must touch only
 * what arg holds (it may outlive the loop when abandoned). Threads: start and abandon on the
 * loop's thread; done there; work and (maybe) drop on the job's. Cost: one thread a job.
 */
#ifndef KVR_HTTP_OFFLOOP_H
#define KVR_HTTP_OFFLOOP_H

struct event_base;
typedef struct kvr_offloop kvr_offloop_t;

typedef struct kvr_offloop_job {
    void (*work)(void *arg); /* on the job's thread */
    void (*done)(void *arg); /* on the loop, once work ended */
    void (*drop)(void *arg); /* instead of done when abandoned */
    void *arg;
} kvr_offloop_job_t;

/* NULL with *status (KVR_ENOMEM: no memory, fd or thread); nothing runs then. */
kvr_offloop_t *kvr_offloop_start(struct event_base *base, const kvr_offloop_job_t *job,
                                 int *status);
/* NULL is ignored. */
void kvr_offloop_abandon(kvr_offloop_t *o);

#endif
