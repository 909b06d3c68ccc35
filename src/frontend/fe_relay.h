/*
 * fe_relay.h: a worker's streamed answer cut into whole SSE events for the client
 * (fe_relay.c). Reads p->up.sse and p->client; the machine sends what it produced.
 */
#ifndef KVR_FRONTEND_FE_RELAY_H
#define KVR_FRONTEND_FE_RELAY_H

#include <stdbool.h>

#include <event2/buffer.h>

#include "frontend/fe_req.h"

/* The complete events held in p->up.sse (all of it when final) appended to out, each counted
 * and given the worker's nvext when asked; on_token(p) for each event carrying a token, in
 * order. */
void fe_relay_events(fe_req_t *p, bool final, struct evbuffer *out,
                     void (*on_token)(fe_req_t *p));

#endif
