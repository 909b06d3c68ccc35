/*
 * prom_read.h: a reader of the Prometheus text exposition format (version 0.0.4), one sample
 * line at a time: its metric name, its raw label text and its value. Comment lines (# HELP,
 * # TYPE) and blank lines are skipped; a line that is not a sample (no name, unbalanced
 * braces, a label value with a bad escape, a value that is not a number) is skipped and
 * counted, never an error that stops the walk: the caller reads what it knows and ignores the
 * rest. Timestamps after the value are allowed and ignored.
 * Used by the live page's sampler on the router's own /metrics text (ui/), so that the page
 * shows exactly what a Prometheus scraping the router would compute.
 * Pure: no allocation, no globals, any thread; a line points into the caller's text.
 * Cost: one pass over the text.
 */
#ifndef KVR_WIRE_PROM_READ_H
#define KVR_WIRE_PROM_READ_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kvr_prom_line {
    const char *name;   /* the metric name, name_len bytes, not NUL-terminated */
    size_t name_len;
    const char *labels; /* between the braces, labels_len bytes ("" when none) */
    size_t labels_len;
    double value;       /* NaN and +-Inf as the format spells them */
} kvr_prom_line_t;

typedef struct kvr_prom_reader {
    const char *text;
    size_t len, pos;
    size_t skipped; /* malformed lines passed over */
} kvr_prom_reader_t;

void kvr_prom_reader_init(kvr_prom_reader_t *r, const char *text, size_t len);
/* The next sample line: true and *out, false at the end of the text. */
bool kvr_prom_reader_next(kvr_prom_reader_t *r, kvr_prom_line_t *out);
/* Whether the line's metric name is name. */
bool kvr_prom_line_is(const kvr_prom_line_t *l, const char *name);
/* The value of label `name`, unescaped into buf (NUL-terminated); false when the line has no
 * such label or its value does not fit in cap - 1 bytes. */
bool kvr_prom_line_label(const kvr_prom_line_t *l, const char *name, char *buf, size_t cap);

#endif
