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
/* Why no worker can take a request for model (NULL: any) into buf, for its error: none
 * registered, none with a url, none serving the model (the models there are listed), or all
 * of them fenced. */
void fe_models_why_none(kvr_frontend_t *fe, const char *model, char *buf, size_t len);
/* Whether worker sp serves model (NULL: any): no model of its own, the same, or an adapter it
 * declares (loras=) or its engine lists. */
bool fe_models_serves(kvr_frontend_t *fe, const kvr_worker_spec_t *sp, const char *model);
/* Whether some registered worker with a url serves model. */
bool fe_models_served(kvr_frontend_t *fe, const char *model);
/* The registered workers' models, comma-separated, into buf ("" when none names one). */
void fe_models_names(kvr_frontend_t *fe, char *buf, size_t len);

#endif
