/*
 * engine.h: the simulated inference engine (vLLM V1-style continuous batching over the paged
 * KV cache of sim/kvcache.h), shared by `kvrouter mocker` (real time) and `kvrouter sim`
 * (virtual time). Pure computation: no clock, no I/O; the caller runs the steps and owns time.
 *
 * A step (one engine iteration):
 *   kvr_engine_step_begin()  schedules: running requests first, in order (a decode token each,
 *                            or their next prefill chunk), then waiting requests FCFS while the
 *                            token budget (max_num_batched_tokens), max_num_seqs and free
 *                            blocks allow. A running request that cannot get a block preempts
 *                            the most recently admitted running request (vLLM's recompute
 *                            preemption: its blocks are released, it goes back to the front of
 *                            the waiting queue with nothing computed, and its cached prefix is
 *                            found again when it is readmitted). A waiting request's first
 *                            admission looks its prompt up in the prefix cache (at most
 *                            prompt - 1 tokens hit, as vLLM leaves one to compute).
 *                            Returns the step's modelled duration.
 *   (the caller lets that much time pass)
 *   kvr_engine_step_end()    applies it: computed tokens advance, full blocks are committed
 *                            (STORED events), each request whose known tokens are all computed
 *                            samples one output token (the first ends its prefill), finished
 *                            requests release their blocks. Outputs go to the callback.
 * Timing (ms; the reference's polynomial defaults, section 9):
 *   prefill(T) = a T^2 + b T + c, T = uncached prompt tokens computed in the step;
 *   decode(u)  = max(decode_min_ms, d u^2 + e u + f), u = active KV blocks / all blocks;
 *   a step with prefill tokens takes max(prefill(T), decode(u)) if it also decodes, else
 *   prefill(T); a decode-only step decode(u). So prefix-cache hits shorten prefill.
 * Output tokens are generated, not sampled: token k of a request is a hash of (seed, the
 * prompt's tokens, k), so runs are deterministic and equal prompts give equal outputs.
 * A request finishes with "length" when it has max_tokens outputs; prompt + max_tokens must fit
 * in max_model_len (the server applies vLLM's defaults and errors before calling add).
 *
 * Ownership: the engine copies each request's prompt; `user` is the caller's, returned in
 * outputs. Threads: one thread. Memory: O(num_blocks) at creation, plus per live request its
 * tokens and hashes (prompt + max_tokens); the waiting queue is capped (max_waiting).
 * Cost: step_begin/end O(scheduled requests + blocks touched + hashed tokens).
 */
#ifndef KVR_CORE_ENGINE_H
#define KVR_CORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sim/kvcache.h"

typedef struct kvr_engine_timing {
    double prefill_a, prefill_b, prefill_c; /* ms */
    double decode_a, decode_b, decode_c;    /* ms */
    double decode_min_ms;
} kvr_engine_timing_t;

/* 4.209989e-07 T^2 + 1.518344e-02 T + 16.50142; -25.74 u^2 + 54.01 u + 5.74, >= 1 ms. */
void kvr_engine_timing_default(kvr_engine_timing_t *t);

typedef struct kvr_engine_config {
    uint32_t num_gpu_blocks;         /* 16384 */
    uint32_t block_size;             /* 16 */
    uint32_t max_num_seqs;           /* 256 */
    uint32_t max_num_batched_tokens; /* 8192 */
    uint32_t max_model_len;          /* 0 = num_gpu_blocks * block_size */
    uint32_t max_waiting;            /* waiting-queue cap, 65536 */
    bool enable_chunked_prefill;     /* true */
    bool enable_prefix_caching;      /* true */
    uint64_t seed;                   /* 0 */
    uint32_t vocab_size;             /* generated ids in [KVR_ENGINE_FIRST_GEN_TOKEN, vocab) */
    kvr_engine_timing_t timing;
} kvr_engine_config_t;

#define KVR_ENGINE_FIRST_GEN_TOKEN 256u

void kvr_engine_config_default(kvr_engine_config_t *cfg);
/* Range checks; err names the field ("max_num_batched_tokens: must be >= block_size"). */
int kvr_engine_config_validate(const kvr_engine_config_t *cfg, char *err, size_t err_len);

typedef struct kvr_engine_request {
    uint64_t id;            /* unique among live requests */
    const uint32_t *tokens; /* the prompt (copied) */
    uint32_t n_tokens;      /* >= 1 */
    uint32_t max_tokens;    /* >= 1; n_tokens + max_tokens <= max_model_len */
    void *user;
    const char *lora_name; /* a LoRA adapter (its blocks are its own: hashes salted by it, and
                              its KV events name it); NULL = the base model. Borrowed: must
                              outlive the request */
    /* Disaggregation. hold_kv (a prefill worker's request): when it finishes, its blocks stay
     * held (counted in use, never evicted) until kvr_engine_release_held, as a prefill engine
     * keeps a prompt's KV until the decode worker has read it. kv_loaded (a decode worker's):
     * the prompt's KV was transferred in; at its first admission every prompt token but the
     * last counts as computed, their full blocks are committed (STORED events) and only the
     * last token is computed, in a step costed as a decode (vLLM's decode side recomputes the
     * last prompt token). A preempted kv_loaded request loses the KV and recomputes. */
    bool hold_kv;
    bool kv_loaded;
} kvr_engine_request_t;

typedef enum kvr_engine_finish {
    KVR_ENGINE_RUNNING = 0,
    KVR_ENGINE_FINISHED_LENGTH, /* max_tokens (or max_model_len) reached */
} kvr_engine_finish_t;

/* One generated token. */
typedef struct kvr_engine_output {
    uint64_t id;
    void *user;
    uint32_t token;
    uint32_t n_output;       /* outputs so far, including this one */
    uint32_t prompt_tokens;
    uint32_t cached_tokens;  /* prompt tokens found in the prefix cache at first admission */
    bool first;              /* the first output: the prefill is done */
    kvr_engine_finish_t finish;
    uint32_t kv_blocks; /* blocks the request holds (the prompt's KV, hold_kv) */
} kvr_engine_output_t;

typedef void (*kvr_engine_output_fn)(void *ctx, const kvr_engine_output_t *out);

typedef struct kvr_engine_step {
    bool idle;                 /* nothing to run: no step begun */
    double duration_ms;        /* modelled */
    uint32_t n_prefill_tokens; /* uncached prompt tokens computed */
    uint32_t n_decode;         /* requests decoding one token */
    uint32_t n_scheduled;      /* requests in the step */
    uint32_t n_preempted;      /* preemptions while scheduling */
} kvr_engine_step_t;

typedef struct kvr_engine_stats {
    uint32_t running, waiting;
    uint32_t held;                   /* finished hold_kv requests whose blocks are still held */
    uint64_t held_blocks;            /* blocks they hold */
    uint64_t kv_loaded_requests;     /* kv_loaded requests admitted with their KV */
    uint64_t kv_loaded_tokens;       /* prompt tokens they did not compute */
    uint64_t held_released;          /* holds released (kvr_engine_release_held or cancel) */
    double kv_usage;                 /* active blocks / all blocks */
    uint64_t prefix_queries_tokens;  /* prompt tokens looked up at first admission */
    uint64_t prefix_hits_tokens;     /* of which found cached */
    uint64_t preemptions;
    uint64_t steps;
    uint64_t prompt_tokens, generation_tokens;
    uint64_t requests_finished, requests_cancelled;
    kvr_kvcache_stats_t cache;
} kvr_engine_stats_t;

typedef struct kvr_engine kvr_engine_t;

/* NULL with *status = KVR_EINVAL (invalid config; see validate) or KVR_ENOMEM. KV-cache events
 * are forwarded to sink (may be NULL). */
kvr_engine_t *kvr_engine_new(const kvr_engine_config_t *cfg, kvr_kvcache_sink_fn sink,
                             void *sink_ctx, int *status);
void kvr_engine_free(kvr_engine_t *e);
/* A deep copy of src, in the same state (mid-step included), whose cache emits no events: run
 * forward, it does exactly what src would with the same calls (the simulator's clairvoyant
 * policy asks it what a request would meet). NULL with *status KVR_ENOMEM. O(num_blocks +
 * the live requests' buffers). */
kvr_engine_t *kvr_engine_clone(const kvr_engine_t *src, int *status);

/* Queues a request. KVR_OK; KVR_EINVAL (empty prompt, max_tokens 0); KVR_ETOOBIG (prompt +
 * max_tokens > max_model_len); KVR_EEXIST (id live); KVR_EQUEUEFULL (max_waiting);
 * KVR_ENOMEM. Allowed during a step (it waits for the next one). */
int kvr_engine_add(kvr_engine_t *e, const kvr_engine_request_t *req);

/* Drops a live request (or a held one) and frees its blocks. KVR_OK; KVR_ENOTFOUND. During a step,
 * a request the step scheduled is dropped at step_end (no output; its id stays live until then). */
int kvr_engine_cancel(kvr_engine_t *e, uint64_t id);

/* Frees the blocks a finished hold_kv request kept (its id is no longer live); not from an
 * output callback (the step still holds the request). KVR_OK;
 * KVR_ENOTFOUND (no such request); KVR_EINVAL (it is not held: still running or waiting,
 * or not hold_kv; cancel it instead). */
int kvr_engine_release_held(kvr_engine_t *e, uint64_t id);

/* The physical block ids a held request keeps (its KV's place, as a prefill engine names
 * them to its decode worker): their count, *ids pointing into the engine (valid until the
 * hold is released); 0 when id is not held. */
size_t kvr_engine_held_blocks(const kvr_engine_t *e, uint64_t id, const uint32_t **ids);

/* See above. KVR_EBUSY if a step is already begun. */
int kvr_engine_step_begin(kvr_engine_t *e, kvr_engine_step_t *step);
/* KVR_EINVAL if no step is begun. cb may be NULL. */
int kvr_engine_step_end(kvr_engine_t *e, kvr_engine_output_fn cb, void *ctx);

/* True when a step_begin would schedule something (waiting or running requests). */
bool kvr_engine_has_work(const kvr_engine_t *e);
bool kvr_engine_in_step(const kvr_engine_t *e);

/* vLLM's reset_prefix_cache (KVR_EBUSY while requests run). */
int kvr_engine_reset_prefix_cache(kvr_engine_t *e);

void kvr_engine_get_stats(const kvr_engine_t *e, kvr_engine_stats_t *out);
const kvr_kvcache_t *kvr_engine_cache(const kvr_engine_t *e);
const kvr_engine_config_t *kvr_engine_config(const kvr_engine_t *e);

/* Invariants of the engine and its cache (every live request's table, queue states).
 * KVR_OK or KVR_EINVAL. */
int kvr_engine_verify(const kvr_engine_t *e);

#endif /* KVR_CORE_ENGINE_H */
