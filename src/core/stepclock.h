/*
 * stepclock.h: what the router infers of a worker's engine from when its steps end: how long
 * the running step has left, and how far the engine has got through the prefill booked on it.
 * An engine runs one step (one batch: prefill chunks and a decode token per running request)
 * at a time while it has work, so a request routed to a busy worker cannot start its prefill
 * before the step under way ends. That wait is the same for every prompt and differs between
 * workers by up to a whole step: a worker that has just begun a long prefill step makes a new
 * request wait for all of it, one about to end for almost nothing.
 *
 * The router learns the ends in one of two ways: told of each (the simulator,
 * kvr_stepclock_end), or from streamed tokens (kvr_stepclock_token): every running request
 * gets one token per step, so a request receiving a second token since the last end known
 * proves a new step ended; a request's first token does so only when it comes more than half
 * a mean step after the last end. Tokens of one step reach the router one request at a time,
 * over a few milliseconds when many run: this rule never takes that spread for steps, where a
 * rule on time alone would, and learn a "step" of the spacing between two streams' tokens.
 * It keeps the time of the last end, an exponentially weighted mean of all step durations
 * (weight 1/10 on the newest), and a step length model. The model's means are the plain
 * mean of their first ten samples, then 1/10 on the newest. Steps that computed no prompt
 * token last their mean length; the others a + n b, n being the prompt tokens the prefill
 * stream (below) estimates the step computed, a and b the least-squares line through the
 * means of n, length, n^2 and n x length of those steps (their mean length while their n
 * spread less than KVR_STEPCLOCK_MIN_SPREAD tokens). A step's length grows with the prompt
 * tokens it computes (in the simulator's reference polynomial a chunk of 8,192 takes 169 ms,
 * a decode step 6-15), so one mean would take the step of a long prefill for an average one
 * and tell a newcomer it ends in a few milliseconds when it has 100 left. The line goes
 * through the prefill steps, not through the decode steps' length, because a step with any
 * prefill has its own fixed cost (16.5 ms in that polynomial). The
 * predicted wait is the expected length of the step under way less the time since the last
 * end, at least 0. A rank that had no work starts a step when work arrives
 * (kvr_stepclock_wake), so the time it sat idle is never taken for a step's length.
 *
 * The prefill stream. An engine admits waiting requests first come first served, and a step
 * computes at most a chunk of prompt tokens (max_num_batched_tokens), so the prompts booked on
 * a rank are computed as one stream, in booking order, a chunk per step. The clock numbers the
 * stream's tokens (kvr_stepclock_book: a booking's uncached tokens take the next positions)
 * and estimates how far it is computed: a step computes up to a chunk of what was booked when
 * it began; a request's first token proves its prompt computed (kvr_stepclock_prefilled); a
 * rank with nothing in flight has computed all of it. A block an engine computes is cached
 * (and reported) at the end of its step, and a request admitted in the same step as the one
 * computing a block of its prompt computes that block again (an engine matches its prefix
 * cache only when it admits a request), so a request booked now finds cached exactly the
 * stream computed by the steps before the one that admits it
 * (kvr_stepclock_computed_before): the rest of the step under way, and every following step
 * whose chunk the stream ahead of it fills.
 *
 * Rules: ends closer to the last than a quarter of the mean (at least KVR_STEPCLOCK_SAME_US)
 * are the same step's; a gap longer than KVR_STEPCLOCK_MAX_US is not a step (an idle time the
 * router did not see begin) and only moves the clock. Time is the caller's, in microseconds;
 * an end earlier than the last is ignored, and a wait asked for at a time before the last end
 * (a caller whose route time is coarser than its step times) counts as asked at that end.
 * Stream positions are tokens since the rank joined (64 bits never wrap).
 * Memory: none. Threads: the caller's lock. Cost: O(1) per call.
 */
#ifndef KVR_CORE_STEPCLOCK_H
#define KVR_CORE_STEPCLOCK_H

#include <stdbool.h>
#include <stdint.h>

#define KVR_STEPCLOCK_SAME_US 500u
#define KVR_STEPCLOCK_MAX_US 10000000u
/* The standard deviation of the prompt tokens of recent prefill steps, below which the model
 * fits no slope: those steps' lengths then differ by noise more than by their tokens. */
#define KVR_STEPCLOCK_MIN_SPREAD 64.0
/* The chunk assumed when a worker's max_num_batched_tokens is not known: the mocker's default,
 * and vLLM's OpenAI server's on GPUs of 70 GiB or more other than the A100. */
#define KVR_STEPCLOCK_DEFAULT_CHUNK 8192u

typedef struct kvr_stepclock {
    uint64_t last_us; /* the last step end or wake; 0 = none yet */
    uint64_t ends;    /* step ends recorded: the serial of the step under way */
    double mean_us;   /* weighted mean step duration; 0 = no step measured */
    uint64_t steps;   /* step durations measured */
    /* the step length model (weighted means): steps computing no prompt token last decode_us;
     * the others a + n b, fitted by least squares to the weighted means of n, length, n^2
     * and n x length of those steps */
    double decode_us;       /* of the steps that computed none */
    double pf_n, pf_us;     /* of the others: prompt tokens computed, length */
    double pf_nn, pf_nus;   /* ... n^2, n x length */
    uint64_t decode_steps;  /* steps measured into decode_us */
    uint64_t prefill_steps; /* steps measured into pf_* */
    /* the prefill stream, in tokens */
    uint64_t booked; /* booked on the rank: the stream's end */
    uint64_t done;   /* computed (an estimate; never past booked) */
    uint64_t base;   /* computed when the step under way began */
    uint64_t avail;  /* booked when the step under way began: what it may compute */
    uint32_t chunk;  /* prompt tokens a step computes at most (the last booking's) */
} kvr_stepclock_t;

/* A step of this rank ended at now_us. */
void kvr_stepclock_end(kvr_stepclock_t *c, uint64_t now_us);

/* A streamed token of one request on this rank arrived at now_us. *seen is the request's own
 * (0 before its first token): the step it last had a token of. */
void kvr_stepclock_token(kvr_stepclock_t *c, uint64_t *seen, uint64_t now_us);

/* The rank had no work and got some at now_us: its next step begins now. */
void kvr_stepclock_wake(kvr_stepclock_t *c, uint64_t now_us);

/* A booking of tokens uncached prompt tokens on the rank, an engine computing at most chunk
 * (> 0) of them a step; idle: the rank had nothing in flight, so all booked before is
 * computed. Returns the stream position its first token takes. */
uint64_t kvr_stepclock_book(kvr_stepclock_t *c, uint64_t tokens, bool idle, uint32_t chunk);

/* A request whose stream ends at position end (its booking's position + tokens) got its first
 * token: the stream up to there is computed. */
void kvr_stepclock_prefilled(kvr_stepclock_t *c, uint64_t end);

/* The stream position a request booked now finds computed when its engine admits it: the
 * steps before the one it joins (busy: the rank has a step under way; an idle rank starts one
 * for it at once). */
uint64_t kvr_stepclock_computed_before(const kvr_stepclock_t *c, bool busy);

/* Milliseconds the step under way at now_us is expected still to run: its expected length
 * less the time since it began, at least 0 (0 when no step length is known yet). Its length
 * is the step length model's for the prompt tokens it computes (the stream's estimate), once
 * the model has measured a step of that kind (one computing prompt tokens, or one computing
 * none); until then the mean of all steps. Only meaningful while the rank has work. */
double kvr_stepclock_wait_ms(const kvr_stepclock_t *c, uint64_t now_us);

/* The fitted slope of the prefill steps' length, in us per prompt token: false (and *us
 * untouched) while none is fitted (no prefill step measured, their tokens spread under
 * KVR_STEPCLOCK_MIN_SPREAD, or a slope <= 0). */
bool kvr_stepclock_slope(const kvr_stepclock_t *c, double *us_per_token);
/* Checks the stated invariants: a finite mean >= 0, no mean without a step, no more steps
 * measured than ends recorded; base <= done <= booked and avail <= booked. */
bool kvr_stepclock_verify(const kvr_stepclock_t *c);

#endif
