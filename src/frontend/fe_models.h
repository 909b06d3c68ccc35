/*
 * fe_models.h: GET /v1/models, merged from the workers' lists, and the adapters each engine
 * lists (fe_models.c). Replies through http/reply.h (fe->rep).
 */
#ifndef KVR_FRONTEND_FE_MODELS_H
#define KVR_FRONTEND_FE_MODELS_H

#include <event2/http.h>

#include "frontend/fe_ctx.h"

void fe_h_models(kvr_frontend_t *fe, struct evhttp_request *req);
void fe_models_answer(kvr_frontend_t *fe, struct evhttp_request *req);
/* Asks every worker for its models when the last round is FE_ADAPTERS_REFRESH_MS old. */
void fe_models_tick(kvr_frontend_t *fe);

#endif
