/*
 * mocker_rank.h (private to src/mocker): one data-parallel rank: its engine, stepped in real
 * time divided by --speedup, and its KV events, encoded and published one batch per step.
 * A rank knows nothing of requests: the engine's tokens go to the output callback it was made
 * with (mocker_admit.c's), the engine's `user` pointer passed through.
 * Invariants: a rank runs at most one step at a time (stepping); after delivering a step it
 * begins the next while its engine has work. Ownership: the rank owns its engine, encoder,
 * publisher and events (mk_rank_free). Threads: the loop thread only. Cost: a step due
 * within 20 us runs from the loop at once instead of through a timer.
 */
#ifndef KVR_MOCKER_RANK_H
#define KVR_MOCKER_RANK_H

#include <stddef.h>
#include <stdint.h>

#include <event2/util.h>

#include "mocker/mocker_state.h"

/* Makes rank idx of m (engine seeded seed + idx; a publisher when events are on). */
int mk_rank_init(kvr_mocker_t *m, uint32_t idx, void *zmq_ctx, kvr_engine_output_fn on_output,
                 char *err, size_t err_len);
void mk_rank_free(rank_t *rk); /* safe on a rank never (or half) made */

/* Begins rk's next step if it has work and none runs. */
void mk_rank_kick(rank_t *rk);
/* Publishes the events gathered since the last batch (a reset's CLEARED). */
void mk_rank_flush(rank_t *rk);
/* The replay backstop timer's callback (arg: the mocker): serves every rank's replay socket. */
void mk_ranks_replay_tick(evutil_socket_t fd, short what, void *arg);

#endif /* KVR_MOCKER_RANK_H */
