/*
 * fe_body.h: the bytes the front end sends workers and splices into their answers
 * (fe_body.c): the forward body, a leg's body, the nvext naming the worker. Reads p->prompt,
 * p->client and p->hints; writes p->prompt.body*, p->client.nvext. No callback.
 */
#ifndef KVR_FRONTEND_FE_BODY_H
#define KVR_FRONTEND_FE_BODY_H

#include <stdbool.h>
#include <stddef.h>

#include <event2/buffer.h>

#include "frontend/fe_req.h"

/* The body for the workers when the client's cannot go verbatim (prompt.rewrite). KVR_OK,
 * KVR_ETOOBIG (more than FE_MAX_MEMBERS members) or KVR_ENOMEM. */
int fe_build_forward_body(fe_req_t *p);
/* Whether the client's body b may hold a KV-transfer member (kv_transfer_params, bootstrap_*),
 * which must then be stripped: a byte search, false positives only cost a rewrite. */
bool fe_body_may_name_kvt(const char *b, size_t n);
/* A leg of a disaggregated request: the forward body without the top-level members named in
 * drop (NULL-terminated; *seen gets bit i set when drop[i] was present), then tail (members
 * text, no leading comma). Into a new buffer (*out, owned by the caller). */
int fe_build_leg_body(fe_req_t *p, const char *const *drop, unsigned *seen, const char *tail,
                      size_t tail_len, char **out, size_t *out_len);
/* "nvext":{"worker_id":{...}} for the chosen worker (and pf, the prefill worker, when not
 * NULL), into p->client.nvext. */
void fe_make_nvext(fe_req_t *p, const kvr_worker_t *pf);
/* json with the worker's nvext added (when the client asked for it) into out; false when it is
 * not one valid object (forwarded as it was). */
bool fe_inject_worker(const fe_req_t *p, const char *json, size_t len, struct evbuffer *out);

#endif
