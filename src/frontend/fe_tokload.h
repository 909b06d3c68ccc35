/*
 * fe_tokload.h: a tokenizer loaded off the serving loop (fe_tokload.c). Loading a
 * 150K-vocabulary tokenizer.json takes 0.1-0.4 s (tokenizer/model.h), far too long to hold
 * the HTTP thread when a worker registration names one at run time; the load runs on a thread
 * of its own and its result is handed back on the loop.
 * Ownership: a load owns its thread, its eventfd and its event until done has run (then it is
 * freed) or it is cancelled. Threads: start, done and cancel on the loop's thread; the load
 * itself on its own. Cost: one thread per load (a registration naming a new tokenizer).
 */
#ifndef KVR_FRONTEND_FE_TOKLOAD_H
#define KVR_FRONTEND_FE_TOKLOAD_H

#include "tokenizer/model.h"

struct event_base;
typedef struct fe_tokload fe_tokload_t;

/* On the loop, once the load ended: m (the callee's) or NULL with status and why. */
typedef void (*fe_tokload_done_fn)(void *arg, fe_tokload_t *l, kvr_tokmodel_t *m, int status,
                                   const char *why);

/* Starts loading dir; NULL when it cannot start (out of memory, no thread: *status). */
fe_tokload_t *fe_tokload_start(struct event_base *base, const char *dir, fe_tokload_done_fn done,
                               void *arg, int *status);
/* Waits for the load's thread and drops its result; done is not called. */
void fe_tokload_cancel(fe_tokload_t *l);

#endif
