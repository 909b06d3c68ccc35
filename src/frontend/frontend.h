/*
 * frontend.h: the OpenAI-compatible front end of `kvrouter serve`: a KV-aware reverse proxy
 * in front of the workers: a service of the HTTP host (http/host.h) beside the router API,
 * sharing the fleet's router, queue and fencing (fleet/fleet.h).
 *
 *   POST /v1/completions, POST /v1/chat/completions (streaming or not), GET /v1/models
 *
 * A request: decode (wire/openai.h) -> token ids (given, nvext.token_data, or text and chat
 * messages sent to a worker's vLLM-compatible POST /tokenize, cached by content) -> route and
 * book (the scheduler: KV-aware, queued while every eligible worker is busy) -> one
 * upstream request to the chosen worker's url, with the x-data-parallel-rank header of the
 * chosen rank -> the response relayed to the client (SSE event by event) -> free.
 *
 * What the worker receives. The client's body verbatim when it gave the prompt as token ids
 * and no nvext (the hot path: one copy, no re-encoding). Otherwise its top-level members are
 * kept byte for byte but for nvext (the router's, consumed here) and, for completions whose
 * ids came from text or nvext.token_data, the prompt, which becomes the ids the router
 * hashed; chat keeps its messages (so vLLM applies its own template to the text the ids came
 * from) and gets the ids as nvext.token_data (which the mocker runs). Either way the worker
 * computes the blocks the router hashed.
 *
 * Routing inputs: nvext.backend_instance_id or the header x-worker-instance-id (the header
 * wins) pins the worker; with nvext.dp_rank or x-dp-rank (alias x-data-parallel-rank) also
 * the rank, else the router picks among the pinned worker's ranks. A rank without a worker is
 * ignored. nvext.lora_name, priority, expected_output_tokens and allowed_worker_ids go to the
 * router as they are. With nvext.extra_fields ["worker_id"] each JSON response (every SSE
 * chunk but errors; the non-streaming object) gets "nvext":{"worker_id":{"prefill_worker_id",
 * "prefill_dp_rank","decode_worker_id","decode_dp_rank"}} as its last member, spliced in
 * before the closing brace by wire/json_splice.h (an nvext member the worker sent is dropped;
 * the other members are kept byte for byte). Worker bytes are not trusted: an answer that is
 * not exactly one valid JSON object is forwarded untouched, without nvext, and counted
 * (kvr_frontend_inject_failed_total). Every proxied response also carries the headers
 * x-kvrouter-worker-id and x-kvrouter-dp-rank.
 *
 * Load lifecycle: the first SSE event carrying a token marks the first token (for a
 * non-streaming request, its response headers); each token event that starts a new KV block
 * of prompt + output (counted as one token per event) is an output block, with the decay
 * max(0, 1 - generated / expected_output_tokens) when the request gave one; the end of the
 * response, an upstream error or the client's disconnect frees the booking. A client that
 * goes away cancels the upstream request (its connection is closed, which is how vLLM and the
 * mocker learn of it). libevent notices a client's close only once a reply has started, so
 * clients still waiting for their first byte are probed every 100 ms (a peek that reads EOF).
 *
 * Slow clients: what the router holds for a streaming client is bounded. When, after relaying
 * a chunk, more than frontend_max_client_buffer_bytes (default 16 MiB; at least 4096, there is
 * no "unlimited") wait unwritten in the client's output buffer, the request is aborted exactly
 * as a disconnect is (upstream cancelled, booking freed, the client's connection closed, no
 * [DONE]), counted in kvr_frontend_slow_client_aborts_total (not in client_disconnects) and
 * logged with a rate limit. The abort is deferred to a zero-delay timer (the request's retry
 * timer): the relay runs inside the upstream request's own callback, where libevent does not
 * allow cancelling it; until the timer runs, further upstream bytes are dropped. The bound is
 * therefore the cap plus one upstream read (at most 4 MiB). There is no backpressure (the
 * upstream is not paused): evhttp drives the upstream connection's read events itself, and
 * pausing them from outside was judged too fragile to rely on.
 * Non-streaming answers are held whole, as before (the worker's answer, not the client's pace,
 * bounds them). kvr_frontend_client_buffer_bytes is the total waiting across clients.
 *
 * Failures: an upstream that refuses the connection (or cannot be reached within
 * frontend_upstream_timeout_ms) or closes it before its response headers (the first byte) is
 * retried on the next-best worker (the router again, the failed workers excluded; a pinned
 * request has nowhere else to go), at most frontend_max_retries times; then 503. Each such
 * failure counts against the worker; frontend_fence_failures in a row fence it (as failed
 * health checks do) until its /health answers again. An upstream that accepted the request
 * and then stays silent past the timeout is not retried (it may still be generating): 504,
 * and it counts against the worker too. A failure after the first byte is not retried: a 502
 * before any byte reached the client, else an SSE error event and [DONE]. Worker answers other
 * than 200 (400, 404, 503 ...) are relayed as they are. Errors of the front end itself are in
 * vLLM's OpenAI shape: 400 bad request, 413 prompt too long, 429 queue full or timed out (or
 * busy with no queue), 503 no worker can serve. A /tokenize call is retried on any failure
 * (it is idempotent and quick).
 *
 * Tokenize cache: text -> ids, keyed by XXH3-128 of (endpoint, model, prompt text or each
 * message's role and content); a collision would need 2^64 distinct prompts, so keys are not
 * compared byte for byte. LRU within frontend_tokenize_cache_tokens ids (0 = no cache).
 * Concurrent misses of the same text each call /tokenize (no call sharing: misses are rare in
 * steady state and a shared call would tie one client's latency to another's); the last answer
 * wins the entry. The tokenizing worker is picked round-robin among the registered, unfenced
 * workers with a url; a failing one is skipped like a failed upstream.
 *
 * GET /v1/models: the union (by id) of the models the registered workers list on their own
 * GET /v1/models, fetched in parallel (2 s timeout each) and cached for 5 s; a request that
 * finds the cache stale waits for the refresh. Workers that do not answer keep their last list.
 *
 * Ownership: the front end owns its requests, upstream connections (a keep-alive pool per
 * worker, frontend_max_idle_connections idle ones kept), the cache and the model lists; the
 * loop, API server and router are borrowed and must outlive it (free it first).
 * Threads: the HTTP thread only. Cost on the hot path (ids given, no nvext): one OpenAI decode,
 * one routing decision, one copy of the body, one upstream request on a pooled connection;
 * each SSE event is scanned once (memchr) and copied once.
 */
#ifndef KVR_NET_FRONTEND_H
#define KVR_NET_FRONTEND_H

#include <stddef.h>

#include "kvrouter/config.h"
#include "kvrouter/router.h"
#include "fleet/fleet.h"
#include "http/http.h"

struct event_base;
typedef struct kvr_frontend kvr_frontend_t;

/* A service of host (after the router API) over fleet's scheduler, its upstream connections
 * on base (the host's loop). NULL with *status and err on failure. */
kvr_frontend_t *kvr_frontend_new(struct event_base *base, kvr_http_host_t *host,
                                 kvr_fleet_t *fleet, const kvr_router_config_t *cfg,
                                 int *status, char *err, size_t err_len);
/* Shutting down: answers what is in flight (503, or an SSE error event, [DONE] and the end of
 * the stream), cancels its upstream requests; later requests get 503. Run the loop a little
 * afterwards so the answers are written. Idempotent. */
void kvr_frontend_close(kvr_frontend_t *fe);
/* kvr_frontend_close, then frees everything and unregisters. Before the fleet and the host go. */
void kvr_frontend_free(kvr_frontend_t *fe);

#endif
