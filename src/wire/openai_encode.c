/*
 * openai_encode.c: the OpenAI side that writes (see openai.h): the canonical body of a decoded
 * request (what replay sends and the fuzz round trip checks), responses, stream chunks and
 * usage, /tokenize and /v1/models answers, errors with their type for an HTTP status, ids,
 * SSE framing; and the toy chat template the mocker renders messages with.
 * Threads: none; pure functions over the caller's writer. Cost: O(output).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/openai.h"

/* ------------------------------------------------------------------------------------------ */
/* Chat template. */

static size_t put(char *out, size_t cap, size_t at, const char *s, size_t n)
{
    if (at < cap)
        memcpy(out + at, s, cap - at < n ? cap - at : n);
    return at + n;
}

size_t kvr_oai_render_chat(const kvr_oai_message_t *m, size_t n, char *out, size_t cap)
{
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        at = put(out, cap, at, "<|", 2);
        at = put(out, cap, at, m[i].role, m[i].role_len);
        at = put(out, cap, at, "|>\n", 3);
        at = put(out, cap, at, m[i].content, m[i].content_len);
        at = put(out, cap, at, "\n", 1);
    }
    return put(out, cap, at, "<|assistant|>\n", 14);
}

/* ------------------------------------------------------------------------------------------ */
/* Encoders. */

static void key_u64(kvr_json_writer_t *w, const char *k, uint64_t v)
{
    kvr_json_key(w, k);
    kvr_json_u64(w, v);
}

static void key_str(kvr_json_writer_t *w, const char *k, const char *s)
{
    kvr_json_key(w, k);
    kvr_json_string(w, s);
}

static void key_str_n(kvr_json_writer_t *w, const char *k, const char *s, size_t n)
{
    kvr_json_key(w, k);
    kvr_json_string_n(w, s != NULL ? s : "", s != NULL ? n : 0);
}

static void key_bool(kvr_json_writer_t *w, const char *k, bool v)
{
    kvr_json_key(w, k);
    kvr_json_bool(w, v);
}

static void u32_array(kvr_json_writer_t *w, const char *k, const uint32_t *v, size_t n)
{
    kvr_json_key(w, k);
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++)
        kvr_json_u64(w, v[i]);
    kvr_json_end_array(w);
}

int kvr_oai_encode_request(kvr_json_writer_t *w, const kvr_oai_request_t *r)
{
    kvr_json_begin_object(w);
    if (r->model != NULL)
        key_str_n(w, "model", r->model, r->model_len);
    switch (r->given_kind) {
    case KVR_OAI_PROMPT_TEXT:
        key_str_n(w, "prompt", r->text, r->text_len);
        break;
    case KVR_OAI_PROMPT_TOKENS:
        u32_array(w, "prompt", r->prompt_ids, r->n_prompt_ids);
        break;
    case KVR_OAI_PROMPT_MESSAGES:
        kvr_json_key(w, "messages");
        kvr_json_begin_array(w);
        for (size_t i = 0; i < r->n_messages; i++) {
            kvr_json_begin_object(w);
            key_str_n(w, "role", r->messages[i].role, r->messages[i].role_len);
            key_str_n(w, "content", r->messages[i].content, r->messages[i].content_len);
            kvr_json_end_object(w);
        }
        kvr_json_end_array(w);
        break;
    default:
        break;
    }
    if (r->endpoint == KVR_OAI_TOKENIZE)
        return kvr_json_end_object(w);
    if (r->has_max_tokens)
        key_u64(w, "max_tokens", r->max_tokens);
    key_bool(w, "stream", r->stream);
    if (r->include_usage) {
        kvr_json_key(w, "stream_options");
        kvr_json_begin_object(w);
        key_bool(w, "include_usage", true);
        kvr_json_end_object(w);
    }
    if (r->has_nvext) {
        const kvr_oai_nvext_t *x = &r->nvext;
        kvr_json_key(w, "nvext");
        kvr_json_begin_object(w);
        if (x->has_token_data)
            u32_array(w, "token_data", x->token_data, x->n_token_data);
        if (x->has_backend_instance_id)
            key_u64(w, "backend_instance_id", x->backend_instance_id);
        if (x->has_prefill_worker_id)
            key_u64(w, "prefill_worker_id", x->prefill_worker_id);
        if (x->has_decode_worker_id)
            key_u64(w, "decode_worker_id", x->decode_worker_id);
        if (x->has_dp_rank)
            key_u64(w, "dp_rank", x->dp_rank);
        if (x->lora_name != NULL)
            key_str_n(w, "lora_name", x->lora_name, x->lora_name_len);
        if (x->has_priority) {
            kvr_json_key(w, "priority");
            kvr_json_i64(w, x->priority);
        }
        if (x->has_priority_jump) {
            kvr_json_key(w, "priority_jump");
            kvr_json_double(w, x->priority_jump);
        }
        if (x->session_id != NULL) {
            kvr_json_key(w, "session_control");
            kvr_json_begin_object(w);
            key_str_n(w, "session_id", x->session_id, x->session_id_len);
            key_str_n(w, "action", x->session_close ? "close" : "open", x->session_close ? 5 : 4);
            kvr_json_end_object(w);
        }
        if (x->has_expected_output_tokens)
            key_u64(w, "expected_output_tokens", x->expected_output_tokens);
        if (x->has_allowed_worker_ids) {
            kvr_json_key(w, "allowed_worker_ids");
            kvr_json_begin_array(w);
            for (size_t i = 0; i < x->n_allowed_worker_ids; i++)
                kvr_json_u64(w, x->allowed_worker_ids[i]);
            kvr_json_end_array(w);
        }
        if (x->want_worker_id || x->want_timing) {
            kvr_json_key(w, "extra_fields");
            kvr_json_begin_array(w);
            if (x->want_worker_id)
                kvr_json_string(w, "worker_id");
            if (x->want_timing)
                kvr_json_string(w, "timing");
            kvr_json_end_array(w);
        }
        kvr_json_end_object(w);
    }
    return kvr_json_end_object(w);
}

int kvr_oai_encode_usage(kvr_json_writer_t *w, const kvr_oai_usage_t *u)
{
    kvr_json_begin_object(w);
    key_u64(w, "prompt_tokens", u->prompt_tokens);
    key_u64(w, "completion_tokens", u->completion_tokens);
    key_u64(w, "total_tokens", u->prompt_tokens + u->completion_tokens);
    kvr_json_key(w, "prompt_tokens_details");
    kvr_json_begin_object(w);
    key_u64(w, "cached_tokens", u->cached_tokens);
    kvr_json_end_object(w);
    return kvr_json_end_object(w);
}

/* "id", "object", "created", "model" of every response and chunk. */
static void head(kvr_json_writer_t *w, const kvr_oai_response_t *r, bool chunk)
{
    kvr_json_begin_object(w);
    key_str(w, "id", r->id);
    key_str(w, "object", r->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                 : "text_completion");
    key_u64(w, "created", r->created);
    key_str(w, "model", r->model);
}

/* "usage" (when asked) and "nvext", then the end of the object. */
static int tail(kvr_json_writer_t *w, const kvr_oai_response_t *r, bool usage)
{
    if (usage) {
        kvr_json_key(w, "usage");
        kvr_oai_encode_usage(w, &r->usage);
    }
    if (r->has_worker) {
        const kvr_oai_worker_info_t *x = &r->worker;
        kvr_json_key(w, "nvext");
        kvr_json_begin_object(w);
        kvr_json_key(w, "worker_id");
        kvr_json_begin_object(w);
        key_u64(w, "prefill_worker_id", x->prefill_worker_id);
        key_u64(w, "prefill_dp_rank", x->prefill_dp_rank);
        key_u64(w, "decode_worker_id", x->decode_worker_id);
        key_u64(w, "decode_dp_rank", x->decode_dp_rank);
        kvr_json_end_object(w);
        kvr_json_end_object(w);
    }
    return kvr_json_end_object(w);
}

/* "logprobs":null,"finish_reason":..} closing a choice. */
static void choice_end(kvr_json_writer_t *w, const kvr_oai_response_t *r)
{
    kvr_json_key(w, "logprobs");
    kvr_json_null(w);
    key_str(w, "finish_reason", r->finish_reason);
    kvr_json_end_object(w);
}

int kvr_oai_encode_response(kvr_json_writer_t *w, const kvr_oai_response_t *r)
{
    head(w, r, false);
    kvr_json_key(w, "choices");
    kvr_json_begin_array(w);
    kvr_json_begin_object(w);
    key_u64(w, "index", 0);
    if (r->chat) {
        kvr_json_key(w, "message");
        kvr_json_begin_object(w);
        key_str(w, "role", "assistant");
        key_str_n(w, "content", r->text, r->text_len);
        kvr_json_end_object(w);
    } else {
        key_str_n(w, "text", r->text, r->text_len);
    }
    choice_end(w, r);
    kvr_json_end_array(w);
    return tail(w, r, true);
}

int kvr_oai_encode_chunk(kvr_json_writer_t *w, const kvr_oai_response_t *r)
{
    head(w, r, true);
    kvr_json_key(w, "choices");
    kvr_json_begin_array(w);
    kvr_json_begin_object(w);
    key_u64(w, "index", 0);
    if (r->chat) {
        kvr_json_key(w, "delta");
        kvr_json_begin_object(w);
        if (r->first_chunk)
            key_str(w, "role", "assistant");
        if (r->text != NULL)
            key_str_n(w, "content", r->text, r->text_len);
        kvr_json_end_object(w);
    } else {
        key_str_n(w, "text", r->text, r->text_len);
    }
    choice_end(w, r);
    kvr_json_end_array(w);
    return tail(w, r, r->has_usage);
}

int kvr_oai_encode_usage_chunk(kvr_json_writer_t *w, const kvr_oai_response_t *r)
{
    head(w, r, true);
    kvr_json_key(w, "choices");
    kvr_json_begin_array(w);
    kvr_json_end_array(w);
    return tail(w, r, true);
}

int kvr_oai_encode_tokenize(kvr_json_writer_t *w, const uint32_t *tokens, size_t n,
                            uint64_t max_model_len)
{
    kvr_json_begin_object(w);
    key_u64(w, "count", n);
    key_u64(w, "max_model_len", max_model_len);
    u32_array(w, "tokens", tokens, n);
    kvr_json_key(w, "token_strs");
    kvr_json_null(w);
    return kvr_json_end_object(w);
}

int kvr_oai_encode_models(kvr_json_writer_t *w, const kvr_oai_model_t *models, size_t n)
{
    kvr_json_begin_object(w);
    key_str(w, "object", "list");
    kvr_json_key(w, "data");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < n; i++) {
        const kvr_oai_model_t *m = &models[i];
        kvr_json_begin_object(w);
        key_str(w, "id", m->id);
        key_str(w, "object", "model");
        key_u64(w, "created", m->created);
        key_str(w, "owned_by", m->owned_by);
        if (m->max_model_len > 0)
            key_u64(w, "max_model_len", m->max_model_len);
        if (m->parent != NULL)
            key_str(w, "parent", m->parent);
        kvr_json_end_object(w);
    }
    kvr_json_end_array(w);
    return kvr_json_end_object(w);
}

const char *kvr_oai_error_type(int http_status)
{
    switch (http_status) {
    case 400:
        return "BadRequestError";
    case 404:
        return "NotFoundError";
    case 429:
        return "RateLimitError";
    case 500:
        return "InternalServerError";
    case 501:
        return "NotImplementedError";
    case 503:
        return "ServiceUnavailableError";
    default:
        return http_status >= 500 ? "InternalServerError" : "BadRequestError";
    }
}

int kvr_oai_http_status(int decode_status)
{
    switch (decode_status) {
    case KVR_EPARSE:
    case KVR_EINVAL:
        return 400;
    case KVR_ETOOBIG:
        return 413;
    default:
        return 500;
    }
}

int kvr_oai_encode_error(kvr_json_writer_t *w, const char *message, const char *type,
                         int http_status)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "error");
    kvr_json_begin_object(w);
    key_str(w, "message", message);
    key_str(w, "type", type != NULL ? type : kvr_oai_error_type(http_status));
    kvr_json_key(w, "param");
    kvr_json_null(w);
    kvr_json_key(w, "code");
    kvr_json_i64(w, http_status);
    kvr_json_end_object(w);
    return kvr_json_end_object(w);
}

int kvr_oai_encode_auth_error(kvr_json_writer_t *w, const char *message)
{
    kvr_json_begin_object(w);
    kvr_json_key(w, "error");
    kvr_json_begin_object(w);
    key_str(w, "message", message);
    key_str(w, "type", "invalid_request_error");
    kvr_json_key(w, "param");
    kvr_json_null(w);
    key_str(w, "code", "invalid_api_key");
    kvr_json_end_object(w);
    return kvr_json_end_object(w);
}

void kvr_oai_make_id(char out[KVR_OAI_ID_BYTES], bool chat, uint64_t n)
{
    snprintf(out, KVR_OAI_ID_BYTES, "%s-%016" PRIx64, chat ? "chatcmpl" : "cmpl", n);
}

size_t kvr_oai_sse_frame(const char *json, size_t len, char *out, size_t cap)
{
    size_t at = put(out, cap, 0, KVR_OAI_SSE_PREFIX, 6);
    at = put(out, cap, at, json, len);
    return put(out, cap, at, KVR_OAI_SSE_SUFFIX, 2);
}
