/*
 * prom.c: Prometheus text exposition writer (see prom.h).
 *
 * Invariants: buf is NUL-terminated at len; label values are escaped (\\, \", \n); numbers
 * are printed with enough digits to round-trip counters up to 2^53 exactly, and NaN / +Inf /
 * -Inf in the format's spelling.
 */
#include "wire/prom.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvr_prom_init(kvr_prom_t *p) { memset(p, 0, sizeof *p); }

void kvr_prom_deinit(kvr_prom_t *p)
{
    free(p->buf);
    memset(p, 0, sizeof *p);
}

void kvr_prom_reset(kvr_prom_t *p)
{
    p->len = 0;
    p->oom = 0;
    if (p->buf != NULL)
        p->buf[0] = '\0';
}

static int reserve(kvr_prom_t *p, size_t extra)
{
    if (p->oom)
        return -1;
    if (p->len + extra + 1 <= p->cap)
        return 0;
    size_t cap = p->cap ? p->cap : 4096;
    while (cap < p->len + extra + 1)
        cap *= 2;
    char *b = realloc(p->buf, cap);
    if (b == NULL) {
        p->oom = 1;
        return -1;
    }
    p->buf = b;
    p->cap = cap;
    return 0;
}

static void put(kvr_prom_t *p, const char *s, size_t n)
{
    if (reserve(p, n) != 0)
        return;
    memcpy(p->buf + p->len, s, n);
    p->len += n;
    p->buf[p->len] = '\0';
}

static void puts_(kvr_prom_t *p, const char *s) { put(p, s, strlen(s)); }

static void putf(kvr_prom_t *p, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(p, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* The shortest of %.15g / %.17g that reads back as the same double. */
static void fmt_double(char *out, size_t len, double v)
{
    snprintf(out, len, "%.15g", v);
    if (strtod(out, NULL) != v)
        snprintf(out, len, "%.17g", v);
}

static void put_value(kvr_prom_t *p, double v)
{
    if (isnan(v))
        puts_(p, "NaN");
    else if (isinf(v))
        puts_(p, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        putf(p, "%.0f", v);
    else {
        char tmp[40];
        fmt_double(tmp, sizeof tmp, v);
        puts_(p, tmp);
    }
}

/* Escapes text for HELP lines (\\ and \n) or label values (also \"). */
static void put_escaped(kvr_prom_t *p, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            puts_(p, "\\\\");
        else if (*s == '\n')
            puts_(p, "\\n");
        else if (quote && *s == '"')
            puts_(p, "\\\"");
        else
            put(p, s, 1);
    }
}

static void put_labels(kvr_prom_t *p, const kvr_prom_label_t *l, size_t n, const char *le)
{
    if (n == 0 && le == NULL)
        return;
    puts_(p, "{");
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            puts_(p, ",");
        puts_(p, l[i].name);
        puts_(p, "=\"");
        put_escaped(p, l[i].value ? l[i].value : "", 1);
        puts_(p, "\"");
    }
    if (le != NULL) {
        puts_(p, n ? ",le=\"" : "le=\"");
        puts_(p, le);
        puts_(p, "\"");
    }
    puts_(p, "}");
}

void kvr_prom_family(kvr_prom_t *p, const char *name, const char *type, const char *help)
{
    puts_(p, "# HELP ");
    puts_(p, name);
    puts_(p, " ");
    put_escaped(p, help, 0);
    puts_(p, "\n# TYPE ");
    puts_(p, name);
    puts_(p, " ");
    puts_(p, type);
    puts_(p, "\n");
}

void kvr_prom_sample(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                     size_t n_labels, double value)
{
    puts_(p, name);
    put_labels(p, labels, n_labels, NULL);
    puts_(p, " ");
    put_value(p, value);
    puts_(p, "\n");
}

void kvr_prom_histogram(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                        size_t n_labels, const double *bounds, const uint64_t *cumulative,
                        size_t n_bounds, uint64_t count, double sum)
{
    char sub[160], le[48];
    snprintf(sub, sizeof sub, "%s_bucket", name);
    for (size_t i = 0; i < n_bounds; i++) {
        fmt_double(le, sizeof le, bounds[i]);
        puts_(p, sub);
        put_labels(p, labels, n_labels, le);
        puts_(p, " ");
        put_value(p, (double)cumulative[i]);
        puts_(p, "\n");
    }
    puts_(p, sub);
    put_labels(p, labels, n_labels, "+Inf");
    puts_(p, " ");
    put_value(p, (double)count);
    puts_(p, "\n");
    snprintf(sub, sizeof sub, "%s_sum", name);
    kvr_prom_sample(p, sub, labels, n_labels, sum);
    snprintf(sub, sizeof sub, "%s_count", name);
    kvr_prom_sample(p, sub, labels, n_labels, (double)count);
}

void kvr_hist_init(kvr_hist_t *h, const double *bounds, size_t n)
{
    memset(h, 0, sizeof *h);
    h->bounds = bounds;
    h->n = n > 32 ? 32 : n;
}

void kvr_hist_observe(kvr_hist_t *h, double v)
{
    h->count++;
    h->sum += v;
    for (size_t i = 0; i < h->n; i++) {
        if (v <= h->bounds[i]) {
            h->counts[i]++;
            return;
        }
    }
}

void kvr_prom_hist(kvr_prom_t *p, const char *name, const kvr_prom_label_t *labels,
                   size_t n_labels, const kvr_hist_t *h)
{
    uint64_t cum[32], run = 0;
    for (size_t i = 0; i < h->n; i++) {
        run += h->counts[i];
        cum[i] = run;
    }
    kvr_prom_histogram(p, name, labels, n_labels, h->bounds, cum, h->n, h->count, h->sum);
}

void kvr_prom_counter(kvr_prom_t *p, const char *name, const char *help, double v)
{
    kvr_prom_family(p, name, "counter", help);
    kvr_prom_sample(p, name, NULL, 0, v);
}

void kvr_prom_by_label(kvr_prom_t *p, const char *name, const char *type, const char *help,
                       const char *key, const kvr_prom_by_t *by, size_t n)
{
    kvr_prom_family(p, name, type, help);
    for (size_t i = 0; i < n; i++) {
        kvr_prom_label_t l = {key, by[i].label};
        kvr_prom_sample(p, name, &l, 1, by[i].v);
    }
}

void kvr_prom_gauge(kvr_prom_t *p, const char *name, const char *help, double v)
{
    kvr_prom_family(p, name, "gauge", help);
    kvr_prom_sample(p, name, NULL, 0, v);
}
