/*
 * reply.c: see reply.h.
 * Invariant: each call sends exactly one reply on req and counts it once in by_class.
 * Threads: the owner's loop. Cost: the body is copied into the buffer once; no allocation.
 */
#include "http/reply.h"

#include <stdarg.h>
#include <stdio.h>

#include <event2/buffer.h>
#include <event2/http.h>

#include "kvrouter.h"
#include "wire/openai.h"

static void api_error(kvr_json_writer_t *w, const char *msg, const char *type, int code)
{
    (void)kvr_json_error(w, msg, type ? type : "internal_error", code);
}

static void openai_error(kvr_json_writer_t *w, const char *msg, const char *type, int code)
{
    (void)kvr_oai_encode_error(w, msg, type, code);
}

const kvr_reply_style_t kvr_reply_api = {
    .error = api_error,
    .oom_body = "{\"error\":{\"message\":\"response too large\",\"type\":\"internal_error\","
                "\"code\":500}}",
};

const kvr_reply_style_t kvr_reply_openai = {
    .error = openai_error,
    .oom_body = "{\"error\":{\"message\":\"response too large\",\"type\":"
                "\"InternalServerError\",\"param\":null,\"code\":500}}",
};

int kvr_reply_init(kvr_reply_t *r, kvr_json_writer_t *w, const kvr_reply_style_t *style)
{
    *r = (kvr_reply_t){.w = w, .style = style, .out = evbuffer_new()};
    return r->out != NULL ? KVR_OK : KVR_ENOMEM;
}

void kvr_reply_deinit(kvr_reply_t *r)
{
    if (r->out != NULL)
        evbuffer_free(r->out);
    r->out = NULL;
}

void kvr_reply_body(kvr_reply_t *r, struct evhttp_request *req, int code, const char *ctype,
                    const char *data, size_t len)
{
    evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type", ctype);
    evbuffer_drain(r->out, evbuffer_get_length(r->out));
    evbuffer_add(r->out, data, len);
    kvr_reply_count(r, code);
    evhttp_send_reply(req, code, NULL, r->out);
}

void kvr_reply_count(kvr_reply_t *r, int code)
{
    r->by_class[code >= 200 && code < 600 ? code / 100 - 2 : KVR_REPLY_OTHER]++;
}

void kvr_reply_writer(kvr_reply_t *r, struct evhttp_request *req, int code)
{
    const char *data;
    size_t len;
    if (kvr_json_writer_finish(r->w, &data, &len) != KVR_OK) {
        const char *oom = r->style->oom_body;
        size_t n = 0;
        while (oom[n] != '\0')
            n++;
        kvr_reply_body(r, req, 500, "application/json", oom, n);
        return;
    }
    kvr_reply_body(r, req, code, "application/json", data, len);
}

void kvr_reply_error(kvr_reply_t *r, struct evhttp_request *req, int code, const char *type,
                     const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kvr_json_writer_reset(r->w);
    r->style->error(r->w, msg, type, code);
    kvr_reply_writer(r, req, code);
}

uint64_t kvr_reply_errors(const kvr_reply_t *r)
{
    return r->by_class[KVR_REPLY_4XX] + r->by_class[KVR_REPLY_5XX];
}

const char *kvr_http_body(struct evhttp_request *req, size_t *len)
{
    struct evbuffer *b = evhttp_request_get_input_buffer(req);
    *len = evbuffer_get_length(b);
    if (*len == 0)
        return "";
    const char *p = (const char *)evbuffer_pullup(b, -1);
    return p != NULL ? p : "";
}
