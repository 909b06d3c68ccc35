/*
 * disagg.h: disaggregated prefill/decode on the wire. Two conventions carry a request from its
 * prefill worker to its decode worker:
 *   - vLLM's pull (NixlConnector): the prefill request carries
 *     "kv_transfer_params":{"do_remote_decode":true,...}; the prefill answer's top-level
 *     "kv_transfer_params" (the object naming where its KV waits: remote_engine_id,
 *     remote_request_id, remote_host, remote_port, remote_block_ids, tp_size) goes verbatim
 *     into the decode request, whose worker reads the KV from there;
 *   - SGLang's bootstrap: the same body goes to both workers with "bootstrap_host",
 *     "bootstrap_port" and "bootstrap_room" (the rendezvous key) added.
 * This module reads those fields without building the JSON (wire/json_scan.h, strict: the
 * bytes come from clients and workers) and holds the bootstrap room rule. The router copies
 * a prefill answer's kv_transfer_params without interpreting it; only the mocker's decode
 * role reads its members.
 *
 * Strings read here (hosts, ids) are taken as they are between their quotes and must not
 * contain escapes: addresses and engine-generated ids never do, and refusing them keeps the
 * reader allocation-free (an escaped one reads as a problem naming the field).
 * Pure: no allocation, no globals, any thread. Cost: one strict pass over the top-level
 * members (and the few nested ones named).
 */
#ifndef KVR_WIRE_DISAGG_H
#define KVR_WIRE_DISAGG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_DISAGG_STR_BYTES 256

/* What a body's "kv_transfer_params" is. */
typedef enum kvr_kvt_kind {
    KVR_KVT_ABSENT = 0,
    KVR_KVT_NULL,
    KVR_KVT_OBJECT,
    KVR_KVT_OTHER, /* a string, number, array or boolean: not usable */
} kvr_kvt_kind_t;

/* The disaggregation fields of a generation request (what an engine reads). */
typedef struct kvr_disagg_req {
    kvr_kvt_kind_t kvt;
    bool do_remote_decode;  /* a prefill request: keep the KV for a decode worker */
    bool do_remote_prefill; /* a decode request: the KV is elsewhere, read it */
    char remote_host[KVR_DISAGG_STR_BYTES];
    uint32_t remote_port; /* 0 = absent */
    char remote_request_id[KVR_DISAGG_STR_BYTES];
    char remote_engine_id[KVR_DISAGG_STR_BYTES];
    bool has_room; /* bootstrap_room given (not null) */
    char bootstrap_host[KVR_DISAGG_STR_BYTES];
    uint32_t bootstrap_port; /* 0 = absent or null */
    uint64_t bootstrap_room;
} kvr_disagg_req_t;

/* Reads body's disaggregation fields (unknown and irrelevant members skipped). KVR_OK;
 * KVR_EPARSE (not one JSON object); KVR_EINVAL (a field of the wrong type or out of range:
 * err names it, "kv_transfer_params.remote_port: not an integer in [1, 65535]"). */
int kvr_disagg_parse_req(const char *body, size_t len, kvr_disagg_req_t *out, char *err,
                         size_t err_len);

/* vLLM's condition for a decode worker to read remote KV: do_remote_prefill with the remote
 * host, port, request id and engine id all present. */
bool kvr_disagg_pull_ready(const kvr_disagg_req_t *r);

/* What the router needs of a prefill worker's whole answer. */
typedef struct kvr_disagg_answer {
    kvr_kvt_kind_t kvt;
    size_t kvt_at, kvt_len; /* the value's bytes (KVR_KVT_OBJECT) */
    bool finish_stop;       /* choices[0].finish_reason is "stop": the answer is complete */
} kvr_disagg_answer_t;

/* KVR_OK; KVR_EPARSE when json is not one valid JSON object (strict). */
int kvr_disagg_scan_answer(const char *json, size_t len, kvr_disagg_answer_t *out);

/* A top-level integer member of one JSON object (the KV reads' answers, {"blocks":N}).
 * KVR_OK; KVR_ENOTFOUND (no such member, or null); KVR_EINVAL (not an integer in
 * [0, 2^64 - 1]); KVR_EPARSE (not one JSON object). */
int kvr_disagg_read_u64(const char *json, size_t len, const char *key, uint64_t *out);

/* A bootstrap room from a random 64-bit value: uniform in [0, 2^63 - 1] with
 * room mod dp_size = rank (the prefill engine's data-parallel controller sends room mod
 * dp_size to that rank). rank < dp_size, dp_size >= 1. */
uint64_t kvr_disagg_room(uint64_t rnd, uint32_t dp_size, uint32_t rank);

#endif /* KVR_WIRE_DISAGG_H */
