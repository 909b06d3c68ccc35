/*
 * fuzz_jinja.c: libFuzzer target for the chat-template interpreter (tokenizer/tmpl.h): chat
 * templates come from model repositories, not trusted.
 *
 * Input: any bytes, loaded as a template and rendered with a fixed small context (messages with
 * tool calls, tools, kwargs) under small bounds (64 KiB output, 8 MiB memory, 200k steps,
 * depth 64), so no input can hang or exhaust memory. Invariants checked: load and render return
 * only the documented statuses, with an error message when they fail; a successful render's text
 * is NUL-terminated at its length; rendering twice gives the same bytes (no state kept between
 * renders). Memory: everything freed per input (LeakSanitizer). Threads: libFuzzer's one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter/status.h"
#include "tokenizer/tmpl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond)
{
    if (!cond)
        abort();
}

static const char MSGS[] =
    "[{\"role\":\"system\",\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"hi {{x}}\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":{\"a\":[1,2.5,true,null]}}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"},{\"role\":\"user\",\"content\":\"ünï\"}]";
static const char TOOLS[] = "[{\"type\":\"function\",\"function\":{\"name\":\"f\","
                            "\"parameters\":{\"type\":\"object\"}}}]";
static const char KW[] = "{\"enable_thinking\":false,\"n\":3,\"s\":\"str\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvr_tmpl_limits lim = {
        .max_output = 1 << 16, .max_memory = 8 << 20, .max_steps = 200000, .max_depth = 64};
    struct kvr_tmpl *t = NULL;
    char err[512] = "";
    int rc = kvr_tmpl_load((const char *)data, size, &lim, &t, err, sizeof err);
    check(rc == KVR_OK || rc == KVR_EPARSE || rc == KVR_ETOOBIG);
    if (rc) {
        check(err[0] != 0 && t == NULL);
        return 0;
    }
    struct kvr_tmpl_input in = {.messages = MSGS,
                                .messages_len = sizeof MSGS - 1,
                                .tools = (size & 1) ? TOOLS : NULL,
                                .tools_len = sizeof TOOLS - 1,
                                .kwargs = KW,
                                .kwargs_len = sizeof KW - 1,
                                .add_generation_prompt = size & 2,
                                .now_s = 1753000000};
    char *out[2] = {NULL, NULL};
    size_t len[2] = {0, 0};
    int r[2];
    for (int k = 0; k < 2; k++) {
        err[0] = 0;
        r[k] = kvr_tmpl_render(t, &in, &out[k], &len[k], err, sizeof err);
        check(r[k] == KVR_OK || r[k] == KVR_EINVAL || r[k] == KVR_ERANGE || r[k] == KVR_ETOOBIG);
        if (r[k] == KVR_OK) {
            check(out[k] != NULL && out[k][len[k]] == 0 && len[k] <= lim.max_output);
        } else {
            check(err[0] != 0 && out[k] == NULL);
        }
    }
    check(r[0] == r[1]);
    if (r[0] == KVR_OK)
        check(len[0] == len[1] && memcmp(out[0], out[1], len[0]) == 0);
    free(out[0]);
    free(out[1]);
    kvr_tmpl_free(t);
    return 0;
}
