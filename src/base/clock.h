/*
 * clock.h: the monotonic clock, for the layers above core (core never reads a clock: its
 * callers pass the time in, and the router's phase timings come from the function the caller
 * hands it, kvr_router_set_clock).
 *
 * Invariants: CLOCK_MONOTONIC, any origin: never goes back. Threads: any. Cost: one vDSO call.
 */
#ifndef KVR_BASE_CLOCK_H
#define KVR_BASE_CLOCK_H

#include <stdint.h>

uint64_t kvr_now_ms(void); /* CLOCK_MONOTONIC milliseconds */
uint64_t kvr_now_ns(void); /* CLOCK_MONOTONIC nanoseconds */

#endif /* KVR_BASE_CLOCK_H */
