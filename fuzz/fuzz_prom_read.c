/*
 * fuzz_prom_read.c: libFuzzer target for the Prometheus text reader (wire/prom_read.c) and
 * the live view's reading of it (ui/ui_reading.c): today it reads the router's own text, but
 * it is a reader of bytes and is held to the same bar.
 *
 * Invariants checked: no crash, no read outside the input (ASan, the input is not
 * NUL-terminated); every line returned lies inside the input with a non-empty name; a label
 * read back is NUL-terminated within its buffer; the reading's histograms keep ascending
 * bounds, and a quantile of them is NaN or within [the lowest bound or 0, the highest finite
 * bound].
 * Memory: none. Threads: libFuzzer's one.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ui/ui_reading.h"
#include "wire/prom_read.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_hist(const kvr_ui_hist_t *h)
{
    check(h->n <= KVR_UI_HIST_MAX);
    for (size_t i = 1; i < h->n; i++)
        check(h->le[i - 1] < h->le[i]);
    double q = kvr_ui_hist_quantile(h, NULL, 0.9);
    if (isnan(q) || h->n < 2)
        return;
    double lo = h->le[0] < 0 ? h->le[0] : 0;
    check(q >= lo && q <= h->le[h->n - 2]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    kvr_prom_reader_t r;
    kvr_prom_reader_init(&r, text, size);
    kvr_prom_line_t l;
    while (kvr_prom_reader_next(&r, &l)) {
        check(l.name >= text && l.name_len > 0 && l.name + l.name_len <= text + size);
        check(l.labels >= text && l.labels + l.labels_len <= text + size);
        char v[16];
        memset(v, 'x', sizeof v);
        if (kvr_prom_line_label(&l, "le", v, sizeof v))
            check(memchr(v, '\0', sizeof v) != NULL);
    }
    check(r.pos == size);
    kvr_ui_reading_t rd;
    kvr_ui_reading_parse(text, size, 1, &rd);
    check_hist(&rd.ttft);
    check_hist(&rd.itl);
    check_hist(&rd.sync_lag);
    return 0;
}
