/*
 * fuzz_kv_events.c: libFuzzer target for the KV-event batch decoder and converter
 * (wire/kv_events.c), the trust boundary between engines and the router: arbitrary bytes are
 * one ZMQ payload frame. Every decoded event is converted with the router block size 16 and
 * with the event's own block size, under a few worker/rank settings.
 *
 * Invariants checked: a failed decode leaves a one-line message and no events; a successful
 * one has no message, per-event statuses consistent with their messages, counts that add up,
 * outputs within the limits. msgpack-c, an independent reader, must accept every payload the
 * decoder accepted, with the same number of events and, for positional BlockStored events, the
 * same hashes and token ids. Conversion returns 1 / 0 / a status as documented, and each block's
 * local hash equals kvr_hash_blocks() of that block alone with the same salt and Eagle window.
 * Memory: one decoder reused across inputs (as the ingest thread does), small limits so each
 * input is cheap. Threads: libFuzzer's one.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <msgpack.h>

#include "kvrouter.h"
#include "wire/kv_events.h"

#define FUZZ_MAX_TOKENS 4096
#define FUZZ_MAX_HASHES 512
#define FUZZ_MAX_EVENTS 256
#define FUZZ_MAX_PAYLOAD (1 << 20)
#define FUZZ_CHECK_BLOCKS 8  /* blocks per event re-hashed one by one */

/* The oracle for vLLM's extra_keys (the reference's rules, written out plainly): the
 * namespace from "dynamo-cache-salt:" in block 0 after the first key equal to the LoRA name;
 * block j's objects: tagged keys (any identifier) and bare 64-hex digests that are not the
 * LoRA name. */
static bool oracle_is_lora(const kvr_kv_event_t *ev, const kvr_kv_extra_key_t *k)
{
    return ev->lora_name != NULL && ev->lora_name_len == k->len &&
           memcmp(ev->lora_name, k->s, k->len) == 0;
}

static void oracle_salt(const kvr_kv_event_t *ev, kvr_hash_opts_t *o)
{
    bool skipped = false;
    for (size_t k = 0; o->cache_namespace == NULL && k < ev->n_extra_keys; k++) {
        const kvr_kv_extra_key_t *x = &ev->extra_keys[k];
        if (x->block != 0 || x->tagged)
            continue;
        if (!skipped && oracle_is_lora(ev, x)) {
            skipped = true;
            continue;
        }
        if (x->len > 18 && memcmp(x->s, "dynamo-cache-salt:", 18) == 0) {
            o->cache_namespace = x->s + 18;
            o->cache_namespace_len = x->len - 18;
        }
    }
}

static size_t oracle_mm(const kvr_kv_event_t *ev, uint32_t block, uint64_t *out, size_t cap)
{
    size_t n = 0;
    for (size_t k = 0; k < ev->n_extra_keys && n < cap; k++) {
        const kvr_kv_extra_key_t *x = &ev->extra_keys[k];
        if (x->block != block || (!x->tagged && oracle_is_lora(ev, x)))
            continue;
        uint64_t h;
        if (kvr_hash_mm_identifier(x->s, x->len, x->tagged, &h))
            out[n++] = h;
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_at(int cond, const char *what, int line)
{
    if (!cond) {
        fprintf(stderr, "fuzz_kv_events.c:%d: check failed: %s\n", line, what);
        abort();
    }
}
#define check(cond) check_at((cond), #cond, __LINE__)

static bool one_line(const char *s)
{
    return s != NULL && s[0] != '\0' && strchr(s, '\n') == NULL;
}

/* msgpack-c's reading of a positional BlockStored against ours. */
static void cross_check_event(const msgpack_object *e, const kvr_kv_event_t *ev)
{
    if (ev->status != KVR_OK || e->type != MSGPACK_OBJECT_ARRAY)
        return;
    check(e->via.array.size >= 1 && e->via.array.ptr[0].type == MSGPACK_OBJECT_STR);
    if (ev->kind != KVR_KV_STORED && ev->kind != KVR_KV_REMOVED)
        return;
    const msgpack_object *hashes = &e->via.array.ptr[1];
    check(hashes->type == MSGPACK_OBJECT_ARRAY && hashes->via.array.size == ev->n_hashes);
    for (size_t k = 0; k < ev->n_hashes; k++) {
        const msgpack_object *h = &hashes->via.array.ptr[k];
        if (h->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            check(h->via.u64 == ev->hashes[k]);
        else if (h->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            check((uint64_t)h->via.i64 == ev->hashes[k]);
        else
            check(h->type == MSGPACK_OBJECT_BIN && h->via.bin.size > 0);
    }
    if (ev->kind != KVR_KV_STORED || ev->is_eagle)
        return;
    const msgpack_object *toks = &e->via.array.ptr[3];
    check(toks->type == MSGPACK_OBJECT_ARRAY && toks->via.array.size == ev->n_tokens);
    for (size_t k = 0; k < ev->n_tokens; k++) {
        check(toks->via.array.ptr[k].type == MSGPACK_OBJECT_POSITIVE_INTEGER);
        check(toks->via.array.ptr[k].via.u64 == ev->tokens[k]);
    }
}

static void cross_check(const kvr_kv_events_t *d, const uint8_t *data, size_t size)
{
    static msgpack_zone zone;
    static int ready;
    if (!ready) {
        check(msgpack_zone_init(&zone, 1 << 16));
        ready = 1;
    }
    msgpack_zone_clear(&zone);
    msgpack_object root;
    size_t off = 0;
    /* safe: the decoder framed every value, so no container claims more than the bytes */
    int rc = msgpack_unpack((const char *)data, size, &off, &zone, &root);
    check(rc == MSGPACK_UNPACK_SUCCESS && off == size);
    const msgpack_object *events = NULL;
    if (root.type == MSGPACK_OBJECT_ARRAY) {
        check(root.via.array.size >= 2);
        events = &root.via.array.ptr[1];
    } else {
        check(root.type == MSGPACK_OBJECT_MAP);
        for (uint32_t i = 0; i < root.via.map.size; i++) {
            const msgpack_object *k = &root.via.map.ptr[i].key;
            if (k->type == MSGPACK_OBJECT_STR && k->via.str.size == 6 &&
                memcmp(k->via.str.ptr, "events", 6) == 0)
                events = &root.via.map.ptr[i].val;
        }
    }
    check(events != NULL && events->type == MSGPACK_OBJECT_ARRAY);
    check(events->via.array.size == d->n_events);
    for (size_t i = 0; i < d->n_events; i++)
        cross_check_event(&events->via.array.ptr[i], &d->events[i]);
}

static void check_event(const kvr_kv_events_t *d, const kvr_kv_event_t *ev)
{
    check(ev->err != NULL);
    if (ev->status != KVR_OK) {
        check(ev->status < 0 && one_line(ev->err));
        check(ev->n_hashes == 0 && ev->n_tokens == 0 && !ev->remote);
        return;
    }
    check(ev->err[0] == '\0');
    check((unsigned)ev->kind <= KVR_KV_IGNORED && (unsigned)ev->tier < KVR_N_TIERS);
    check(ev->n_hashes <= d->limits.max_hashes && ev->n_tokens <= d->limits.max_tokens);
    check(ev->n_hashes == 0 || ev->hashes != NULL);
    check(ev->n_tokens == 0 || ev->tokens != NULL);
    check(ev->kind == KVR_KV_STORED || ev->n_tokens == 0);
    check(ev->kind != KVR_KV_STORED || ev->block_size >= 1);
    check((ev->lora_name == NULL) == (ev->lora_name_len == 0));
    check((ev->cache_salt == NULL) == (ev->cache_salt_len == 0));
    check(ev->lora_name == NULL || ev->lora_name[ev->lora_name_len] == '\0');
    check(ev->cache_salt == NULL || ev->cache_salt[ev->cache_salt_len] == '\0');
}

/* Converts event i and checks the result against the documented contract. */
static void convert(kvr_kv_events_t *d, size_t i, uint32_t bs, kvr_worker_t w)
{
    static uint64_t lbh[1];
    const kvr_kv_event_t *ev = &d->events[i];
    kvr_kv_target_t t = {.worker = w, .block_size = bs, .event_id = 99};
    kvr_event_t out;
    int rc = kvr_kv_events_convert(d, i, &t, &out);
    if (ev->status != KVR_OK) {
        check(rc == ev->status && one_line(d->conv_err));
        return;
    }
    if (ev->kind == KVR_KV_IGNORED || ev->remote) {
        check(rc == 0);
        return;
    }
    if (rc < 0) {
        check(one_line(d->conv_err));
        check(ev->kind == KVR_KV_STORED);
        check(rc == KVR_EMISMATCH ? ev->block_size != bs : rc == KVR_ERANGE);
        return;
    }
    check(rc == 1 && d->conv_err[0] == '\0');
    check(out.worker.worker_id == w.worker_id && out.event_id == 99);
    check(out.worker.dp_rank == (d->has_dp_rank ? d->dp_rank : w.dp_rank));
    if (ev->kind == KVR_KV_CLEARED) {
        check(out.kind == KVR_EV_CLEARED);
        return;
    }
    if (ev->kind == KVR_KV_REMOVED) {
        check(out.kind == KVR_EV_REMOVED && out.n_removed == ev->n_hashes);
        check(out.tier == ev->tier);
        return;
    }
    check(out.kind == KVR_EV_STORED && ev->block_size == bs && out.n_blocks == ev->n_hashes);
    check(out.has_parent == ev->has_parent && out.parent_ext == ev->parent);
    uint64_t need = (uint64_t)out.n_blocks * bs + (ev->is_eagle && out.n_blocks > 0);
    check(ev->n_tokens >= need);
    kvr_hash_opts_t opts = {
        .lora_name = ev->lora_name, .lora_name_len = ev->lora_name_len,
        .cache_namespace = ev->cache_salt, .cache_namespace_len = ev->cache_salt_len,
        .is_eagle = ev->is_eagle,
    };
    oracle_salt(ev, &opts);
    for (size_t j = 0; j < out.n_blocks && j < FUZZ_CHECK_BLOCKS; j++) {
        check(out.blocks[j].ext == ev->hashes[j]);
        size_t win = bs + (ev->is_eagle ? 1 : 0);
        uint64_t mmh[64];
        kvr_block_mm_t mm = {0, mmh, oracle_mm(ev, (uint32_t)j, mmh, 64)};
        opts.mm = mm.n_hashes > 0 ? &mm : NULL;
        opts.n_mm = mm.n_hashes > 0;
        long got = kvr_hash_blocks(ev->tokens + j * bs, win, bs, &opts, lbh, 1);
        if (mm.n_hashes < 64) /* the oracle's own cap */
            check(got == 1 && lbh[0] == out.blocks[j].lbh);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_kv_events_t dec;
    static int ready;
    if (!ready) {
        kvr_kv_events_init(&dec);
        dec.limits.max_tokens = FUZZ_MAX_TOKENS;
        dec.limits.max_hashes = FUZZ_MAX_HASHES;
        dec.limits.max_events = FUZZ_MAX_EVENTS;
        dec.limits.max_payload_bytes = FUZZ_MAX_PAYLOAD;
        ready = 1;
    }

    int st = kvr_kv_events_decode(&dec, data, size);
    if (st != KVR_OK) {
        check(st < 0 && one_line(dec.err) && dec.n_events == 0);
        return 0;
    }
    check(dec.err[0] == '\0' && dec.n_events <= FUZZ_MAX_EVENTS);
    kvr_kv_counts_t c = {0};
    for (size_t i = 0; i < dec.n_events; i++) {
        const kvr_kv_event_t *ev = &dec.events[i];
        check_event(&dec, ev);
        c.errors += ev->status != KVR_OK;
        c.ignored += ev->status == KVR_OK && ev->kind == KVR_KV_IGNORED;
        c.remote += ev->remote;
        c.unknown_medium += ev->unknown_medium;
    }
    check(memcmp(&c, &dec.counts, sizeof c) == 0);
    cross_check(&dec, data, size);

    static const kvr_worker_t workers[] = {{1, 0}, {UINT64_MAX, 7}, {42, UINT32_MAX}};
    for (size_t i = 0; i < dec.n_events; i++) {
        const kvr_kv_event_t *ev = &dec.events[i];
        const kvr_worker_t w = workers[i % 3];
        convert(&dec, i, 16, w);
        if (ev->status == KVR_OK && ev->block_size != 0 && ev->block_size != 16)
            convert(&dec, i, ev->block_size, w);
    }
    return 0;
}
