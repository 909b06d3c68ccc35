/*
 * mocker_server.h (private to src/mocker): the mocker's HTTP side that every other file of it
 * answers through: its error reply (in vLLM's OpenAI shape, counted by status for /metrics;
 * other replies are http/reply.h's on m->rep), and a listener bound for a request callback
 * (the OpenAI port, the bootstrap server).
 * Invariants: a reply answers req exactly once; m->w is scratch, reused by every reply
 * (nothing may hold it across a call). Ownership: the listener is the caller's
 * (evhttp_free). Threads: the loop thread only. Cost: one copy of a body into m->out.
 */
#ifndef KVR_MOCKER_SERVER_H
#define KVR_MOCKER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "mocker/mocker_state.h"

struct evhttp;
struct evhttp_bound_socket;
struct evhttp_request;

/* A body: kvr_reply_body(&m->rep, ...); the JSON m->w holds: kvr_reply_writer(&m->rep, ...).
 * An error in vLLM's OpenAI shape, counted by status for /metrics: */
void mk_reply_error(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Counts an error answered some other way (an error event ending a stream). */
void mk_count_error(kvr_mocker_t *m, int code);

/* *http: a new evhttp on m's loop (bodies up to max_body, every request to cb(req, arg))
 * listening on the configured host at port (0: a free one; *bs is the bound socket).
 * KVR_OK; KVR_ENOMEM; KVR_EIO with err naming the flag `what` (the port taken, or a bad
 * address). *http is set even on failure: the caller frees it. */
int mk_listen(kvr_mocker_t *m, const char *what, uint16_t port, size_t max_body,
              void (*cb)(struct evhttp_request *, void *), void *arg, struct evhttp **http,
              struct evhttp_bound_socket **bs, char *err, size_t err_len);

#endif /* KVR_MOCKER_SERVER_H */
