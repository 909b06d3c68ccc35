/*
 * tmpl.h: chat templates rendered as Hugging Face's apply_chat_template renders them (Jinja2
 * 3.1, ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols; transformers'
 * tojson, raise_exception and strftime_now), by an interpreter of the Jinja subset chat
 * templates use (docs/tokenize.md, "Chat templates"). A template outside the subset is
 * refused when loaded, naming the construct and its line; it never renders differently.
 *
 * Ownership: a kvr_tmpl is the caller's (kvr_tmpl_free); rendered text is malloc'd for the
 * caller. Threads: a loaded kvr_tmpl is read-only, so any number of threads may render with
 * it at once. Cost: load O(template); render O(steps of the template), every render bounded
 * (output, memory, steps, depth) by kvr_tmpl_limits.
 */
#ifndef KVR_TOKENIZER_TMPL_H
#define KVR_TOKENIZER_TMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct kvr_tmpl;

struct kvr_tmpl_limits {
    size_t max_output;  /* bytes of rendered text; 0: 16 MiB */
    size_t max_memory;  /* bytes of values during a render; 0: 256 MiB */
    uint64_t max_steps; /* evaluation steps, loops included; 0: 10 million */
    int max_depth;      /* nesting of the template and of evaluation; 0: 128 */
};

/* From tokenizer_config.json: `chat_template` (a string, or a list of {name, template}: the
 * "default" one, and "tool_use" for requests with tools when present) and the special tokens
 * (bos_token, eos_token, unk_token, pad_token, ...: strings or {content}). KVR_OK;
 * KVR_ENOTFOUND (no chat_template), KVR_EPARSE (JSON, or the template: err says
 * "template line N: ..."), KVR_ETOOBIG. limits may be NULL (the defaults). */
int kvr_tmpl_load_config(const char *json, size_t len, const struct kvr_tmpl_limits *limits,
                         struct kvr_tmpl **out, char *err, size_t errlen);
/* A bare template source (no special tokens defined). */
int kvr_tmpl_load(const char *src, size_t len, const struct kvr_tmpl_limits *limits,
                  struct kvr_tmpl **out, char *err, size_t errlen);
void kvr_tmpl_free(struct kvr_tmpl *t);

struct kvr_tmpl_input {
    const char *messages; /* JSON array of messages (required) */
    size_t messages_len;
    const char *tools; /* JSON array of tool definitions, or NULL: tools=None */
    size_t tools_len;
    const char *kwargs; /* JSON object of extra variables (chat_template_kwargs), or NULL */
    size_t kwargs_len;
    bool add_generation_prompt;
    int64_t now_s; /* strftime_now's clock, Unix seconds shown in local time; 0: now */
};

/* Renders; *out (NUL-terminated, *out_len bytes) is malloc'd. KVR_OK; KVR_EPARSE (bad JSON
 * input), KVR_EINVAL (the template raised: err is "raise_exception: <message>"; or a type
 * error Jinja would raise too), KVR_ERANGE, KVR_ETOOBIG (a limit), KVR_ENOMEM. */
int kvr_tmpl_render(const struct kvr_tmpl *t, const struct kvr_tmpl_input *in, char **out,
                    size_t *out_len, char *err, size_t errlen);

#endif
