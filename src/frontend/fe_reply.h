/*
 * fe_reply.h: the front end's replies to clients, in one place (implemented in frontend.c
 * for now; the shared reply module of src/http replaces them). Each counts the reply's status
 * class and hands the body to libevent (fe->out is the scratch). Threads: the HTTP thread.
 */
#ifndef KVR_FRONTEND_FE_REPLY_H
#define KVR_FRONTEND_FE_REPLY_H

#include <stddef.h>

#include <event2/http.h>

#include "frontend/fe_ctx.h"

void fe_send_body(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *ctype,
                  const char *body, size_t len);
/* fe->w's JSON, or a 500 when it is too large. */
void fe_send_writer(kvr_frontend_t *fe, struct evhttp_request *req, int code);
/* An OpenAI error object. */
void fe_send_error(kvr_frontend_t *fe, struct evhttp_request *req, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
