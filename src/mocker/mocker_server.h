/*
 * mocker_server.h (private to src/mocker): the mocker's HTTP side that every other file of it
 * answers through: the reply helpers (mk_reply_*: a body, the JSON writer's document, an
 * error in vLLM's OpenAI shape, counted by status for /metrics), a request's body, and a
 * listener bound for a request callback (the OpenAI port, the bootstrap server).
 * Invariants: a reply helper answers req exactly once; m->out and m->w are scratch, reused by
 * every reply (nothing may hold them across a call). Ownership: the listener is the caller's
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

void mk_reply_body(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *ctype,
                   const char *body, size_t len);
/* The JSON m->w holds; 500 when it cannot be finished. */
void mk_reply_json(kvr_mocker_t *m, struct evhttp_request *req, int code);
void mk_reply_error(kvr_mocker_t *m, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Counts an error answered some other way (an error event ending a stream). */
void mk_count_error(kvr_mocker_t *m, int code);

/* req's body, contiguous ("" when empty); valid until req is answered. */
const char *mk_body_of(struct evhttp_request *req, size_t *len);

/* *http: a new evhttp on m's loop (bodies up to max_body, every request to cb(req, arg))
 * listening on the configured host at port (0: a free one; *bs is the bound socket).
 * KVR_OK; KVR_ENOMEM; KVR_EIO with err naming the flag `what` (the port taken, or a bad
 * address). *http is set even on failure: the caller frees it. */
int mk_listen(kvr_mocker_t *m, const char *what, uint16_t port, size_t max_body,
              void (*cb)(struct evhttp_request *, void *), void *arg, struct evhttp **http,
              struct evhttp_bound_socket **bs, char *err, size_t err_len);

#endif /* KVR_MOCKER_SERVER_H */
