/*
 * fe_tokenize.h: a text or chat prompt's ids from a worker's POST /tokenize (fe_tokenize.c),
 * cached. One call to the next untried worker per fe_tokenize_start; it ends in ONE callback
 * (done) with the ids or with why not. The machine owns what follows: retries from its timer
 * (FE_TOK_AGAIN), answers and failures. Uses p->up for the call and p->prompt's tokenize
 * fields; writes route.last_fail when a worker failed.
 */
#ifndef KVR_FRONTEND_FE_TOKENIZE_H
#define KVR_FRONTEND_FE_TOKENIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "frontend/fe_req.h"

typedef enum fe_tok_status {
    FE_TOK_IDS,    /* ids[0..n): the prompt's (cached; valid until the next answer is read) */
    FE_TOK_AGAIN,  /* the worker failed (route.last_fail says how): the next one, later */
    FE_TOK_ANSWER, /* the worker's own verdict on the prompt: the client's answer as it is */
    FE_TOK_FAIL,   /* status and msg: p cannot be tokenized */
} fe_tok_status_t;

typedef struct fe_tok_result {
    fe_tok_status_t st;
    const uint32_t *ids; /* IDS */
    size_t n;
    int status;          /* ANSWER, FAIL */
    const char *ctype;   /* ANSWER: its Content-Type */
    const char *body;    /* ANSWER: its body; FAIL: the message */
    size_t len;
} fe_tok_result_t;

typedef void (*fe_tok_done_fn)(fe_req_t *p, const struct fe_tok_result *r);

/* The /tokenize body and the cache key of a text or chat prompt (body: the client's, which
 * the decoder accepted as rq); false out of memory. */
bool fe_tokenize_body(fe_req_t *p, const kvr_oai_request_t *rq, const char *body, size_t len);
/* Asks the next untried worker to tokenize p's prompt; done is called once (maybe before this
 * returns). p->retry_ev exists (a failure continues from it). */
void fe_tokenize_start(fe_req_t *p, fe_tok_done_fn done);

#endif
