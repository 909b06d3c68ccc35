/*
 * openai.h: the OpenAI-compatible request decoder and response encoders (wire layer: bytes in,
 * structs out, no I/O), for `kvrouter mocker` and the router's OpenAI front end.
 *
 *   POST /v1/completions        kvr_oai_decode(d, KVR_OAI_COMPLETIONS, ...)  kvr_oai_request_t
 *   POST /v1/chat/completions   kvr_oai_decode(d, KVR_OAI_CHAT, ...)
 *   POST /tokenize (vLLM)       kvr_oai_decode(d, KVR_OAI_TOKENIZE, ...)
 *   responses, stream chunks, /tokenize, /v1/models, errors, SSE framing: kvr_oai_encode_*
 *   chat template: kvr_oai_render_chat (the toy tokenizer is wire/toytok.h)
 *
 * Fields read (every other key is ignored, at any depth; nesting capped at KVR_OAI_MAX_DEPTH):
 *   all:         model (string, optional: the server decides)
 *   completions: prompt = a string | an array of token ids | a one-element array of either
 *                (a batch of several prompts is rejected)
 *   chat:        messages = [{role: string, content: string | [{type: "text", text: string}]
 *                | null}], the parts concatenated with no separator; max_completion_tokens
 *   tokenize:    prompt (a string) or messages, exactly one
 *   completions and chat: max_tokens (max_completion_tokens wins when both are given), stream,
 *                stream_options.include_usage, n (only 1), nvext {token_data,
 *                backend_instance_id, prefill_worker_id, decode_worker_id, dp_rank,
 *                prefill_dp_rank, lora_name, priority, priority_jump,
 *                expected_output_tokens, allowed_worker_ids, extra_fields, agent_hints
 *                {priority, latency_sensitivity, osl}}; an agent_hints field and its nvext
 *                twin (priority/priority, latency_sensitivity/priority_jump,
 *                osl/expected_output_tokens) may both be given only with the same value.
 *                The reference's hints this router does not act on are refused by name
 *                (KVR_EINVAL, so a 400): nvext.routing_constraints, nvext.annotations,
 *                nvext.router_config_override (and a top-level router_config_override),
 *                nvext.agent_hints.strict_priority
 * Sampling parameters (temperature, top_p, seed, stop, logprobs, echo, ignore_eos, ...) are
 * accepted and ignored like any unknown key: the simulated engine does not sample.
 *
 * Rules (as wire/api_json.h): the body is one JSON object; a known key given twice is an
 * error; null means absent; integers are read exactly from their text ("1.0" is not an
 * integer); numbers must be finite and in range. Strings are valid UTF-8 (overlong forms,
 * surrogates and code points above U+10FFFF rejected), escapes decoded. model, lora_name and
 * role must also be free of control characters (so they are safe C strings); prompt text and
 * message contents may hold any character, U+0000 included, so use their lengths.
 * Ranges: tokens u32; max_tokens and max_completion_tokens [1, 2^32 - 1]; dp_rank and
 * expected_output_tokens and osl u32; backend_instance_id and allowed worker ids u64;
 * priority a 32-bit signed integer; priority_jump and latency_sensitivity finite numbers; model and
 * lora_name at most 1024 bytes ("" reads as absent); role 1..64 bytes. Completions and chat need a
 * non-empty prompt (text, ids or messages); /tokenize accepts "".
 *
 * Errors: KVR_EPARSE (not JSON, not an object, empty body), KVR_EINVAL (a field missing,
 * duplicated, of the wrong type or out of range), KVR_ETOOBIG (a limit), KVR_ENOMEM.
 * kvr_oai_decoder_error() then names the field, fit to send verbatim as the OpenAI error
 * message: "prompt: missing", "prompt: batched prompts are not supported",
 * "messages[2].content[0].type: unsupported content part type 'image_url' (only text)",
 * "nvext.token_data[7]: not an integer in [0, 4294967295]", "n: only 1 is supported".
 * On error the output struct is zeroed.
 *
 * Ownership: the decoder owns every buffer the request points into (ids, text, messages);
 * they stay valid until the next decode or kvr_oai_decoder_free(). The body is borrowed for
 * the call only. Memory: buffers grow to the largest body seen and are reused, yajl allocates
 * from an arena the decoder keeps, so steady-state decoding allocates nothing.
 * Threads: one decoder per thread. Cost: one pass over the body; token-id arrays (prompt and
 * nvext.token_data) are read by wire/token_scan.c while yajl parses the rest, with yajl alone
 * reading any array the scanner does not take and any body with an error (identical results
 * and messages). Measured on a 2-core AMD EPYC VM (shared, -O2): a 6 KB /v1/completions body
 * with a 1K-token prompt 4.5 us (yajl alone 25 us), the same ids in nvext.token_data 4.5 us,
 * a 5.7 KB chat body (two messages, ~1K words) 6 us.
 */
#ifndef KVR_WIRE_OPENAI_H
#define KVR_WIRE_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter.h"
#include "wire/json_writer.h"

#define KVR_OAI_MAX_TOKENS ((size_t)4 << 20)       /* prompt ids, and nvext.token_data */
#define KVR_OAI_MAX_TEXT_BYTES ((size_t)64 << 20)  /* prompt text; messages' contents in all */
#define KVR_OAI_MAX_MESSAGES ((size_t)4096)
#define KVR_OAI_MAX_ALLOWED_IDS ((size_t)4096)
#define KVR_OAI_MAX_NAME_BYTES 1024                /* model, lora_name */
#define KVR_OAI_MAX_SESSION_BYTES 128              /* nvext.session_control.session_id */
#define KVR_OAI_MAX_IMAGES 64                      /* image_url parts in one chat request */
#define KVR_OAI_MAX_ROLE_BYTES 64
#define KVR_OAI_MAX_DEPTH 64

typedef enum kvr_oai_endpoint {
    KVR_OAI_COMPLETIONS = 0,
    KVR_OAI_CHAT = 1,
    KVR_OAI_TOKENIZE = 2,
} kvr_oai_endpoint_t;

typedef enum kvr_oai_prompt_kind {
    KVR_OAI_PROMPT_TOKENS = 1,    /* ids: nvext.token_data, or prompt given as ids */
    KVR_OAI_PROMPT_TEXT = 2,      /* prompt given as a string */
    KVR_OAI_PROMPT_MESSAGES = 3,  /* chat messages */
} kvr_oai_prompt_kind_t;

typedef struct kvr_oai_options {
    size_t max_tokens;       /* <= KVR_OAI_MAX_TOKENS */
    size_t max_text_bytes;   /* <= KVR_OAI_MAX_TEXT_BYTES */
    size_t max_messages;     /* <= KVR_OAI_MAX_MESSAGES */
    size_t max_allowed_ids;  /* <= KVR_OAI_MAX_ALLOWED_IDS */
    bool no_fast_path;       /* yajl for the whole body (tests compare both paths) */
} kvr_oai_options_t;

typedef struct kvr_oai_decoder kvr_oai_decoder_t;

typedef struct kvr_oai_message {
    const char *role;      /* NUL-terminated, 1..64 bytes, no control characters */
    size_t role_len;
    const char *content;   /* never NULL ("" for null or absent content; content parts' */
    size_t content_len;    /* texts joined by "\n", as vLLM joins them); NUL-terminated, */
                           /* but may hold NULs itself */
} kvr_oai_message_t;

/* The request's nvext object (Dynamo's extensions). */
typedef struct kvr_oai_nvext {
    bool has_token_data;                 /* token_data given (then also the prompt's ids) */
    const uint32_t *token_data;          /* NULL when n_token_data is 0 */
    size_t n_token_data;
    bool has_backend_instance_id;        /* route to this worker, skip selection */
    uint64_t backend_instance_id;
    bool has_prefill_worker_id; /* disaggregated: the prefill leg's worker */
    uint64_t prefill_worker_id;
    bool has_decode_worker_id; /* disaggregated: the decode leg's worker */
    uint64_t decode_worker_id;
    bool has_dp_rank;
    uint32_t dp_rank;
    bool has_prefill_dp_rank; /* disaggregated: the prefill leg's rank */
    uint32_t prefill_dp_rank;
    const char *lora_name;               /* NULL when absent, null or "" */
    size_t lora_name_len;
    bool has_priority;      /* engine priority (vLLM's and SGLang's request */
    int32_t priority;       /* "priority"), forwarded to the worker; */
                            /* nvext.priority or nvext.agent_hints.priority */
    bool has_priority_jump; /* queue head start in seconds: nvext.priority_jump */
    double priority_jump;   /* or nvext.agent_hints.latency_sensitivity */
    bool has_expected_output_tokens;
    uint32_t expected_output_tokens;
    bool has_allowed_worker_ids;         /* given: [] allows nobody */
    const uint64_t *allowed_worker_ids;  /* ascending, repeats kept (as the selector wants) */
    size_t n_allowed_worker_ids;
    const char *session_id; /* session_control.session_id; NULL = none */
    size_t session_id_len;
    bool session_close;                  /* session_control.action "close" (else "open") */
    bool want_worker_id;                 /* extra_fields holds "worker_id" */
    bool want_timing;                    /* extra_fields holds "timing" */
} kvr_oai_nvext_t;

typedef struct kvr_oai_request {
    kvr_oai_endpoint_t endpoint;
    const char *model;                   /* NULL when absent, null or "" */
    size_t model_len;
    /* What to run: TOKENS when nvext.token_data was given (it wins) or the prompt was ids;
     * else TEXT (tokenize text) or MESSAGES (render them, then tokenize). */
    kvr_oai_prompt_kind_t prompt_kind;
    const uint32_t *tokens;              /* TOKENS: the ids to run (NULL when n_tokens is 0) */
    size_t n_tokens;
    /* The prompt as the body gave it, also when token_data won. given_kind is 0 when the body
     * gave nvext.token_data alone; exactly the matching one of the three below is set. */
    int given_kind;                      /* 0 or a kvr_oai_prompt_kind_t */
    const uint32_t *prompt_ids;          /* TOKENS: the prompt's ids (NULL when none) */
    size_t n_prompt_ids;
    const char *text;                    /* TEXT: the prompt string (NUL-terminated) */
    size_t text_len;
    const kvr_oai_message_t *messages;   /* MESSAGES (NULL when n_messages is 0) */
    size_t n_messages;
    const uint64_t *images; /* chat image_url parts: each url's XXH3-64 (seed 0,
                               the reference's mm identifier mapping), in order;
                               NULL when n_images is 0 */
    size_t n_images;
    bool has_max_tokens;                 /* max_completion_tokens, else max_tokens */
    uint32_t max_tokens;
    bool stream;
    bool include_usage;                  /* stream_options.include_usage */
    bool has_nvext;
    kvr_oai_nvext_t nvext;
} kvr_oai_request_t;

/* Counters since the decoder was made (for /metrics). */
typedef struct kvr_oai_stats {
    uint64_t bodies;      /* decode calls */
    uint64_t errors;      /* of which failed */
    uint64_t fast_path;   /* bodies with at least one token array read by the scanner */
} kvr_oai_stats_t;

const char *kvr_oai_endpoint_name(kvr_oai_endpoint_t e);  /* "completions", "chat", ... */

/* opts NULL = defaults (the maxima, fast path on). NULL on allocation failure or options
 * above the maxima. */
kvr_oai_decoder_t *kvr_oai_decoder_new(const kvr_oai_options_t *opts);
void kvr_oai_decoder_free(kvr_oai_decoder_t *d);
/* The last error ("" after success); valid until the next decode. */
const char *kvr_oai_decoder_error(const kvr_oai_decoder_t *d);
void kvr_oai_decoder_stats(const kvr_oai_decoder_t *d, kvr_oai_stats_t *out);

int kvr_oai_decode(kvr_oai_decoder_t *d, kvr_oai_endpoint_t endpoint, const char *body,
                   size_t len, kvr_oai_request_t *out);

/* The canonical body of a decoded request (the prompt as given, "max_tokens",
 * "stream", "stream_options" when include_usage, the nvext fields given), so that decoding
 * it gives the same request: for clients (kvrouter replay), forwarding, tests, the fuzz
 * round trip. Returns the writer's status. */
int kvr_oai_encode_request(kvr_json_writer_t *w, const kvr_oai_request_t *r);

/* ------------------------------------------------------------------------------------------ */
/* Chat template: for each message "<|" role "|>\n" content "\n", then "<|assistant|>\n".
 * Writes the first min(total, cap) bytes to out (no NUL) and returns the total length; call
 * with cap 0 for the length. */
size_t kvr_oai_render_chat(const kvr_oai_message_t *m, size_t n, char *out, size_t cap);

/* ------------------------------------------------------------------------------------------ */
/* Encoders: one JSON value each, on a writer (no framing); they return the writer's status. */

typedef struct kvr_oai_usage {
    uint64_t prompt_tokens;
    uint64_t completion_tokens;          /* total_tokens is the sum */
    uint64_t cached_tokens;              /* prompt_tokens_details.cached_tokens */
} kvr_oai_usage_t;

/* nvext.worker_id in responses (when the request asked with extra_fields: ["worker_id"]). */
typedef struct kvr_oai_worker_info {
    uint64_t prefill_worker_id;
    uint32_t prefill_dp_rank;
    uint64_t decode_worker_id;
    uint32_t decode_dp_rank;
} kvr_oai_worker_info_t;

typedef struct kvr_oai_response {
    bool chat;                           /* chat.completion[.chunk]; else text_completion */
    const char *id;                      /* "cmpl-..." / "chatcmpl-..." (kvr_oai_make_id) */
    uint64_t created;                    /* unix seconds */
    const char *model;
    const char *text;                    /* the choice's text / content / delta content; */
    size_t text_len;                     /*   NULL: "" (chunks: no content in the delta) */
    const char *finish_reason;           /* "stop", "length", ...; NULL writes null */
    bool first_chunk;                    /* chat chunk: the delta carries role "assistant" */
    bool has_usage;                      /* chunks only: usage in this chunk too */
    kvr_oai_usage_t usage;               /* non-streaming responses always carry it */
    bool has_worker;                     /* nvext.worker_id */
    kvr_oai_worker_info_t worker;
} kvr_oai_response_t;

/* Non-streaming: {"id","object":"text_completion","created","model","choices":[{"index":0,
 * "text","logprobs":null,"finish_reason"}],"usage":{..}[,"nvext":{"worker_id":{..}}]}, or
 * for chat "object":"chat.completion" and choices[{"index":0,"message":{"role":"assistant",
 * "content"},"logprobs":null,"finish_reason"}]. */
int kvr_oai_encode_response(kvr_json_writer_t *w, const kvr_oai_response_t *r);
/* One streaming chunk: text_completion with choices[{"index":0,"text","logprobs":null,
 * "finish_reason"}], or chat.completion.chunk with choices[{"index":0,"delta":{["role":
 * "assistant",]["content"]},"logprobs":null,"finish_reason"}]; then usage when has_usage and
 * nvext when has_worker. */
int kvr_oai_encode_chunk(kvr_json_writer_t *w, const kvr_oai_response_t *r);
/* The final usage-only chunk: {"id","object","created","model","choices":[],"usage":{..}
 * [,"nvext":..]}. */
int kvr_oai_encode_usage_chunk(kvr_json_writer_t *w, const kvr_oai_response_t *r);
/* {"prompt_tokens","completion_tokens","total_tokens","prompt_tokens_details":
 * {"cached_tokens"}} as one value (after kvr_json_key, or alone). */
int kvr_oai_encode_usage(kvr_json_writer_t *w, const kvr_oai_usage_t *u);

/* /tokenize: {"count":n,"max_model_len":m,"tokens":[...],"token_strs":null} */
int kvr_oai_encode_tokenize(kvr_json_writer_t *w, const uint32_t *tokens, size_t n,
                            uint64_t max_model_len);

typedef struct kvr_oai_model {
    const char *id;
    uint64_t created;                    /* unix seconds */
    const char *owned_by;
    uint64_t max_model_len;              /* 0: omitted */
    const char *parent;                  /* a LoRA adapter's base model (vLLM); NULL: omitted */
} kvr_oai_model_t;

/* /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by"
 * [,"max_model_len"]}]} */
int kvr_oai_encode_models(kvr_json_writer_t *w, const kvr_oai_model_t *models, size_t n);

/* vLLM's error body: {"error":{"message","type","param":null,"code":http_status}}. type NULL
 * means kvr_oai_error_type(http_status). (kvr_json_error writes the same without "param".) */
int kvr_oai_encode_error(kvr_json_writer_t *w, const char *message, const char *type,
                         int http_status);
/* OpenAI's 401 body: {"error":{"message","type":"invalid_request_error","param":null,
 * "code":"invalid_api_key"}} (the router's and the indexer's token refusals). */
int kvr_oai_encode_auth_error(kvr_json_writer_t *w, const char *message);
/* vLLM's type names: 400 BadRequestError, 404 NotFoundError, 429 RateLimitError (vLLM has
 * none; OpenAI's name), 500 InternalServerError, 501 NotImplementedError, 503
 * ServiceUnavailableError, other 4xx BadRequestError, other 5xx InternalServerError. */
const char *kvr_oai_error_type(int http_status);
/* The HTTP status for a decode status: 400 (KVR_EPARSE, KVR_EINVAL), 413 (KVR_ETOOBIG),
 * 500 (anything else). */
int kvr_oai_http_status(int decode_status);

/* "cmpl-<16 hex digits>" or "chatcmpl-<16 hex digits>" of n, NUL-terminated. */
#define KVR_OAI_ID_BYTES 32
void kvr_oai_make_id(char out[KVR_OAI_ID_BYTES], bool chat, uint64_t n);

/* ------------------------------------------------------------------------------------------ */
/* SSE framing: each event is "data: " + one-line JSON + "\n\n"; the stream ends with DONE. A
 * mid-stream error is an event holding kvr_oai_encode_error's body, then DONE. */

#define KVR_OAI_SSE_PREFIX "data: "
#define KVR_OAI_SSE_SUFFIX "\n\n"
#define KVR_OAI_SSE_DONE "data: [DONE]\n\n"
#define KVR_OAI_SSE_OVERHEAD 8  /* prefix + suffix bytes */

/* Writes "data: " json "\n\n" into out: the first min(total, cap) bytes (no NUL); returns the
 * total, len + KVR_OAI_SSE_OVERHEAD. */
size_t kvr_oai_sse_frame(const char *json, size_t len, char *out, size_t cap);

#endif /* KVR_WIRE_OPENAI_H */
