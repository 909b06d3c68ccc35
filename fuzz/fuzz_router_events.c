/*
 * fuzz_router_events.c: libFuzzer target for the RouterEvent dump reader
 * (wire/router_event_json.c), the trust boundary of `kvrouter indexer --peers`: a peer's
 * GET /dump is applied to this indexer's index at start.
 *
 * Each input is read twice, into a sink that applies the events to a real index (as the
 * indexer does). Invariants checked: a refusal has a message; the two reads agree (status,
 * partitions, events); every event handed to the sink has a kind, a tier and blocks / hashes
 * consistent with its counts; the index stays valid (kvr_index_verify) whatever was applied.
 * Memory: one index per input, small budget. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/router_event_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

typedef struct sink_state {
    kvr_index_t *ix;
    uint64_t parts, events;
} sink_state_t;

static int on_part(void *ud, const char *key, size_t len, uint32_t bs)
{
    sink_state_t *s = ud;
    check(len >= 1 && memchr(key, ':', len) != NULL && bs >= 1 && bs <= 65536);
    s->parts++;
    return 0;
}

static int on_event(void *ud, const kvr_event_t *ev)
{
    sink_state_t *s = ud;
    check(ev->kind <= KVR_EV_CLEARED && ev->tier < KVR_N_TIERS);
    if (ev->kind == KVR_EV_STORED)
        check(ev->n_blocks >= 1 && ev->blocks != NULL);
    if (ev->kind == KVR_EV_REMOVED)
        check(ev->n_removed == 0 || ev->removed != NULL);
    (void)kvr_index_apply(s->ix, ev);
    s->events++;
    return 0;
}

static int read_once(const uint8_t *data, size_t size, sink_state_t *s, kvr_rev_report_t *rep)
{
    kvr_index_config_t c = {.max_pairs = 4096, .max_workers = 64, .sync = KVR_SYNC_NONE};
    int st;
    s->ix = kvr_index_new(&c, &st);
    check(s->ix != NULL);
    kvr_rev_sink_t sink = {on_part, on_event, s};
    char err[256] = "";
    int rc = kvr_rev_decode_dump((const char *)data, size, &sink, rep, err, sizeof err);
    check(rc == KVR_OK || err[0] != '\0');
    check(kvr_index_verify(s->ix, NULL, 0) == KVR_OK);
    kvr_index_free(s->ix);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    sink_state_t a = {0}, b = {0};
    kvr_rev_report_t ra, rb;
    int x = read_once(data, size, &a, &ra);
    int y = read_once(data, size, &b, &rb);
    check(x == y && a.parts == b.parts && a.events == b.events);
    check(ra.events == a.events && ra.partitions == a.parts);
    return 0;
}
