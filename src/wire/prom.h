/*
 * prom.h: writer of the Prometheus text exposition format (version 0.0.4), for /metrics.
 *
 * A kvr_prom_t is a growable text buffer plus helpers that emit one family at a time:
 * `# HELP` and `# TYPE` once per family, then samples with escaped label values. Histograms
 * take cumulative bucket counts. Memory: the buffer grows as needed and is reused across
 * scrapes (kvr_prom_reset keeps the capacity). Threads: one owner. Cost: linear in the output.
 */
#ifndef KVR_PROM_H
#define KVR_PROM_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvr_prom {
    char *buf;
    size_t len, cap;
    int oom; /* set when an allocation failed; the text is then truncated */
} kvr_prom_t;

/* One label: name="value" (value escaped as the format requires). */
typedef struct kvr_prom_label {
    const char *name;
    const char *value;
} kvr_prom_label_t;

void kvr_prom_init(kvr_prom_t *p);
void kvr_prom_deinit(kvr_prom_t *p);
void kvr_prom_reset(kvr_prom_t *p);

/* Starts a family: type is "counter", "gauge" or "histogram". */
void kvr_prom_family(kvr_prom_t *p, const char *name, const char *type, const char *help);
/* One sample of the current family (name may carry a suffix such as _total). */
void kvr_prom_sample(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                     size_t n_labels, double value);
/* A family with one unlabelled sample: a counter or a gauge. */
void kvr_prom_counter(kvr_prom_t *p, const char *name, const char *help, double v);
void kvr_prom_gauge(kvr_prom_t *p, const char *name, const char *help, double v);
/* A family whose samples differ by one label, key="by[i].label", in order. */
typedef struct kvr_prom_by {
    const char *label;
    double v;
} kvr_prom_by_t;
void kvr_prom_by_label(kvr_prom_t *p, const char *name, const char *type, const char *help,
                       const char *key, const kvr_prom_by_t *by, size_t n);
#define KVR_PROM_N(arr) (sizeof(arr) / sizeof((arr)[0]))
/* A whole histogram: bounds[i] upper bounds (ascending), counts[i] observations <= bounds[i]
 * (cumulative), plus the +Inf bucket = count, and _sum / _count. */
void kvr_prom_histogram(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                        size_t n_labels, const double *bounds, const uint64_t *cumulative,
                        size_t n_bounds, uint64_t count, double sum);

/* A fixed-bucket histogram to record into (no allocation; bounds owned by the caller). */
typedef struct kvr_hist {
    const double *bounds;
    size_t n;
    uint64_t counts[32]; /* per bucket, not cumulative; n <= 32 */
    uint64_t count;
    double sum;
} kvr_hist_t;

void kvr_hist_init(kvr_hist_t *h, const double *bounds, size_t n);
void kvr_hist_observe(kvr_hist_t *h, double v);
void kvr_prom_hist(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                   size_t n_labels, const kvr_hist_t *h);

#endif
