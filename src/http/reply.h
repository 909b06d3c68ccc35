/*
 * reply.h: answering an evhttp request, the one way every server in the tree does it (the
 * router's API, the OpenAI front end, the indexer, the mocker). A reply context holds the
 * output buffer, the JSON writer the caller builds bodies in, the error shape of its API and
 * counts of what it answered.
 *   style    how an error body looks: the router API's {"error":{message,type,code}} or
 *            OpenAI's (with "param"), or a service's own; and the body of a 500 when the writer
 *            overflowed
 *   counts   replies by class (2xx, 3xx, 4xx, 5xx, other): read-only for the owner's metrics
 * Ownership: the context owns its buffer; the writer is the caller's (borrowed, outlives it).
 * Threads: the owner's event loop only. Cost: one copy of the body into the buffer.
 */
#ifndef KVR_HTTP_REPLY_H
#define KVR_HTTP_REPLY_H

#include <stddef.h>
#include <stdint.h>

#include "wire/json_writer.h"

struct evhttp_request;
struct evbuffer;

typedef struct kvr_reply_style {
    /* writes the error body for msg (type may be NULL: the style's default) */
    void (*error)(kvr_json_writer_t *w, const char *msg, const char *type, int code);
    const char *oom_body; /* the 500's body when the writer overflowed */
} kvr_reply_style_t;

extern const kvr_reply_style_t kvr_reply_api;    /* kvr_json_error's shape */
extern const kvr_reply_style_t kvr_reply_openai; /* kvr_oai_encode_error's shape */

enum { KVR_REPLY_2XX, KVR_REPLY_3XX, KVR_REPLY_4XX, KVR_REPLY_5XX, KVR_REPLY_OTHER };

typedef struct kvr_reply {
    /* public */
    kvr_json_writer_t *w; /* the bodies (borrowed) */
    /* read-only */
    uint64_t by_class[5];
    /* private */
    const kvr_reply_style_t *style;
    struct evbuffer *out;
} kvr_reply_t;

/* KVR_OK or KVR_ENOMEM. */
int kvr_reply_init(kvr_reply_t *r, kvr_json_writer_t *w, const kvr_reply_style_t *style);
void kvr_reply_deinit(kvr_reply_t *r);

/* data[0..len) as the body, with its Content-Type. */
void kvr_reply_body(kvr_reply_t *r, struct evhttp_request *req, int code, const char *ctype,
                    const char *data, size_t len);
/* The writer's JSON, or the style's 500 when it overflowed. */
void kvr_reply_writer(kvr_reply_t *r, struct evhttp_request *req, int code);
/* An error in the style's shape; type NULL: the style's default for code. */
void kvr_reply_error(kvr_reply_t *r, struct evhttp_request *req, int code, const char *type,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Counts a reply the owner sent itself (a relayed answer, from its own buffer). */
void kvr_reply_count(kvr_reply_t *r, int code);
/* Replies with status >= 400. */
uint64_t kvr_reply_errors(const kvr_reply_t *r);

/* The request's body, contiguous ("" when empty); valid until the request is answered. */
const char *kvr_http_body(struct evhttp_request *req, size_t *len);

#endif
