/*
 * trace_gen.h: synthetic Mooncake traces (wire/trace.h's rows), seeded and reproducible, so
 * that routing policies are judged on more than one trace and users can model their traffic
 * (`kvrouter trace gen`, `kvrouter trace synth`).
 *
 * Prompts are built from content segments (a system prompt, a document, a user message, an
 * answer, a tool result), each a run of tokens with an identity. A 512-token block's hash id
 * names the exact content of the prompt up to the end of that block (a chained hash of the
 * segments' pieces, interned to small dense ids in order of first use), so two prompts share
 * their first k ids exactly when they share their first k * 512 tokens, as in a real
 * Mooncake trace. The workloads (every distribution stated in docs/sim.md):
 *
 *   chat     sessions of turns; turn t's prompt is turn t-1's prompt, its answer and a new
 *            user message; one of 8 system prompts per session (Zipf 1.0)
 *   agent    tasks of tool-use steps over one of 6 agent types' long system prompt and tool
 *            schema (Zipf 1.2); each step appends the model's action and the tool's result;
 *            some steps fan out into parallel branches sharing the prompt so far (bursts)
 *   rag      independent questions over 1..3 documents of a shared pool (Zipf 1.1
 *            popularity) after one of 2 system prompts
 *   mix      all three at once, 40% / 30% / 30% of the rate
 *
 * Arrivals (sessions, tasks or questions) are Poisson, or Gamma with a coefficient of
 * variation (bursty) at the rate's share; `rate` is in requests per second (a session or task
 * start rate is derived from its mean request count). Rows are sorted by timestamp.
 *
 * Ownership: the output trace is the caller's (kvr_trace_free). Threads: any, one owner.
 * Cost: O(rows x prompt blocks) time and memory.
 */
#ifndef KVR_WIRE_TRACE_GEN_H
#define KVR_WIRE_TRACE_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/rng.h"
#include "kvrouter.h"
#include "wire/trace.h"

typedef enum kvr_workload {
    KVR_WORKLOAD_CHAT = 0,
    KVR_WORKLOAD_AGENT,
    KVR_WORKLOAD_RAG,
    KVR_WORKLOAD_MIX,
    KVR_WORKLOAD_FANOUT,
    KVR_WORKLOAD_N
} kvr_workload_t;

typedef enum kvr_arrival {
    KVR_ARRIVAL_POISSON = 0,
    KVR_ARRIVAL_GAMMA,
} kvr_arrival_t;

typedef struct kvr_tracegen_config {
    kvr_workload_t workload;
    double rate;          /* requests per second, > 0 */
    kvr_arrival_t arrival;
    double cv;            /* gamma: coefficient of variation of inter-arrival times (> 0) */
    double duration_s;    /* arrivals in [0, duration_s); rows past it are dropped */
    size_t max_rows;      /* 0 = no limit (the first rows in time are kept) */
    uint64_t seed;
    uint32_t docs;        /* rag: the document pool (0 = 1000) */
} kvr_tracegen_config_t;

/* "chat", "agent", "rag", "mix", "fanout"; KVR_WORKLOAD_N when unknown. */
kvr_workload_t kvr_workload_parse(const char *name);
const char *kvr_workload_name(kvr_workload_t w);

/* KVR_OK; KVR_EINVAL with err naming the setting; KVR_ENOMEM. */
int kvr_tracegen_run(const kvr_tracegen_config_t *cfg, kvr_trace_t *out, char *err,
                     size_t err_len);

/* ---- shared by the generators and kvrouter trace synth ---- */

/* A trace under construction: rows appended in any order, ids by offset until finished. */
typedef struct kvr_trace_builder {
    kvr_trace_row_t *rows;
    size_t *off; /* each row's first id in ids */
    size_t n_rows, cap_rows;
    uint64_t *ids;
    size_t n_ids, cap_ids;
    bool oom;
} kvr_trace_builder_t;

void kvr_trace_builder_init(kvr_trace_builder_t *b);
void kvr_trace_builder_deinit(kvr_trace_builder_t *b);
/* Appends a row (ids copied); sets b->oom on allocation failure. */
void kvr_trace_builder_add(kvr_trace_builder_t *b, uint64_t t_ms, uint32_t input_length,
                           uint32_t output_length, const uint64_t *ids, uint32_t n_ids);
/* Sorts the rows by timestamp (stable), keeps the first max_rows (0 = all) and hands them
 * over as *out (the builder is left empty). KVR_OK or KVR_ENOMEM. */
int kvr_trace_builder_finish(kvr_trace_builder_t *b, size_t max_rows, kvr_trace_t *out);

/* Random draws the generators share (rng: the caller's). */
double kvr_draw_exp(kvr_rng_t *rng, double mean);
double kvr_draw_normal(kvr_rng_t *rng);
double kvr_draw_lognormal(kvr_rng_t *rng, double median, double sigma);
/* Gamma with this mean and coefficient of variation (Marsaglia and Tsang). */
double kvr_draw_gamma(kvr_rng_t *rng, double mean, double cv);
/* Index in [0, n) with P(i) proportional to 1 / (i + 1)^s, by its CDF (cdf[n], built by
 * kvr_zipf_cdf). */
void kvr_zipf_cdf(double *cdf, size_t n, double s);
size_t kvr_draw_zipf(kvr_rng_t *rng, const double *cdf, size_t n);

#endif /* KVR_WIRE_TRACE_GEN_H */
