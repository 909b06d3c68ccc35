/*
 * fe_metrics.h: the front end's /metrics families (fe_metrics.c), and its per-model request
 * histograms (fe_reqmetrics.c).
 */
#ifndef KVR_FRONTEND_FE_METRICS_H
#define KVR_FRONTEND_FE_METRICS_H

#include <stdint.h>

#include "frontend/fe_ctx.h"
#include "frontend/fe_req.h"

/* The api server's metrics callback (arg: the front end). */
void fe_metrics(void *arg, struct kvr_prom *p);

/* ---- fe_reqmetrics.c ------------------------------------------------------------------------ */
int fe_reqm_init(kvr_frontend_t *fe);
void fe_reqm_free(kvr_frontend_t *fe);
/* The metrics slot of a model name (FE_MAX_METRIC_MODELS: "other"). */
uint16_t fe_reqm_slot(kvr_frontend_t *fe, const char *model, size_t len);
/* A request answered 200 in full, at now_ns, with osl output tokens. */
void fe_reqm_observe(kvr_frontend_t *fe, const fe_req_t *p, uint64_t now_ns, uint64_t osl);
void fe_reqm_metrics(const kvr_frontend_t *fe, struct kvr_prom *p);

#endif
