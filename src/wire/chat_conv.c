/*
 * chat_conv.c: the chat template's input built from a chat body as vLLM builds it
 * (chat_conv.h has the rules).
 * Invariants: the body was accepted by kvr_oai_decode, so it is JSON to yajl and its messages
 * are rq->messages in order: the scan is lenient (structure only) and the decoded role and
 * content are taken from rq. yajl also takes \v and \f as whitespace, which JSON (and the
 * engine's parser) does not: such a body does not scan and is reported unsupported. Output goes to w as one object {"messages": [...], "tools":
 * [...]} whose two members are then located for the spans.
 * Ownership: see chat_conv.h; parsed tool values are freed before returning.
 * Threads: none. Cost: O(body); yajl tree parses only of tool_calls, their arguments and
 * tools (small next to the messages).
 */
#include "wire/chat_conv.h"

#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_tree.h>

#include "kvrouter/status.h"
#include "wire/json_scan.h"

static const char UNSCANNED[] = "a body the JSON scanner does not read (whitespace JSON "
                                "does not allow)";

typedef struct conv {
    kvr_json_writer_t *w;
    const char *b;
    size_t n;
    kvr_chat_conv_t *out;
} conv_t;

/* ---------------------------------------------------------------------------------------- */
/* Parsed values (yajl trees) written back. */

static int emit(kvr_json_writer_t *w, yajl_val v);

static int emit_object(kvr_json_writer_t *w, yajl_val v)
{
    kvr_json_begin_object(w);
    for (size_t i = 0; i < v->u.object.len; i++) {
        kvr_json_key(w, v->u.object.keys[i]);
        emit(w, v->u.object.values[i]);
    }
    return kvr_json_end_object(w);
}

static int emit(kvr_json_writer_t *w, yajl_val v)
{
    if (v == NULL)
        return kvr_json_null(w);
    switch (v->type) {
    case yajl_t_string:
        return kvr_json_string(w, v->u.string);
    case yajl_t_number:
        return kvr_json_raw(w, v->u.number.r, strlen(v->u.number.r));
    case yajl_t_object:
        return emit_object(w, v);
    case yajl_t_array:
        kvr_json_begin_array(w);
        for (size_t i = 0; i < v->u.array.len; i++)
            emit(w, v->u.array.values[i]);
        return kvr_json_end_array(w);
    case yajl_t_true:
        return kvr_json_bool(w, true);
    case yajl_t_false:
        return kvr_json_bool(w, false);
    default:
        return kvr_json_null(w);
    }
}

/* A yajl tree of b[0..n) (a copy is NUL-terminated for yajl); NULL when it does not parse. */
static yajl_val parse(const char *b, size_t n, bool *nomem)
{
    char *z = malloc(n + 1);
    if (z == NULL) {
        *nomem = true;
        return NULL;
    }
    memcpy(z, b, n);
    z[n] = '\0';
    yajl_val v = yajl_tree_parse(z, NULL, 0);
    free(z);
    return v;
}

static yajl_val member(yajl_val obj, const char *key)
{
    for (size_t i = 0; YAJL_IS_OBJECT(obj) && i < obj->u.object.len; i++)
        if (strcmp(obj->u.object.keys[i], key) == 0)
            return obj->u.object.values[i];
    return NULL;
}

/* function.arguments as _postprocess_messages leaves it: a JSON string read (json.loads), an
 * object or array kept, anything else (and a string that does not read) {}. */
static int emit_arguments(kvr_json_writer_t *w, yajl_val a, bool *nomem)
{
    if (YAJL_IS_OBJECT(a) || YAJL_IS_ARRAY(a))
        return emit(w, a);
    yajl_val parsed = YAJL_IS_STRING(a) ? parse(a->u.string, strlen(a->u.string), nomem) : NULL;
    int rc;
    if (parsed != NULL) {
        rc = emit(w, parsed);
        yajl_tree_free(parsed);
    } else {
        kvr_json_begin_object(w);
        rc = kvr_json_end_object(w);
    }
    return rc;
}

/* One tool call, its function's arguments read. false: not an object with a function object. */
static bool emit_tool_call(kvr_json_writer_t *w, yajl_val call, bool *nomem)
{
    yajl_val fn = member(call, "function");
    if (!YAJL_IS_OBJECT(call) || !YAJL_IS_OBJECT(fn))
        return false;
    kvr_json_begin_object(w);
    for (size_t i = 0; i < call->u.object.len; i++) {
        const char *k = call->u.object.keys[i];
        kvr_json_key(w, k);
        if (call->u.object.values[i] != fn) {
            emit(w, call->u.object.values[i]);
            continue;
        }
        kvr_json_begin_object(w);
        bool had_args = false;
        for (size_t j = 0; j < fn->u.object.len; j++) {
            kvr_json_key(w, fn->u.object.keys[j]);
            if (strcmp(fn->u.object.keys[j], "arguments") == 0) {
                had_args = true;
                emit_arguments(w, fn->u.object.values[j], nomem);
            } else {
                emit(w, fn->u.object.values[j]);
            }
        }
        if (!had_args) { /* None: {} */
            kvr_json_key(w, "arguments");
            emit_arguments(w, NULL, nomem);
        }
        kvr_json_end_object(w);
    }
    kvr_json_end_object(w);
    return true;
}

/* A message's tool_calls value (raw): written as vLLM keeps it; an empty list is dropped.
 * false: not modelled. */
static bool tool_calls(conv_t *c, const kvr_json_member_t *m, bool *nomem)
{
    yajl_val v = parse(c->b + m->val, m->val_end - m->val, nomem);
    if (v == NULL)
        return false;
    bool ok = YAJL_IS_ARRAY(v);
    if (ok && v->u.array.len > 0) {
        kvr_json_key(c->w, "tool_calls");
        kvr_json_begin_array(c->w);
        for (size_t i = 0; ok && i < v->u.array.len; i++)
            ok = emit_tool_call(c->w, v->u.array.values[i], nomem);
        kvr_json_end_array(c->w);
    }
    yajl_tree_free(v);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* Messages */

static bool role_is(const kvr_oai_message_t *msg, const char *role)
{
    return msg->role_len == strlen(role) && memcmp(msg->role, role, msg->role_len) == 0;
}

/* The members of one message object (at b[i]) that vLLM keeps beside role and content. */
typedef struct msg_extra {
    kvr_json_member_t tool_calls, tool_call_id, name, reasoning, task, tools;
    bool has_tool_calls, has_tool_call_id, has_name, has_reasoning, has_task, has_tools;
} msg_extra_t;

static bool scan_message(conv_t *c, size_t i, msg_extra_t *x)
{
    memset(x, 0, sizeof *x);
    if (c->b[i] != '{')
        return false;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int r;
    kvr_json_object_begin(&it, c->b, c->n, i, KVR_JSON_LENIENT);
    while ((r = kvr_json_object_next(&it, &m)) == 1) {
#define TAKE(field)                                                                          \
    if (kvr_json_key_is(c->b, &m, #field)) {                                                 \
        x->field = m;                                                                        \
        x->has_##field = true;                                                               \
        continue;                                                                            \
    }
        TAKE(tool_calls)
        TAKE(tool_call_id)
        TAKE(name)
        TAKE(reasoning)
        TAKE(task)
        TAKE(tools)
#undef TAKE
    }
    return r == 0;
}

static void raw(conv_t *c, const char *key, const kvr_json_member_t *m)
{
    kvr_json_key(c->w, key);
    kvr_json_raw(c->w, c->b + m->val, m->val_end - m->val);
}

/* One message in vLLM's form. false: not modelled (out->unsupported says what). */
static bool write_message(conv_t *c, const kvr_oai_message_t *msg, const msg_extra_t *x,
                          bool *nomem)
{
    kvr_json_writer_t *w = c->w;
    kvr_json_begin_object(w);
    kvr_json_key(w, "role");
    kvr_json_string_n(w, msg->role, msg->role_len);
    kvr_json_key(w, "content");
    kvr_json_string_n(w, msg->content, msg->content_len);
    if (role_is(msg, "assistant")) {
        if (x->has_tool_calls && !kvr_json_member_is_null(c->b, &x->tool_calls) &&
            !tool_calls(c, &x->tool_calls, nomem)) {
            c->out->unsupported = "a tool_calls that is not a list of calls with a function";
            return false;
        }
        if (x->has_reasoning && !kvr_json_member_is_null(c->b, &x->reasoning)) {
            raw(c, "reasoning", &x->reasoning);
            raw(c, "reasoning_content", &x->reasoning);
        }
    } else if (role_is(msg, "tool") && x->has_tool_call_id) {
        raw(c, "tool_call_id", &x->tool_call_id);
    }
    if (x->has_name && c->b[x->name.val] == '"')
        raw(c, "name", &x->name);
    if (x->has_task && c->b[x->task.val] == '"')
        raw(c, "task", &x->task);
    if (role_is(msg, "developer")) {
        kvr_json_key(w, "tools");
        if (x->has_tools)
            kvr_json_raw(w, c->b + x->tools.val, x->tools.val_end - x->tools.val);
        else
            kvr_json_null(w);
    }
    kvr_json_end_object(w);
    return true;
}

/* The messages array at b[i]. */
static int write_messages(conv_t *c, size_t i, const kvr_oai_request_t *rq, bool *nomem)
{
    kvr_json_key(c->w, "messages");
    kvr_json_begin_array(c->w);
    size_t k = 0;
    i = kvr_json_skip_ws(c->b, c->n, i + 1);
    while (i < c->n && c->b[i] != ']') {
        msg_extra_t x;
        if (k >= rq->n_messages || !scan_message(c, i, &x))
            return KVR_EPARSE;
        if (!write_message(c, &rq->messages[k], &x, nomem))
            return KVR_OK; /* unsupported */
        k++;
        i = kvr_json_skip_value(c->b, c->n, i, KVR_JSON_LENIENT);
        if (i == KVR_JSON_BAD)
            return KVR_EPARSE;
        i = kvr_json_skip_ws(c->b, c->n, i);
        if (i < c->n && c->b[i] == ',')
            i = kvr_json_skip_ws(c->b, c->n, i + 1);
    }
    if (k != rq->n_messages)
        return KVR_EPARSE;
    kvr_json_end_array(c->w);
    return KVR_OK;
}

/* ---------------------------------------------------------------------------------------- */
/* Tools, as ChatCompletionToolsParam.model_dump() gives them */

static void emit_or_null(kvr_json_writer_t *w, yajl_val obj, const char *key)
{
    kvr_json_key(w, key);
    emit(w, member(obj, key));
}

static bool emit_tool(kvr_json_writer_t *w, yajl_val t)
{
    static const char *const FN_FIELDS[] = {"name", "description", "parameters", "strict"};
    yajl_val fn = member(t, "function");
    yajl_val type = member(t, "type");
    if (!YAJL_IS_OBJECT(t) || !YAJL_IS_OBJECT(fn) || !YAJL_IS_STRING(member(fn, "name")) ||
        (type != NULL && !YAJL_IS_STRING(type)))
        return false;
    kvr_json_begin_object(w);
    kvr_json_key(w, "type");
    kvr_json_string(w, type != NULL ? type->u.string : "function");
    kvr_json_key(w, "function");
    kvr_json_begin_object(w);
    for (size_t i = 0; i < 4; i++)
        emit_or_null(w, fn, FN_FIELDS[i]);
    for (size_t i = 0; i < fn->u.object.len; i++) { /* extra members (extra="allow") */
        const char *k = fn->u.object.keys[i];
        bool known = false;
        for (size_t j = 0; j < 4 && !known; j++)
            known = strcmp(k, FN_FIELDS[j]) == 0;
        if (!known) {
            kvr_json_key(w, k);
            emit(w, fn->u.object.values[i]);
        }
    }
    kvr_json_end_object(w);
    for (size_t i = 0; i < t->u.object.len; i++) {
        const char *k = t->u.object.keys[i];
        if (strcmp(k, "type") != 0 && strcmp(k, "function") != 0) {
            kvr_json_key(w, k);
            emit(w, t->u.object.values[i]);
        }
    }
    kvr_json_end_object(w);
    return true;
}

static bool write_tools(conv_t *c, const kvr_json_member_t *m, bool *nomem)
{
    yajl_val v = parse(c->b + m->val, m->val_end - m->val, nomem);
    bool ok = YAJL_IS_ARRAY(v);
    if (ok) {
        kvr_json_key(c->w, "tools");
        kvr_json_begin_array(c->w);
        for (size_t i = 0; ok && i < v->u.array.len; i++)
            ok = emit_tool(c->w, v->u.array.values[i]);
        kvr_json_end_array(c->w);
    }
    yajl_tree_free(v);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */

static bool literal(const char *b, const kvr_json_member_t *m, const char *lit)
{
    size_t l = strlen(lit);
    return m->val_end - m->val == l && memcmp(b + m->val, lit, l) == 0;
}

/* The top-level members that matter; false when the body does not scan. */
typedef struct top {
    kvr_json_member_t messages, tools, kwargs;
    bool has_messages, has_tools, has_kwargs;
} top_t;

static bool scan_top(conv_t *c, top_t *t)
{
    kvr_chat_conv_t *o = c->out;
    memset(t, 0, sizeof *t);
    kvr_json_iter_t it;
    kvr_json_member_t m;
    int r;
    size_t i = kvr_json_skip_ws(c->b, c->n, 0);
    if (i >= c->n || c->b[i] != '{')
        return false;
    kvr_json_object_begin(&it, c->b, c->n, i, KVR_JSON_LENIENT);
    while ((r = kvr_json_object_next(&it, &m)) == 1) {
        if (kvr_json_key_is(c->b, &m, "messages")) {
            t->messages = m;
            t->has_messages = true;
        } else if (kvr_json_key_is(c->b, &m, "tools")) {
            t->tools = m;
            t->has_tools = !kvr_json_member_is_null(c->b, &m);
        } else if (kvr_json_key_is(c->b, &m, "chat_template_kwargs")) {
            t->kwargs = m;
            t->has_kwargs = c->b[m.val] == '{';
        } else if (kvr_json_key_is(c->b, &m, "add_generation_prompt")) {
            o->add_generation_prompt = !literal(c->b, &m, "false");
        } else if (kvr_json_key_is(c->b, &m, "add_special_tokens")) {
            o->add_special = literal(c->b, &m, "true") ? 1 : literal(c->b, &m, "false") ? 0 : -1;
        } else if (kvr_json_key_is(c->b, &m, "continue_final_message")) {
            o->continue_final = literal(c->b, &m, "true");
        } else if (kvr_json_key_is(c->b, &m, "chat_template")) {
            if (!kvr_json_member_is_null(c->b, &m))
                o->unsupported = "a request chat_template";
        } else if (kvr_json_key_is(c->b, &m, "documents")) {
            if (!kvr_json_member_is_null(c->b, &m))
                o->unsupported = "documents";
        }
    }
    return r == 0;
}

/* Locates the two members of the object w holds now. */
static int spans(kvr_json_writer_t *w, kvr_chat_conv_t *o)
{
    const char *j;
    size_t jl;
    int rc = kvr_json_writer_finish(w, &j, &jl);
    if (rc != KVR_OK)
        return rc;
    kvr_json_iter_t it;
    kvr_json_member_t m;
    kvr_json_object_begin(&it, j, jl, 0, KVR_JSON_LENIENT);
    while (kvr_json_object_next(&it, &m) == 1) {
        if (kvr_json_key_is(j, &m, "messages")) {
            o->messages = j + m.val;
            o->messages_len = m.val_end - m.val;
        } else if (kvr_json_key_is(j, &m, "tools")) {
            o->tools = j + m.val;
            o->tools_len = m.val_end - m.val;
        }
    }
    return o->messages != NULL || o->unsupported != NULL ? KVR_OK : KVR_EPARSE;
}

int kvr_chat_conv_build(kvr_json_writer_t *w, const char *body, size_t len,
                        const kvr_oai_request_t *rq, kvr_chat_conv_t *out)
{
    *out = (kvr_chat_conv_t){.add_generation_prompt = true, .add_special = -1};
    conv_t c = {w, body, len, out};
    top_t t;
    if (!scan_top(&c, &t)) { /* yajl took what JSON does not: \v or \f as whitespace */
        out->unsupported = UNSCANNED;
        return KVR_OK;
    }
    if (rq->prompt_kind != KVR_OAI_PROMPT_MESSAGES)
        return KVR_OK; /* the flags only */
    if (!t.has_messages) {
        out->unsupported = UNSCANNED;
        return KVR_OK;
    }
    if (rq->n_images > 0)
        out->unsupported = "image content";
    if (rq->n_messages > 0) {
        out->final = rq->messages[rq->n_messages - 1].content;
        out->final_len = rq->messages[rq->n_messages - 1].content_len;
    }
    if (out->unsupported != NULL)
        return KVR_OK;
    if (t.has_kwargs) {
        out->kwargs = body + t.kwargs.val;
        out->kwargs_len = t.kwargs.val_end - t.kwargs.val;
    }
    bool nomem = false;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    int rc = write_messages(&c, t.messages.val, rq, &nomem);
    if (nomem)
        return KVR_ENOMEM;
    if (rc != KVR_OK)
        out->unsupported = UNSCANNED;
    if (out->unsupported != NULL)
        return KVR_OK;
    if (t.has_tools && !write_tools(&c, &t.tools, &nomem)) {
        out->unsupported = "tools that are not objects with a named function";
        return nomem ? KVR_ENOMEM : KVR_OK;
    }
    kvr_json_end_object(w);
    if (nomem)
        return KVR_ENOMEM;
    return spans(w, out);
}
