/*
 * fuzz_disagg.c: libFuzzer target for the disaggregation readers (wire/disagg.c): request
 * bodies (what a decode or prefill engine reads: kv_transfer_params, the bootstrap triple)
 * and prefill answers (what the router reads: an untrusted worker's bytes).
 *
 * Invariants checked: no crash, no read outside the input (ASan); a refused body leaves the
 * output zeroed; an accepted one has NUL-terminated strings without backslashes, a port in
 * [1, 65535] or 0, a room within [0, 2^63 - 1]; pull_ready implies every piece it names; an
 * answer's kv_transfer_params span lies inside the input, starts with '{' and ends with '}'
 * for an object; the room rule keeps room mod dp_size = rank for values drawn from the input.
 * Memory: none. Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/disagg.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static void check_str(const char *s)
{
    size_t n = strnlen(s, KVR_DISAGG_STR_BYTES);
    check(n < KVR_DISAGG_STR_BYTES);
    check(memchr(s, '\\', n) == NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *b = (const char *)data;
    kvr_disagg_req_t r;
    char err[200];
    int rc = kvr_disagg_parse_req(b, size, &r, err, sizeof err);
    if (rc != KVR_OK) {
        static const kvr_disagg_req_t zero;
        check(memcmp(&r, &zero, sizeof r) == 0);
        check(err[0] != '\0');
    } else {
        check_str(r.remote_host);
        check_str(r.remote_request_id);
        check_str(r.remote_engine_id);
        check_str(r.bootstrap_host);
        check(r.remote_port <= 65535 && r.bootstrap_port <= 65535);
        check(r.bootstrap_room <= (uint64_t)INT64_MAX);
        check(r.has_room || r.bootstrap_room == 0);
        if (kvr_disagg_pull_ready(&r))
            check(r.kvt == KVR_KVT_OBJECT && r.remote_port != 0 && r.remote_host[0] != '\0');
    }
    kvr_disagg_answer_t a;
    if (kvr_disagg_scan_answer(b, size, &a) == KVR_OK && a.kvt == KVR_KVT_OBJECT) {
        check(a.kvt_at + a.kvt_len <= size && a.kvt_len >= 2);
        check(b[a.kvt_at] == '{' && b[a.kvt_at + a.kvt_len - 1] == '}');
    } else if (a.kvt == KVR_KVT_ABSENT) {
        check(a.kvt_len == 0);
    }
    uint64_t v = 1;
    int rv = kvr_disagg_read_u64(b, size, "blocks", &v);
    check(rv == KVR_OK || v == 0);
    if (size >= 12) {
        uint64_t x;
        uint32_t dp;
        memcpy(&x, data, 8);
        memcpy(&dp, data + 8, 4);
        dp = dp % 300 + 1;
        uint32_t rank = (uint32_t)(x >> 40) % dp;
        uint64_t room = kvr_disagg_room(x, dp, rank);
        check(room <= (uint64_t)INT64_MAX && room % dp == rank);
    }
    return 0;
}
