/*
 * ix_api.h: the query side of the indexer API, shared by the standalone indexer (`kvrouter
 * indexer`, indexer/indexer_server.h) and a router that serves its own index (`serve
 * --serve-indexer`): POST /query and POST /query_by_hash (JSON, or MessagePack by
 * Content-Type) and GET /dump, with the reference indexer's shapes:
 *
 *   {"scores": {"<instance>": {"<dp_rank>": tokens}},
 *    "frequencies": [workers holding prefix block 0, block 1, ...],
 *    "instances": {"<instance>": {"longest_matched": t, "gpu": t, "dp": {"<rank>": t},
 *                                 "cpu": t, "disk": t}}}
 *
 * in tokens (blocks x the partition's block size): gpu is the instance's best device prefix
 * over its ranks, cpu and disk cumulative through the host and disk tiers, longest_matched
 * their maximum; scores hold the ranks with a device match. /query hashes token_ids with the
 * partition's block size, lora_name and cache_salt (as the cache namespace); /query_by_hash
 * takes local block hashes and chains them. Errors: {"error": "..."} with 400 (malformed
 * body, naming the field), 404 (no partition for model_name / routing_group), 415 (a
 * Content-Type that is neither JSON nor MessagePack), 500.
 *
 * POST /record_routing_decision (approximate mode: another router's decision, its local and
 * sequence hashes paired; wire/api_json.h checks the pairing) goes to the owner's record op:
 * 200 {"status":"ok"}, 400 (malformed, a mismatched pair, or a block_size other than the
 * partition's), 404 (no partition), 409 (this
 * indexer's partition is fed by KV events, or it records no decisions), 501 (no record op).
 *
 * The owner answers "which partition" (find) and writes the dump; this module decodes,
 * hashes, looks up and encodes. Threads: the owner's HTTP thread, registered as an index
 * reader. Ownership: the api borrows ops->arg. Cost per query: the decode (one pass), the
 * hash (one XXH3 per block), one index lookup, and an answer linear in matched workers plus
 * matched depth; no allocation once buffers have grown.
 */
#ifndef KVR_NET_IX_API_H
#define KVR_NET_IX_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "wire/api_json.h"
#include "wire/json_writer.h"

struct evhttp_request;
struct kvr_prom;

/* One partition's index, as the owner lends it for a query. */
typedef struct kvr_ix_part {
    kvr_index_t *ix;
    uint32_t block_size;
    bool eagle;
    /* only these workers count (a router's index shared by several models); NULL = all */
    bool (*keep)(void *arg, kvr_worker_t w);
    void *keep_arg;
} kvr_ix_part_t;

typedef struct kvr_ix_api_ops {
    /* the partition for q's model_name / routing_group: KVR_OK, or KVR_ENOTFOUND */
    int (*find)(void *arg, const kvr_ix_query_t *q, kvr_ix_part_t *out);
    /* writes the whole dump object ({"<model>:<group>": {...}}): KVR_OK or a status */
    int (*dump)(void *arg, kvr_json_writer_t *w);
    /* records a routing decision: KVR_OK; KVR_ENOTFOUND (no such partition); KVR_EEXIST (the
     * partition or this rank is fed by KV events); KVR_EMISMATCH (another block size);
     * another status; msg says why. NULL: the owner records none (501). */
    int (*record)(void *arg, const kvr_ix_record_t *rec, char *msg, size_t msg_len);
    /* sends an answer (the owner's headers and counters) */
    void (*reply)(void *arg, struct evhttp_request *req, int code, const char *ctype,
                  const char *data, size_t len);
    void *arg;
} kvr_ix_api_ops_t;

typedef struct kvr_ix_api_stats {
    uint64_t queries, queries_by_hash, msgpack_bodies;
    uint64_t bad_requests; /* 400 and 415 */
    uint64_t not_found;    /* 404: no such partition */
    uint64_t dumps;
    uint64_t records, records_refused; /* routing decisions: taken, refused (any non-200) */
} kvr_ix_api_stats_t;

typedef struct kvr_ix_api kvr_ix_api_t;

kvr_ix_api_t *kvr_ix_api_new(const kvr_ix_api_ops_t *ops);
void kvr_ix_api_free(kvr_ix_api_t *a);

/* Answers POST /query, POST /query_by_hash, POST /record_routing_decision and GET /dump;
 * false for any other request. */
bool kvr_ix_api_handle(kvr_ix_api_t *a, struct evhttp_request *req, const char *path, bool get,
                       bool post);

/* A query without HTTP (a NATS request, a bench): body in ctype ("application/json" when
 * NULL); *code gets the HTTP status and the answer is in the api's writer until the next
 * call (*out, *out_len). */
void kvr_ix_api_answer(kvr_ix_api_t *a, const char *ctype, const char *body, size_t len,
                       bool by_hash, int *code, const char **out, size_t *out_len);

/* A routing decision without HTTP (a NATS message): JSON body; as kvr_ix_api_answer. */
void kvr_ix_api_record(kvr_ix_api_t *a, const char *body, size_t len, int *code, const char **out,
                       size_t *out_len);

/* One entry of the dump: "<model>:<group>": {"block_size": N, "events": [RouterEvent...]},
 * the events those of the index whose worker keep accepts (NULL: all). The writer's
 * status, or the dump's. */
struct kvr_ingest;
typedef struct kvr_ix_dump_src {
    struct kvr_ingest *g; /* the index is dumped on its ingest thread; NULL: */
    kvr_index_t *ix;      /* ... on the caller's, its writer (a router in approximate mode) */
    bool (*keep)(void *arg, uint64_t worker_id);
    void *keep_arg;
} kvr_ix_dump_src_t;
int kvr_ix_api_dump_partition(kvr_json_writer_t *w, const char *model, const char *group,
                              uint32_t block_size, const kvr_ix_dump_src_t *src);

/* {"error": msg} into w (for the owner's own errors). */
void kvr_ix_api_error_body(kvr_json_writer_t *w, const char *msg);

void kvr_ix_api_stats(const kvr_ix_api_t *a, kvr_ix_api_stats_t *out);
void kvr_ix_api_metrics(const kvr_ix_api_t *a, struct kvr_prom *p);

#endif
