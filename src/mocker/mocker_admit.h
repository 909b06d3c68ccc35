/*
 * mocker_admit.h (private to src/mocker): the mocker's requests, from the HTTP request to the
 * last token: decoding and checking (model, lengths, rank, a disaggregated role's plan),
 * admission to a rank's engine (or first a KV fetch, mocker_kv.h), the token stream or whole
 * answer, and the client's disconnect.
 * Invariants: every live request (mreq) is live in its rank's engine or in its KV fetch, has
 * its connection's close callback pointing at it, and (non-streaming) is on m->waiting_whole;
 * nothing else points at it. It is freed when its last token is sent, when it fails, or when
 * its client goes away (cancelled in the engine first).
 * Ownership: the requests are m's, made and freed here only. Threads: the loop thread only.
 * Cost: the request path reuses m's decoder, token and text buffers, JSON writer and chunk
 * buffer; per request one mreq (and, non-streaming, its text buffer).
 */
#ifndef KVR_MOCKER_ADMIT_H
#define KVR_MOCKER_ADMIT_H

#include "mocker/mocker_state.h"

struct evhttp_request;

/* POST /v1/completions, /v1/chat/completions: answers an error, or admits the request. */
void mk_admit_generate(kvr_mocker_t *m, struct evhttp_request *req, kvr_oai_endpoint_t ep);
/* POST /tokenize. */
void mk_admit_tokenize(kvr_mocker_t *m, struct evhttp_request *req);
/* The ranks' output callback (mk_rank_init): a token of the request o->user. */
void mk_admit_on_output(void *ctx, const kvr_engine_output_t *o);
/* Probes the non-streaming clients for a disconnect libevent does not see (http_conn.h);
 * a gone one's connection is closed, which cancels its request. */
void mk_admit_sweep(kvr_mocker_t *m);

#endif /* KVR_MOCKER_ADMIT_H */
