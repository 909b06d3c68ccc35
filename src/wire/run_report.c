/*
 * run_report.c: see run_report.h.
 */
#include "wire/run_report.h"

static void pcts(kvr_json_writer_t *w, const char *key, const kvr_pcts_t *p)
{
    kvr_json_key(w, key);
    kvr_json_begin_object(w);
    kvr_json_key(w, "p50");
    kvr_json_double(w, p->p50);
    kvr_json_key(w, "p90");
    kvr_json_double(w, p->p90);
    kvr_json_key(w, "p99");
    kvr_json_double(w, p->p99);
    kvr_json_end_object(w);
}

static void num(kvr_json_writer_t *w, const char *key, double v)
{
    kvr_json_key(w, key);
    kvr_json_double(w, v); /* NAN -> null */
}

int kvr_run_report_write_keys(kvr_json_writer_t *w, const kvr_run_report_t *r)
{
    kvr_json_key(w, "policy");
    kvr_json_string(w, r->policy);
    kvr_json_key(w, "workers");
    kvr_json_u64(w, r->workers);
    kvr_json_key(w, "requests");
    kvr_json_u64(w, r->requests);
    pcts(w, "ttft_ms", &r->ttft_ms);
    pcts(w, "itl_ms", &r->itl_ms);
    pcts(w, "e2e_ms", &r->e2e_ms);
    num(w, "hit_ratio", r->hit_ratio);
    num(w, "ceiling_infinite", r->ceiling_infinite);
    num(w, "ceiling_pooled", r->ceiling_pooled);
    num(w, "max_worker_share", r->max_worker_share);
    return kvr_json_writer_status(w);
}
