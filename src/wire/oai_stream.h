/*
 * oai_stream.h: the client side of OpenAI-compatible responses (wire layer: bytes in, facts
 * out, no I/O), for `kvrouter replay`: a streaming /v1/completions or /v1/chat/completions
 * body read as it arrives, the first model of /v1/models, and the message of an error body.
 *
 * Stream: Server-Sent Events (lines ending in \n, \r\n or \r; "data:" lines, with or without
 * one space after the colon, joined by \n into an event; a blank line dispatches it; comments
 * (":...") and other fields (event, id, retry) ignored). Every event is one JSON object (a
 * chunk) or "[DONE]", which must end the stream: data after it, or a body that ends without
 * it, is malformed. Read from each chunk (every other key ignored, at any depth):
 *   choices[i].text / choices[i].delta.content  a non-empty string: a token event (one per
 *                                             chunk, however many choices carry text)
 *   usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens
 *                                             (integers >= 0; the last chunk with usage wins)
 *   nvext.worker_id.prefill_worker_id / .decode_worker_id (integers >= 0), or
 *   nvext.worker_id as one integer           the worker that served the request
 *   error (object with message, or string)  an error event (the server failed mid-stream)
 * A token event is counted by data events, not by completion tokens, because that is what a
 * client observes (an engine may pack several tokens into one event); inter-token latency is
 * measured between these events.
 *
 * Errors: KVR_EPARSE (not SSE / not JSON / not an object / a usage or worker field of the
 * wrong type / data after [DONE]), KVR_ETOOBIG (an event above KVR_OAI_STREAM_MAX_EVENT
 * bytes), with kvr_oai_stream_error() saying which event and why ("event 3: not JSON: ...").
 * Errors are sticky: once malformed, later feeds do nothing and return the same status.
 *
 * Ownership: the stream owns its line buffer and a yajl arena, both reused across events and
 * across kvr_oai_stream_reset(), so a stream reused for many requests stops allocating once
 * it has seen the largest event. Threads: one stream per thread. Cost: one pass over the
 * bytes, one yajl parse per event.
 */
#ifndef KVR_WIRE_OAI_STREAM_H
#define KVR_WIRE_OAI_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVR_OAI_STREAM_MAX_EVENT ((size_t)16 << 20)

typedef struct kvr_oai_stream_info {
    uint64_t n_events;          /* data events dispatched, [DONE] included */
    uint64_t n_token_events;    /* chunks with text */
    bool done;                  /* [DONE] seen */
    bool has_usage;
    uint64_t prompt_tokens;
    uint64_t completion_tokens;
    bool has_cached;            /* usage.prompt_tokens_details.cached_tokens given */
    uint64_t cached_tokens;
    bool has_worker;            /* nvext.worker_id given */
    uint64_t worker_id;         /* the prefill worker (or the single id) */
    uint64_t decode_worker_id;  /* = worker_id when only one was given */
    bool error_event;           /* an error chunk arrived */
    char error[256];            /* its message ("" when it had none) */
} kvr_oai_stream_info_t;

typedef struct kvr_oai_stream kvr_oai_stream_t;

/* NULL on allocation failure. */
kvr_oai_stream_t *kvr_oai_stream_new(void);
void kvr_oai_stream_free(kvr_oai_stream_t *s);
/* Ready for a new body (keeps the buffers). */
void kvr_oai_stream_reset(kvr_oai_stream_t *s);

/* Feeds the next len bytes of the body. *new_token_events (may be NULL) = token events
 * completed by this call, so the caller can time them. KVR_OK, or the sticky error. */
int kvr_oai_stream_feed(kvr_oai_stream_t *s, const char *data, size_t len,
                        uint32_t *new_token_events);
/* The body ended: dispatches a last event not followed by a blank line, then KVR_OK when
 * [DONE] ended the stream, else KVR_EPARSE ("stream ended without [DONE]") or the sticky
 * error. */
int kvr_oai_stream_finish(kvr_oai_stream_t *s);

const kvr_oai_stream_info_t *kvr_oai_stream_info(const kvr_oai_stream_t *s);
/* "" while no error. */
const char *kvr_oai_stream_error(const kvr_oai_stream_t *s);

/* ------------------------------------------------------------------------------------------ */
/* Whole bodies. */

/* /v1/models: the id of data[0] into out (NUL-terminated). KVR_OK; KVR_EPARSE (not JSON, or
 * no data[0].id string) or KVR_ETOOBIG (id longer than cap - 1), with err saying which. */
int kvr_oai_models_first_id(const char *body, size_t len, char *out, size_t cap, char *err,
                            size_t err_len);
/* An error body's message ({"error":{"message":..}} or {"message":..} or {"error":"..."}):
 * true with it in out (cut to cap - 1 bytes); false when the body holds none. */
bool kvr_oai_error_message(const char *body, size_t len, char *out, size_t cap);

#endif /* KVR_WIRE_OAI_STREAM_H */
