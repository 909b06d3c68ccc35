/*
 * fe_reqmetrics.c: the front end's per-model request metrics, the operator's view of what the
 * router serves (the reference front end's family, under kvr_frontend_): histograms of time to
 * first token, inter-token latency, input and output sequence lengths, end-to-end duration and
 * the KV hit rate the router predicted, each labelled with the request's model.
 *
 * Definitions: TTFT = request received to the first streamed chunk carrying a token relayed;
 * ITL = (last token chunk - first token chunk) / (token chunks - 1), one observation a request
 * with two or more; ISL = prompt tokens; OSL = token chunks streamed, or the answer's
 * usage.completion_tokens when not streamed; E2E = received to the answer's end; KV hit rate =
 * cached tokens on the chosen worker at routing / ISL. Only requests answered 200 in full are
 * observed (a failed or abandoned one is counted elsewhere: replies, disconnects).
 * Invariants: at most FE_MAX_METRIC_MODELS labels; models beyond them (or whose name is longer
 * than FE_METRIC_MODEL_BYTES) are observed under "other", so a client cannot grow /metrics.
 * Memory: FE_MAX_METRIC_MODELS + 1 slots of six fixed histograms (~2 KiB each), allocated with
 * the front end. Threads: the HTTP thread. Cost: O(models) per new model name (a linear scan of
 * at most 32), O(1) per observation.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "frontend/fe_metrics.h"

static const double SECONDS_BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1,
                                         2.5,   5,    10,    30,   60,  120,  300};
static const double ITL_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04,
                                     0.06,  0.08,   0.1,   0.25, 0.5,  1};
static const double TOKEN_BUCKETS[] = {16, 64, 256, 1024, 4096, 16384, 65536, 262144};
static const double RATE_BUCKETS[] = {0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1};
#define N_OF(a) (sizeof a / sizeof a[0])

static void init_slot(fe_model_metrics_t *m, const char *name, size_t len)
{
    memcpy(m->name, name, len);
    m->name[len] = '\0';
    kvr_hist_init(&m->ttft, SECONDS_BUCKETS, N_OF(SECONDS_BUCKETS));
    kvr_hist_init(&m->e2e, SECONDS_BUCKETS, N_OF(SECONDS_BUCKETS));
    kvr_hist_init(&m->itl, ITL_BUCKETS, N_OF(ITL_BUCKETS));
    kvr_hist_init(&m->isl, TOKEN_BUCKETS, N_OF(TOKEN_BUCKETS));
    kvr_hist_init(&m->osl, TOKEN_BUCKETS, N_OF(TOKEN_BUCKETS));
    kvr_hist_init(&m->hit, RATE_BUCKETS, N_OF(RATE_BUCKETS));
}

int fe_reqm_init(kvr_frontend_t *fe)
{
    fe->mm = calloc(FE_MAX_METRIC_MODELS + 1, sizeof *fe->mm);
    if (fe->mm == NULL)
        return KVR_ENOMEM;
    init_slot(&fe->mm[FE_MAX_METRIC_MODELS], "other", 5);
    return KVR_OK;
}

void fe_reqm_free(kvr_frontend_t *fe)
{
    free(fe->mm);
    fe->mm = NULL;
}

uint16_t fe_reqm_slot(kvr_frontend_t *fe, const char *model, size_t len)
{
    if (model == NULL || len == 0) {
        model = "unknown";
        len = 7;
    }
    if (len >= FE_METRIC_MODEL_BYTES)
        return FE_MAX_METRIC_MODELS;
    for (uint16_t i = 0; i < fe->n_mm; i++)
        if (strlen(fe->mm[i].name) == len && memcmp(fe->mm[i].name, model, len) == 0)
            return i;
    if (fe->n_mm == FE_MAX_METRIC_MODELS)
        return FE_MAX_METRIC_MODELS;
    init_slot(&fe->mm[fe->n_mm], model, len);
    return fe->n_mm++;
}

void fe_reqm_observe(kvr_frontend_t *fe, const fe_req_t *p, uint64_t now_ns, uint64_t osl)
{
    fe_model_metrics_t *m = &fe->mm[p->client.model_slot];
    m->requests++;
    kvr_hist_observe(&m->e2e, (double)(now_ns - p->client.arrival_ns) / 1e9);
    kvr_hist_observe(&m->isl, (double)p->prompt.n_tokens);
    kvr_hist_observe(&m->osl, (double)osl);
    if (p->prompt.n_tokens > 0) {
        uint64_t c = p->route.cached_tokens < p->prompt.n_tokens ? p->route.cached_tokens
                                                                 : p->prompt.n_tokens;
        kvr_hist_observe(&m->hit, (double)c / (double)p->prompt.n_tokens);
    }
    if (p->client.first_token_ns != 0) {
        kvr_hist_observe(&m->ttft, (double)(p->client.first_token_ns - p->client.arrival_ns) / 1e9);
        if (p->client.gen_tokens > 1)
            kvr_hist_observe(&m->itl, (double)(p->client.last_token_ns -
                                               p->client.first_token_ns) / 1e9 /
                                          (double)(p->client.gen_tokens - 1));
    }
}

void fe_reqm_metrics(const kvr_frontend_t *fe, struct kvr_prom *p)
{
    static const struct {
        const char *name, *help;
        size_t off;
    } F[] = {
        {"kvr_frontend_time_to_first_token_seconds",
         "Request received to its first streamed token relayed, by model.",
         offsetof(fe_model_metrics_t, ttft)},
        {"kvr_frontend_inter_token_latency_seconds",
         "Mean time between streamed tokens of a request, by model.",
         offsetof(fe_model_metrics_t, itl)},
        {"kvr_frontend_input_sequence_tokens", "Prompt tokens of a request, by model.",
         offsetof(fe_model_metrics_t, isl)},
        {"kvr_frontend_output_sequence_tokens",
         "Output tokens of a request (token chunks streamed, or usage.completion_tokens), by "
         "model.",
         offsetof(fe_model_metrics_t, osl)},
        {"kvr_frontend_request_duration_seconds",
         "Request received to its answer's end, by model (answered 200 in full).",
         offsetof(fe_model_metrics_t, e2e)},
        {"kvr_frontend_kv_hit_rate",
         "Cached prompt tokens on the chosen worker at routing / prompt tokens, by model.",
         offsetof(fe_model_metrics_t, hit)},
    };
    size_t n = fe->n_mm;
    for (size_t f = 0; f < N_OF(F); f++) {
        kvr_prom_family(p, F[f].name, "histogram", F[f].help);
        for (size_t i = 0; i <= n; i++) {
            const fe_model_metrics_t *m = &fe->mm[i < n ? i : FE_MAX_METRIC_MODELS];
            if (i == n && m->requests == 0)
                continue; /* "other" only once it has something */
            kvr_prom_label_t l = {"model", m->name};
            kvr_prom_hist(p, F[f].name, &l, 1,
                          (const kvr_hist_t *)(const void *)((const char *)m + F[f].off));
        }
    }
}
