/*
 * ix_peer_regs.h: a peer indexer's registrations read back from its GET /workers answer
 * (indexer_server.c writes it; docs/indexer.md has the shape), so that an indexer recovering
 * the peer's index also subscribes to the engines that index follows (indexer_server.h,
 * "Start-up"). One entry per (instance, dp_rank), as POST /register takes it: instance_id,
 * endpoint (the rank's in "endpoints"), model_name, routing_group ("default" when absent),
 * block_size, dp_rank (the key), replay_endpoint (the rank's in "replay_endpoints", which
 * only a kvrouter indexer lists, and only for ranks that have one). Other members (listeners,
 * status) are skipped.
 *
 * The answer is a peer's: its size is bounded by the caller (kvr_http_fetch's max_bytes)
 * before it gets here, its structure is checked strictly (json_scan's STRICT mode), and the
 * whole answer is refused (KVR_EPARSE, err naming the entry and the member) when it is not an
 * array of objects, an entry misses instance_id, model_name, block_size or endpoints, gives
 * one twice, or names a replay endpoint for a rank it has no endpoint for; more than max
 * entries, or more than KVR_IX_PART_MAX_RANKS ranks in one entry, is KVR_EFULL. An entry
 * that reads but cannot be taken as given (a string with escapes, a source other than "zmq")
 * is returned with why set (a static text), so the caller counts and names it rather than
 * dropping it unseen. Addresses and names are not judged
 * here: the caller registers each entry with the checks of POST /register.
 *
 * Ownership: the entries point into b (their strings are not NUL-terminated: use the
 * lengths), so b must outlive them; *out is malloc'd and the caller's. Pure: no globals, any
 * thread. Cost: one pass over the answer, and per instance its ranks times its ranks (at
 * most KVR_IX_PART_MAX_RANKS each).
 */
#ifndef KVR_NET_IX_PEER_REGS_H
#define KVR_NET_IX_PEER_REGS_H

#include <stddef.h>

#include "wire/api_json.h"

/* (instance, dp_rank) listeners a partition of the indexer keeps, so the most ranks one
 * instance can have there. */
#define KVR_IX_PART_MAX_RANKS 1024

typedef struct kvr_ix_peer_reg {
    kvr_ix_register_t r; /* pointing into the answer */
    const char *why;     /* NULL: take it; else why it cannot be taken as given */
} kvr_ix_peer_reg_t;

/* KVR_OK with *out (*n entries; NULL when none); KVR_EPARSE, KVR_EFULL (err says why), or
 * KVR_ENOMEM, with *out NULL. */
int kvr_ix_peer_regs_read(const char *b, size_t len, size_t max, kvr_ix_peer_reg_t **out,
                          size_t *n, char *err, size_t err_len);

#endif
