/*
 * mocker_kv.h (private to src/mocker): the disaggregated roles' KV transfer (mocker_kv.c).
 * Prefill side: a finished hold request's KV is registered for its reader, read by
 * POST /kv/pull or the bootstrap server, expired unread. Decode side: a request's KV is
 * fetched from its prefill worker, and the request handed back through its kv_done.
 * Invariants: kv_done is called exactly once per fetch, from a timer (or at once when the
 * fetch cannot start), never from inside a libevent HTTP callback.
 * Ownership: holds, parks and the bootstrap server are m's, freed by mk_kv_free; a request's
 * fetch connection and timer are the request's, freed by mk_kv_release.
 * Threads: the loop thread only. Cost: holds and parks are lists searched linearly.
 */
#ifndef KVR_MOCKER_KV_H
#define KVR_MOCKER_KV_H

#include <stdbool.h>
#include <stddef.h>

#include "mocker/mocker_state.h"

struct evhttp_request;

/* The bootstrap server (prefill role, bootstrap convention); KVR_OK otherwise. */
int mk_kv_init(kvr_mocker_t *m, char *err, size_t err_len);
void mk_kv_free(kvr_mocker_t *m);
/* Expires holds and parked reads past their time. */
void mk_kv_sweep(kvr_mocker_t *m, uint64_t now_ns);
void mk_kv_metrics(kvr_mocker_t *m);

/* A finished hold request's KV is now held: registered for its reader. For a pull, returns
 * the member its answer carries ("kv_transfer_params":{...}, malloc'd, NUL-terminated);
 * NULL otherwise or out of memory (the hold is then released at once). */
char *mk_kv_held(mreq_t *q, const kvr_engine_output_t *o);
/* POST /kv/pull (on the HTTP port): a decode worker reads a held KV. */
void mk_h_pull(kvr_mocker_t *m, struct evhttp_request *req);

/* A decode worker's request carrying a prefill's whereabouts: fetches the KV (q in MQ_FETCH,
 * then MQ_XFER for the modelled transfer time), then calls done(q, ...) once. */
void mk_kv_fetch(mreq_t *q, const kvr_disagg_req_t *d, mk_kv_done_fn done);
/* The client of q left: stops q's fetch or transfer. True when q is kept for now (a fetch in
 * flight is let finish, so the prefill worker frees its KV; done then gets MK_KV_ABANDONED). */
bool mk_kv_client_gone(mreq_t *q);
/* Frees what a fetch gave q (its connection, cancelling a pending read, and its timer). */
void mk_kv_release(mreq_t *q);

#endif /* KVR_MOCKER_KV_H */
