/*
 * fuzz_openai.c: libFuzzer target for the OpenAI request decoder and response encoders
 * (wire/openai.c), the chat template and the toy tokenizer (wire/toytok.c): the trust
 * boundary of `kvrouter mocker` and of the router's OpenAI front end.
 *
 * Input: the first byte picks the endpoint (value % 3: /v1/completions, /v1/chat/completions,
 * /tokenize); the rest is the body. Seeds in fuzz/corpus/openai start with '0'..'2'.
 *
 * Invariants checked: the fast-path decoder and a yajl-only decoder agree on the status, the
 * message and the decoded request (compared through the canonical request encoding); a
 * failure leaves a one-line message fit for a JSON string and a zeroed struct; a success
 * satisfies every documented bound (limits, kinds and pointers consistent, names clean,
 * texts valid UTF-8, allowed ids ascending) and round-trips through the request encoder.
 * Then the chat template's input built as vLLM builds it (wire/chat_conv.c): it succeeds or
 * names what it does not model, and its messages and tools are one valid JSON array each.
 * Then what a server does with it: render the chat template, run the toy tokenizer (ids in
 * range, count as promised), spell the ids back as pieces, and write every response shape,
 * SSE frames around them, and the error body on failure; all must finish as valid UTF-8.
 * Memory: decoders and writers reused across inputs (as the server does), small limits so
 * each input is cheap. Threads: libFuzzer's one.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/chat_conv.h"
#include "wire/json_scan.h"
#include "wire/json_writer.h"
#include "wire/openai.h"
#include "wire/toytok.h"

#define FUZZ_MAX_TOKENS 4096
#define FUZZ_MAX_TEXT 8192
#define FUZZ_MAX_MESSAGES 64
#define FUZZ_MAX_IDS 256
#define FUZZ_RENDER_CAP (FUZZ_MAX_TEXT + FUZZ_MAX_MESSAGES * (KVR_OAI_MAX_ROLE_BYTES + 6) + 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static int all_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != 0)
            return 0;
    return 1;
}

/* A decoded name: NULL with length 0, or NUL-terminated, clean, within bounds. */
static void check_name(const char *s, size_t len, size_t min, size_t max)
{
    if (s == NULL) {
        check(len == 0);
        return;
    }
    check(len >= min && len <= max && strlen(s) == len && kvr_json_utf8_valid(s, len));
    for (size_t i = 0; i < len; i++)
        check((unsigned char)s[i] >= 0x20 && s[i] != 0x7f);
}

/* A decoded text: valid UTF-8, NUL-terminated (it may hold NULs). */
static void check_text(const char *s, size_t len)
{
    check(s != NULL && s[len] == '\0' && kvr_json_utf8_valid(s, len));
}

static void check_ids(const uint32_t *t, size_t n)
{
    check(n <= FUZZ_MAX_TOKENS && (n == 0) == (t == NULL));
}

static void check_request(const kvr_oai_request_t *r, int ep)
{
    check((int)r->endpoint == ep);
    check_name(r->model, r->model_len, 1, KVR_OAI_MAX_NAME_BYTES);
    check_ids(r->tokens, r->n_tokens);
    check_ids(r->prompt_ids, r->n_prompt_ids);
    const kvr_oai_nvext_t *x = &r->nvext;
    check_ids(x->token_data, x->n_token_data);
    check(x->has_token_data || x->n_token_data == 0);
    switch (r->given_kind) {
    case 0:
        check(x->has_token_data && ep != KVR_OAI_TOKENIZE);
        break;
    case KVR_OAI_PROMPT_TOKENS:
        check(ep == KVR_OAI_COMPLETIONS);
        break;
    case KVR_OAI_PROMPT_TEXT:
        check(ep != KVR_OAI_CHAT);
        check_text(r->text, r->text_len);
        check(r->text_len <= FUZZ_MAX_TEXT);
        break;
    case KVR_OAI_PROMPT_MESSAGES:
        check(ep != KVR_OAI_COMPLETIONS);
        break;
    default:
        check(0);
    }
    if (r->given_kind != KVR_OAI_PROMPT_TEXT)
        check(r->text == NULL && r->text_len == 0);
    if (r->given_kind != KVR_OAI_PROMPT_TOKENS)
        check(r->prompt_ids == NULL && r->n_prompt_ids == 0);
    if (r->given_kind != KVR_OAI_PROMPT_MESSAGES)
        check(r->n_messages == 0);
    check(r->n_messages <= FUZZ_MAX_MESSAGES && (r->n_messages == 0) == (r->messages == NULL));
    size_t total = 0;
    for (size_t i = 0; i < r->n_messages; i++) {
        const kvr_oai_message_t *m = &r->messages[i];
        check_name(m->role, m->role_len, 1, KVR_OAI_MAX_ROLE_BYTES);
        check(m->role != NULL);
        check_text(m->content, m->content_len);
        total += m->content_len;
    }
    check(total <= FUZZ_MAX_TEXT);
    /* what runs */
    if (x->has_token_data) {
        check(r->prompt_kind == KVR_OAI_PROMPT_TOKENS && r->tokens == x->token_data &&
              r->n_tokens == x->n_token_data);
    } else {
        check((int)r->prompt_kind == r->given_kind);
        check(r->tokens == r->prompt_ids && r->n_tokens == r->n_prompt_ids);
    }
    if (ep != KVR_OAI_TOKENIZE) {
        if (r->prompt_kind == KVR_OAI_PROMPT_TOKENS)
            check(r->n_tokens > 0);
        else if (r->prompt_kind == KVR_OAI_PROMPT_TEXT)
            check(r->text_len > 0);
        else
            check(r->n_messages > 0);
    } else {
        check(!r->has_nvext && !r->has_max_tokens && !r->stream && !r->include_usage);
    }
    check(!r->has_max_tokens || r->max_tokens >= 1);
    check(r->has_nvext || all_zero(x, sizeof *x));
    check_name(x->lora_name, x->lora_name_len, 1, KVR_OAI_MAX_NAME_BYTES);
    check(x->has_priority || x->priority == 0);
    check(!x->has_priority_jump || isfinite(x->priority_jump));
    check((x->session_id == NULL) == (x->session_id_len == 0));
    check(x->session_id_len <= KVR_OAI_MAX_SESSION_BYTES);
    check(x->session_id != NULL || !x->session_close);
    check(x->n_allowed_worker_ids <= FUZZ_MAX_IDS);
    check((x->n_allowed_worker_ids == 0) == (x->allowed_worker_ids == NULL));
    check(x->has_allowed_worker_ids || x->n_allowed_worker_ids == 0);
    for (size_t i = 1; i < x->n_allowed_worker_ids; i++)
        check(x->allowed_worker_ids[i - 1] <= x->allowed_worker_ids[i]);
}

static void check_message(const char *m)
{
    check(m[0] != '\0' && strlen(m) < 256);
    for (const char *c = m; *c; c++)
        check(*c >= 0x20 && *c < 0x7f && *c != '"' && *c != '\\');
}

/* The canonical encoding into w; returns the text (valid until w is next used). */
static const char *canon(kvr_json_writer_t *w, const kvr_oai_request_t *r, size_t *len)
{
    kvr_json_writer_reset(w);
    kvr_oai_encode_request(w, r);
    const char *text;
    check(kvr_json_writer_finish(w, &text, len) == KVR_OK);
    return text;
}

static void finish_ok(kvr_json_writer_t *w)
{
    const char *out;
    size_t len;
    check(kvr_json_writer_finish(w, &out, &len) == KVR_OK);
    check(strlen(out) == len && kvr_json_utf8_valid(out, len));
    /* framed as an SSE event: prefix, the JSON, the blank line */
    static char frame[1 << 16];
    size_t n = kvr_oai_sse_frame(out, len, frame, sizeof frame);
    check(n == len + KVR_OAI_SSE_OVERHEAD);
    if (n <= sizeof frame)
        check(memcmp(frame, "data: ", 6) == 0 && memcmp(frame + 6, out, len) == 0 &&
              memcmp(frame + n - 2, "\n\n", 2) == 0);
    kvr_json_writer_reset(w);
}

/* What the mocker does with a request: prompt ids, a generated text, every response. */
static void serve(kvr_json_writer_t *w, const kvr_oai_request_t *r, uint32_t vocab)
{
    static char rendered[FUZZ_RENDER_CAP];
    static uint32_t ids[FUZZ_RENDER_CAP];
    const uint32_t *prompt = r->tokens;
    size_t n_prompt = r->n_tokens;
    if (r->prompt_kind != KVR_OAI_PROMPT_TOKENS) {
        const char *text = r->text;
        size_t len = r->text_len;
        if (r->prompt_kind == KVR_OAI_PROMPT_MESSAGES) {
            len = kvr_oai_render_chat(r->messages, r->n_messages, NULL, 0);
            check(len <= sizeof rendered);
            check(kvr_oai_render_chat(r->messages, r->n_messages, rendered, sizeof rendered) ==
                  len);
            check(len >= 14 && memcmp(rendered + len - 14, "<|assistant|>\n", 14) == 0);
            text = rendered;
        }
        size_t n;
        check(kvr_toytok_encode(text, len, vocab, ids, sizeof ids / sizeof ids[0], &n) ==
              KVR_OK);
        check(n == kvr_toytok_count(text, len) && n <= len);
        for (size_t i = 0; i < n; i++)
            check(ids[i] < vocab);
        prompt = ids;
        n_prompt = n;
    }

    if (r->endpoint == KVR_OAI_TOKENIZE) {
        kvr_oai_encode_tokenize(w, prompt, n_prompt, 8192);
        finish_ok(w);
        return;
    }
    /* "generate" from the prompt ids: their pieces, as text */
    char gen[16 * KVR_TOYTOK_MAX_PIECE];
    size_t n_gen = n_prompt < 16 ? n_prompt : 16;
    size_t gen_len = kvr_toytok_decode(prompt, n_gen, gen, sizeof gen);
    check(gen_len <= sizeof gen && gen_len >= n_gen);
    for (size_t i = 0; i < gen_len; i++)
        check(gen[i] >= 0x20 && gen[i] < 0x7f);

    char id[KVR_OAI_ID_BYTES];
    kvr_oai_make_id(id, r->endpoint == KVR_OAI_CHAT, n_prompt);
    char model[KVR_OAI_MAX_NAME_BYTES + 1] = "mock";
    if (r->model != NULL)
        memcpy(model, r->model, r->model_len + 1);
    kvr_oai_response_t resp = {
        .chat = r->endpoint == KVR_OAI_CHAT,
        .id = id,
        .created = 1700000000,
        .model = model,
        .text = gen,
        .text_len = gen_len,
        .finish_reason = r->has_max_tokens && r->max_tokens <= n_gen ? "length" : "stop",
        .usage = {n_prompt, n_gen, n_prompt / 2},
        .has_worker = r->nvext.want_worker_id,
        .worker = {r->nvext.backend_instance_id, r->nvext.dp_rank,
                   r->nvext.backend_instance_id, r->nvext.dp_rank},
    };
    if (!r->stream) {
        kvr_oai_encode_response(w, &resp);
        finish_ok(w);
        return;
    }
    for (size_t i = 0; i < n_gen; i++) {
        char piece[KVR_TOYTOK_MAX_PIECE + 1];
        resp.text_len = kvr_toytok_piece(prompt[i], piece);
        resp.text = piece;
        resp.first_chunk = i == 0;
        resp.finish_reason = i + 1 == n_gen ? "stop" : NULL;
        resp.has_usage = i % 3 == 1;
        kvr_oai_encode_chunk(w, &resp);
        finish_ok(w);
    }
    if (r->include_usage) {
        kvr_oai_encode_usage_chunk(w, &resp);
        finish_ok(w);
    }
}

/* A span that is exactly one JSON array (strict). */
static void check_array(const char *s, size_t n)
{
    check(s != NULL && n > 0 && s[0] == '[');
    check(kvr_json_skip_value(s, n, 0, KVR_JSON_STRICT) == n);
}

/* The chat template's input of an accepted body (the front end's and the mocker's). */
static void conv(kvr_json_writer_t *w, const char *body, size_t len, const kvr_oai_request_t *r)
{
    if (r->prompt_kind == KVR_OAI_PROMPT_TOKENS)
        return;
    kvr_chat_conv_t cv;
    int st = kvr_chat_conv_build(w, body, len, r, &cv);
    check(st == KVR_OK || st == KVR_ENOMEM);
    if (st != KVR_OK || cv.unsupported != NULL || r->prompt_kind != KVR_OAI_PROMPT_MESSAGES)
        return;
    check_array(cv.messages, cv.messages_len);
    if (cv.tools != NULL)
        check_array(cv.tools, cv.tools_len);
    check(cv.add_special >= -1 && cv.add_special <= 1);
    check(cv.final != NULL || r->n_messages == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvr_oai_decoder_t *fast, *slow, *again;
    static kvr_json_writer_t w1, w2, resp;
    static kvr_oai_request_t a, b, c;
    if (fast == NULL) {
        kvr_oai_options_t o = {FUZZ_MAX_TOKENS, FUZZ_MAX_TEXT, FUZZ_MAX_MESSAGES, FUZZ_MAX_IDS,
                               false};
        fast = kvr_oai_decoder_new(&o);
        again = kvr_oai_decoder_new(&o);
        o.no_fast_path = true;
        slow = kvr_oai_decoder_new(&o);
        check(fast != NULL && slow != NULL && again != NULL);
        kvr_json_writer_init(&w1);
        kvr_json_writer_init(&w2);
        kvr_json_writer_init(&resp);
    }
    if (size == 0)
        return 0;
    int ep = data[0] % 3;
    uint32_t vocab = data[0] < 128 ? KVR_TOYTOK_VOCAB : KVR_TOYTOK_MIN_VOCAB + data[0];
    const char *body = (const char *)data + 1;
    size_t len = size - 1;

    int s1 = kvr_oai_decode(fast, (kvr_oai_endpoint_t)ep, body, len, &a);
    int s2 = kvr_oai_decode(slow, (kvr_oai_endpoint_t)ep, body, len, &b);
    check(s1 == s2 && strcmp(kvr_oai_decoder_error(fast), kvr_oai_decoder_error(slow)) == 0);

    kvr_json_writer_reset(&resp);
    if (s1 != KVR_OK) {
        check(s1 == KVR_EPARSE || s1 == KVR_EINVAL || s1 == KVR_ETOOBIG);
        check_message(kvr_oai_decoder_error(fast));
        check(all_zero(&a, sizeof a) && all_zero(&b, sizeof b));
        int http = kvr_oai_http_status(s1);
        check(http == 400 || http == 413);
        kvr_oai_encode_error(&resp, kvr_oai_decoder_error(fast), NULL, http);
        finish_ok(&resp);
        return 0;
    }
    check(kvr_oai_decoder_error(fast)[0] == '\0');
    check_request(&a, ep);
    size_t n1, n2, n3;
    const char *t1 = canon(&w1, &a, &n1);
    const char *t2 = canon(&w2, &b, &n2);
    check(n1 == n2 && memcmp(t1, t2, n1) == 0);
    check(a.prompt_kind == b.prompt_kind && a.n_tokens == b.n_tokens);
    check(a.n_tokens == 0 || memcmp(a.tokens, b.tokens, a.n_tokens * sizeof *a.tokens) == 0);
    check(kvr_oai_decode(again, (kvr_oai_endpoint_t)ep, t1, n1, &c) == KVR_OK);
    const char *t3 = canon(&w2, &c, &n3);
    check(n1 == n3 && memcmp(t1, t3, n1) == 0);
    conv(&w1, body, len, &a);
    serve(&resp, &a, vocab);
    return 0;
}
