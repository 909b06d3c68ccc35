/*
 * fe_inproc.h: the front end's in-process tokenization (fe_inproc.c). The models of the
 * tokenizers setting are loaded when the front end starts (a model that does not load stops
 * the start, naming the file and what it refuses); a tokenizer folder a worker registration
 * names for its model (the first one a model gets) is loaded off the serving thread
 * (http/offloop.h), the model on the workers' /tokenize meanwhile, or for good when the load
 * fails (logged, counted); a text or chat request for one of them is
 * turned into ids as the engine would (tokenizer/model.h over wire/chat_conv.h), with no
 * round trip to a worker. Each model is first checked: when its first worker with a url
 * registers, probe prompts (a text and a chat) are tokenized both here and by the worker's
 * /tokenize, and the tokenizer_check setting says what a difference does. Until the probe
 * answers, and after a refused one, the model's prompts take the workers' /tokenize path.
 * Threads: the HTTP thread. Cost: see tokenizer/model.h; a probe is two small calls a model.
 */
#ifndef KVR_FRONTEND_FE_INPROC_H
#define KVR_FRONTEND_FE_INPROC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe_ctx.h"

typedef enum fe_inproc_status {
    FE_INPROC_IDS,      /* fe->tok_ids[0..*n): the prompt's ids */
    FE_INPROC_DECLINED, /* not here (no model, not checked yet, refused, not modelled) */
    FE_INPROC_FAIL,     /* *status and msg: the request's answer (the template raised, too long) */
} fe_inproc_status_t;

/* Loads the tokenizers setting's models. KVR_OK, or the load's status with err naming the
 * model, the file and the reason. */
int fe_inproc_init(kvr_frontend_t *fe, char *err, size_t errlen);
void fe_inproc_free(kvr_frontend_t *fe);

/* The ids of a decoded text or chat request (body: its bytes). Counted: the time, the
 * tokens, or why it declined. */
fe_inproc_status_t fe_inproc_ids(kvr_frontend_t *fe, const kvr_oai_request_t *rq,
                                 const char *body, size_t len, size_t *n, int *status,
                                 char *msg, size_t msglen);

/* A worker was registered: loads the tokenizer folder it names when its model has none yet,
 * and probes its model's tokenizer when it is one of ours, unchecked. */
void fe_inproc_worker_added(kvr_frontend_t *fe, const kvr_worker_spec_t *w);

/* The /metrics families (tokenize time and tokens, paths, declines, probes, each model's
 * segment cache). */
void fe_inproc_metrics(kvr_frontend_t *fe, struct kvr_prom *p);

#endif
