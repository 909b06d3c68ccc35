/*
 * model.h: a model's prompt ids as the engine computes them, from the model's folder: its
 * tokenizer (tokenizer.h) and its chat template (tmpl.h). A completion's text is encoded
 * with the post-processor's specials (vLLM's add_special_tokens default for a prompt); a
 * chat's messages are rendered by the template, then encoded without them (the template
 * writes its own BOS; vLLM's default for a chat). A request's add_special_tokens overrides
 * either default.
 *
 * Ownership: a kvr_tokmodel is the caller's (kvr_tokmodel_free); it holds the tokenizer and
 * the template. Threads: a loaded model is read-only; kvr_tokmodel_ids takes a scratch (one
 * per thread), so any number of threads may use one model. Cost: load = the tokenizer's and
 * the template's; ids = render O(template steps) + encode O(n log n).
 */
#ifndef KVR_TOKENIZER_MODEL_H
#define KVR_TOKENIZER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tmpl.h"
#include "tokenizer/tokenizer.h"

typedef struct kvr_tokmodel kvr_tokmodel_t;

/* dir/tokenizer.json and dir/tokenizer_config.json (its chat_template, when it has one: a
 * model without one encodes text only). NULL on failure: *status and err (naming the file
 * and what it refuses). */
kvr_tokmodel_t *kvr_tokmodel_load(const char *dir, int *status, char *err, size_t errlen);
void kvr_tokmodel_free(kvr_tokmodel_t *m);

const kvr_tok_t *kvr_tokmodel_tok(const kvr_tokmodel_t *m);
bool kvr_tokmodel_has_chat(const kvr_tokmodel_t *m);
/* Bytes held: the tokenizer's (kvr_tok_bytes) and the template source's. */
size_t kvr_tokmodel_bytes(const kvr_tokmodel_t *m);

/* What to encode: text (a completion's prompt) when chat.messages is NULL, else a chat. */
typedef struct kvr_tokmodel_input {
    const char *text;
    size_t text_len;
    struct kvr_tmpl_input chat;
    /* continue_final_message (transformers'): the rendered chat is cut just after the last
     * occurrence of the final message's content final[0..final_len) (or of it stripped of
     * whitespace), so the prompt ends inside that message; with add_generation_prompt it is
     * refused, as transformers refuses it */
    bool continue_final;
    const char *final;
    size_t final_len;
    int add_special; /* -1: the default (text: yes, chat: no); 0 or 1: the request's */
} kvr_tokmodel_input_t;

/* Per thread: the encoder's scratch and the rendered text's buffer. */
typedef struct kvr_tokmodel_scratch kvr_tokmodel_scratch_t;
kvr_tokmodel_scratch_t *kvr_tokmodel_scratch_new(const kvr_tokmodel_t *m);
void kvr_tokmodel_scratch_free(kvr_tokmodel_scratch_t *s);
/* Its encoder scratch (the segment cache's bound and counters: tokenizer.h). */
kvr_tok_scratch_t *kvr_tokmodel_scratch_tok(kvr_tokmodel_scratch_t *s);

/* The prompt's ids into ids[0..cap), *n their number. rendered (may be NULL) receives the
 * chat's rendered text (valid until the scratch's next use; the text itself for a text
 * prompt). KVR_OK; KVR_ETOOBIG (more than cap ids, or a template limit: err says which);
 * KVR_ENOTFOUND (a chat and the model has no chat template); KVR_EINVAL / KVR_EPARSE (the
 * template refused the input: err is its message); KVR_ENOMEM. */
int kvr_tokmodel_ids(const kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s,
                     const kvr_tokmodel_input_t *in, uint32_t *ids, size_t cap, size_t *n,
                     const char **rendered, size_t *rendered_len, char *err, size_t errlen);

#endif /* KVR_TOKENIZER_MODEL_H */
