/*
 * chat_conv.h: what vLLM hands a model's chat template for a chat request, built from the
 * request's body: the conversation (vLLM's parse_chat_messages with the "string" content
 * format, then _postprocess_messages), the tools (as its request model dumps them), the
 * chat_template_kwargs and the flags. The router's in-process tokenization renders the
 * template with these, so that it tokenizes the prompt the engine will build.
 *
 * The conversation, per message, in vLLM's key order:
 *   role; content: a string (null -> "", text parts joined by "\n");
 *   assistant: tool_calls when present and not null (an empty list dropped), each
 *     function.arguments read from its JSON string (not JSON, or not a string/object/array:
 *     {}); reasoning, and reasoning_content its copy, when not null;
 *   tool: tool_call_id when present; name and task when strings; developer: tools.
 * Tools: {"type", "function": {"name", "description", "parameters", "strict", extra...},
 * extra...}, the absent optional members as null (pydantic's model_dump).
 *
 * What it does not model is reported in out->unsupported (the caller then asks the engine):
 * a request chat_template, documents, image parts, a body that is not JSON to the scanner, a
 * tool_calls
 * that is not a list of objects with a function object, tools that are not objects with a
 * function object naming a string.
 *
 * Ownership: the spans point into w's buffer (messages, tools) and into the body (kwargs);
 * valid until w's next write. Threads: none. Cost: one scan of the body; tool calls and tools
 * are parsed (yajl tree), the rest copied.
 */
#ifndef KVR_WIRE_CHAT_CONV_H
#define KVR_WIRE_CHAT_CONV_H

#include <stdbool.h>
#include <stddef.h>

#include "wire/json_writer.h"
#include "wire/openai.h"

typedef struct kvr_chat_conv {
    const char *messages; /* JSON array */
    size_t messages_len;
    const char *tools; /* JSON array, or NULL: no tools (None) */
    size_t tools_len;
    const char *kwargs; /* the body's chat_template_kwargs object, or NULL */
    size_t kwargs_len;
    bool add_generation_prompt; /* the body's, default true */
    bool continue_final;        /* continue_final_message: the prompt ends inside the last
                                   message, whose content is final[0..final_len) */
    const char *final;
    size_t final_len;
    int add_special;            /* the body's add_special_tokens: -1 absent, 0 or 1 */
    const char *unsupported;    /* non-NULL: what is not modelled (a constant string) */
} kvr_chat_conv_t;

/* From a text or chat body that kvr_oai_decode accepted as rq (for a text prompt only the
 * flags are read). KVR_OK (check out->unsupported: also set when the body does not scan as
 * JSON, though yajl took it); KVR_ENOMEM. */
int kvr_chat_conv_build(kvr_json_writer_t *w, const char *body, size_t len,
                        const kvr_oai_request_t *rq, kvr_chat_conv_t *out);

#endif /* KVR_WIRE_CHAT_CONV_H */
