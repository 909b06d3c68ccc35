/*
 * peer_reqs.h: which peer replica booked each request this router learnt from replica sync,
 * so that a peer that goes away takes its requests with it (the load tracker knows requests,
 * not who booked them). Keyed by the request id's 64-bit hash (seeded XXH3; a collision would
 * only mislabel one request's origin), holding the origin router and the tracker's handle.
 *
 * It also counts the entries of each origin (a fixed table of KVR_PEER_REQS_MAX_ORIGINS
 * origins with at least one entry), so that replica sync can bound what one peer books.
 *
 * Invariants (kvr_peer_reqs_verify): every entry is reachable from its home (oatab.h); the
 * count is the number of entries; the table is at most half full; no entry has handle 0;
 * each origin's count is the number of its entries, and only origins with entries are held.
 * Ownership: owns its table. Threads: one (the event loop). Cost: put / take O(1) expected;
 * take_origin and sweep O(capacity) and O(budget); memory 24 bytes a slot, 2 to 4 slots an
 * entry.
 */
#ifndef KVR_CORE_PEER_REQS_H
#define KVR_CORE_PEER_REQS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"

typedef struct kvr_peer_reqs kvr_peer_reqs_t;

kvr_peer_reqs_t *kvr_peer_reqs_new(uint64_t seed);
void kvr_peer_reqs_free(kvr_peer_reqs_t *t);
#define KVR_PEER_REQS_MAX_ORIGINS 256u

/* Records (or replaces) id's origin and handle. KVR_OK, KVR_EINVAL (handle 0), KVR_ENOMEM,
 * KVR_EFULL (origin is new and KVR_PEER_REQS_MAX_ORIGINS origins have entries); on error
 * nothing changes. */
int kvr_peer_reqs_put(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t origin,
                      kvr_req_handle_t h);
/* Removes id's entry: true with its origin and handle (either may be NULL), false if none. */
bool kvr_peer_reqs_take(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t *origin,
                        kvr_req_handle_t *h);
/* Removes id's entry only when origin booked it: true with its handle (h may be NULL). */
bool kvr_peer_reqs_take_from(kvr_peer_reqs_t *t, const char *id, size_t id_len, uint64_t origin,
                             kvr_req_handle_t *h);
/* Whether id has an entry, and its origin and handle (either may be NULL). */
bool kvr_peer_reqs_get(const kvr_peer_reqs_t *t, const char *id, size_t id_len,
                       uint64_t *origin, kvr_req_handle_t *h);
/* Removes every entry of origin (all of them when origin is 0), calling fn with each handle.
 * Returns how many. KVR_ENOMEM leaves the table as it was and returns 0 with *status set. */
size_t kvr_peer_reqs_take_origin(kvr_peer_reqs_t *t, uint64_t origin,
                                 void (*fn)(void *arg, kvr_req_handle_t h), void *arg,
                                 int *status);
/* Removes entries whose request is gone (live(arg, h) false), looking at up to budget slots
 * from where the last sweep stopped. Returns how many it removed. */
size_t kvr_peer_reqs_sweep(kvr_peer_reqs_t *t, bool (*live)(void *arg, kvr_req_handle_t h),
                           void *arg, size_t budget);
size_t kvr_peer_reqs_count(const kvr_peer_reqs_t *t);
/* The entries of origin; the origins that have any. O(1) expected. */
size_t kvr_peer_reqs_origin_count(const kvr_peer_reqs_t *t, uint64_t origin);
size_t kvr_peer_reqs_origins(const kvr_peer_reqs_t *t);
int kvr_peer_reqs_verify(const kvr_peer_reqs_t *t, char *msg, size_t msg_len);

#endif
