/*
 * clock.h: the clocks, for the layers above core (core never reads a clock: its callers pass
 * the time in, and the router's phase timings come from the function the caller hands it,
 * kvr_router_set_clock). The one place the tree reads them.
 *
 * Invariants: kvr_now_* are CLOCK_MONOTONIC, any origin, never going back (durations,
 * deadlines); kvr_wall_ns is CLOCK_REALTIME, Unix time, which may step (timestamps shown to
 * people or sent to other hosts). Threads: any. Cost: one vDSO call.
 */
#ifndef KVR_BASE_CLOCK_H
#define KVR_BASE_CLOCK_H

#include <stdint.h>

uint64_t kvr_now_ms(void); /* CLOCK_MONOTONIC milliseconds */
uint64_t kvr_now_ns(void); /* CLOCK_MONOTONIC nanoseconds */
double kvr_now_s(void);    /* CLOCK_MONOTONIC seconds */
uint64_t kvr_wall_ns(void); /* CLOCK_REALTIME: nanoseconds since the Unix epoch */

#endif /* KVR_BASE_CLOCK_H */
