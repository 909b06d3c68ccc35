/*
 * tmpl_chat.c: apply_chat_template. Loads a tokenizer_config.json's chat template(s) and
 * special tokens, and renders a request: the variables are those transformers passes
 * (messages, tools (None without), documents=None, add_generation_prompt, the special tokens
 * map, then the request's chat_template_kwargs over it), values built from the request's JSON.
 *
 * Invariants: a kvr_tmpl holds one or two parsed templates (default, tool_use) and the special
 * tokens, all in its arena, read-only after load. Ownership: the caller frees the kvr_tmpl and
 * the rendered text. Threads: renders share the kvr_tmpl read-only; each has its own arena.
 * Cost: load O(config size); render O(request JSON + template steps), memory bounded by the
 * limits.
 */
#include "tokenizer/tmpl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yajl/yajl_tree.h>

#include "base/clock.h"
#include "tokenizer/jinja.h"
#include "kvrouter/status.h"

#define MAX_SPECIAL 16

struct kvr_tmpl {
    struct jarena a;
    struct jnode *def, *tool; /* def may be NULL when only named templates without default */
    bool multi;               /* a list of named templates */
    struct jvar special[MAX_SPECIAL];
    size_t nspecial;
    struct kvr_tmpl_limits lim;
};

static void set_limits(struct kvr_tmpl *t, const struct kvr_tmpl_limits *l)
{
    t->lim = l ? *l : (struct kvr_tmpl_limits){0};
    if (!t->lim.max_output)
        t->lim.max_output = (size_t)16 << 20;
    if (!t->lim.max_memory)
        t->lim.max_memory = (size_t)256 << 20;
    if (!t->lim.max_steps)
        t->lim.max_steps = 10000000;
    if (!t->lim.max_depth)
        t->lim.max_depth = 128;
}

static int parse_into(struct kvr_tmpl *t, const char *src, size_t len, struct jnode **root,
                      char *err, size_t errlen)
{
    return jinja_parse(&t->a, src, len, t->lim.max_depth, root, err, errlen);
}

int kvr_tmpl_load(const char *src, size_t len, const struct kvr_tmpl_limits *limits,
                  struct kvr_tmpl **out, char *err, size_t errlen)
{
    struct kvr_tmpl *t = calloc(1, sizeof *t);
    if (!t)
        return KVR_ENOMEM;
    set_limits(t, limits);
    ja_init(&t->a, (size_t)64 << 20);
    int rc = parse_into(t, src, len, &t->def, err, errlen);
    if (rc) {
        kvr_tmpl_free(t);
        return rc;
    }
    *out = t;
    return KVR_OK;
}

void kvr_tmpl_free(struct kvr_tmpl *t)
{
    if (!t)
        return;
    ja_free(&t->a);
    free(t);
}

static const char *token_text(yajl_val v)
{
    if (YAJL_IS_STRING(v))
        return v->u.string;
    if (YAJL_IS_OBJECT(v)) {
        const char *path[] = {"content", NULL};
        yajl_val c = yajl_tree_get(v, path, yajl_t_string);
        return c ? c->u.string : NULL;
    }
    return NULL;
}

int kvr_tmpl_load_config(const char *json, size_t len, const struct kvr_tmpl_limits *limits,
                         struct kvr_tmpl **out, char *err, size_t errlen)
{
    char *z = malloc(len + 1);
    if (!z)
        return KVR_ENOMEM;
    memcpy(z, json, len);
    z[len] = 0;
    char ebuf[256] = "";
    yajl_val root = yajl_tree_parse(z, ebuf, sizeof ebuf);
    free(z);
    if (!root || !YAJL_IS_OBJECT(root)) {
        snprintf(err, errlen, "tokenizer_config.json: %s",
                 root ? "not a JSON object" : "invalid JSON");
        yajl_tree_free(root);
        return KVR_EPARSE;
    }
    struct kvr_tmpl *t = calloc(1, sizeof *t);
    if (!t) {
        yajl_tree_free(root);
        return KVR_ENOMEM;
    }
    set_limits(t, limits);
    ja_init(&t->a, (size_t)64 << 20);
    int rc = KVR_OK;
    const char *ct_path[] = {"chat_template", NULL};
    yajl_val ct = yajl_tree_get(root, ct_path, yajl_t_any);
    if (!ct || YAJL_IS_NULL(ct)) {
        snprintf(err, errlen, "tokenizer_config.json has no chat_template");
        rc = KVR_ENOTFOUND;
    } else if (YAJL_IS_STRING(ct)) {
        rc = parse_into(t, ct->u.string, strlen(ct->u.string), &t->def, err, errlen);
    } else if (YAJL_IS_ARRAY(ct)) {
        t->multi = true;
        for (size_t i = 0; i < ct->u.array.len && !rc; i++) {
            yajl_val it = ct->u.array.values[i];
            const char *np[] = {"name", NULL}, *tp[] = {"template", NULL};
            yajl_val nm = yajl_tree_get(it, np, yajl_t_string);
            yajl_val tx = yajl_tree_get(it, tp, yajl_t_string);
            if (!nm || !tx) {
                snprintf(err, errlen, "chat_template[%zu]: expected {name, template}", i);
                rc = KVR_EPARSE;
                break;
            }
            struct jnode **slot = strcmp(nm->u.string, "default") == 0    ? &t->def
                                  : strcmp(nm->u.string, "tool_use") == 0 ? &t->tool
                                                                          : NULL;
            if (slot) {
                char e2[512];
                rc = parse_into(t, tx->u.string, strlen(tx->u.string), slot, e2, sizeof e2);
                if (rc)
                    snprintf(err, errlen, "chat_template \"%s\": %s", nm->u.string, e2);
            }
        }
        if (!rc && !t->def && !t->tool) {
            snprintf(err, errlen, "chat_template: no \"default\" or \"tool_use\" template");
            rc = KVR_ENOTFOUND;
        }
    } else {
        snprintf(err, errlen, "chat_template: expected a string or a list");
        rc = KVR_EPARSE;
    }
    /* the special tokens map: non-empty token strings, and additional_special_tokens */
    static const char *const names[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                        "pad_token", "cls_token", "mask_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !rc; i++) {
        const char *p[] = {names[i], NULL};
        yajl_val v = yajl_tree_get(root, p, yajl_t_any);
        const char *s = v ? token_text(v) : NULL;
        if (!s || !*s)
            continue;
        size_t n = strlen(s);
        char *c = ja_strdup(&t->a, s, n);
        if (!c) {
            rc = KVR_ETOOBIG;
            break;
        }
        t->special[t->nspecial++] = (struct jvar){names[i], strlen(names[i]), jv_str(c, n)};
    }
    const char *ap[] = {"additional_special_tokens", NULL};
    yajl_val ast = rc ? NULL : yajl_tree_get(root, ap, yajl_t_array);
    if (ast && ast->u.array.len) {
        struct jlist *l = jl_new(&t->a, ast->u.array.len);
        if (!l)
            rc = KVR_ETOOBIG;
        for (size_t i = 0; l && i < ast->u.array.len && !rc; i++) {
            const char *s = token_text(ast->u.array.values[i]);
            char *c = s ? ja_strdup(&t->a, s, strlen(s)) : NULL;
            if (!c) {
                rc = s ? KVR_ETOOBIG : KVR_EPARSE;
                snprintf(err, errlen, "additional_special_tokens[%zu]: not a token", i);
                break;
            }
            l->a[l->n++] = jv_str(c, strlen(c));
        }
        if (!rc)
            t->special[t->nspecial++] =
                (struct jvar){"additional_special_tokens", 25, {.kind = JV_LIST, .u.l = l}};
    }
    yajl_tree_free(root);
    if (rc) {
        kvr_tmpl_free(t);
        return rc;
    }
    *out = t;
    return KVR_OK;
}

static int add_var(struct jvar *vars, size_t *n, size_t cap, const char *name, size_t len,
                   struct jv v)
{
    for (size_t i = 0; i < *n; i++)
        if (vars[i].n == len && memcmp(vars[i].name, name, len) == 0) {
            vars[i].v = v;
            return KVR_OK;
        }
    if (*n == cap)
        return KVR_ETOOBIG;
    vars[(*n)++] = (struct jvar){name, len, v};
    return KVR_OK;
}

int kvr_tmpl_render(const struct kvr_tmpl *t, const struct kvr_tmpl_input *in, char **out,
                    size_t *out_len, char *err, size_t errlen)
{
    if (!t || !in || !in->messages || !out || !out_len) {
        snprintf(err, errlen, "render: missing argument");
        return KVR_EINVAL;
    }
    const struct jnode *root = t->def;
    if (t->multi && in->tools && t->tool)
        root = t->tool;
    if (!root) {
        snprintf(err, errlen, "This model has multiple chat templates with no default specified!");
        return KVR_ENOTFOUND;
    }
    struct jarena a;
    ja_init(&a, t->lim.max_memory);
    struct jv msgs, tools = jv_none(), kw = jv_undef();
    char e2[256] = "";
    int rc = jv_from_json(&a, in->messages, in->messages_len, &msgs, e2, sizeof e2);
    if (!rc && in->tools)
        rc = jv_from_json(&a, in->tools, in->tools_len, &tools, e2, sizeof e2);
    if (!rc && in->kwargs) {
        rc = jv_from_json(&a, in->kwargs, in->kwargs_len, &kw, e2, sizeof e2);
        if (!rc && kw.kind != JV_DICT) {
            snprintf(e2, sizeof e2, "chat_template_kwargs: not an object");
            rc = KVR_EPARSE;
        }
    }
    if (rc) {
        snprintf(err, errlen, "request: %s", e2);
        ja_free(&a);
        return rc == KVR_ETOOBIG ? rc : KVR_EPARSE;
    }
    size_t cap = MAX_SPECIAL + 4 + (kw.kind == JV_DICT ? kw.u.d->n : 0), n = 0;
    struct jvar *vars = malloc(cap * sizeof *vars);
    if (!vars) {
        ja_free(&a);
        return KVR_ENOMEM;
    }
    for (size_t i = 0; i < t->nspecial; i++)
        add_var(vars, &n, cap, t->special[i].name, t->special[i].n, t->special[i].v);
    for (size_t i = 0; kw.kind == JV_DICT && i < kw.u.d->n && !rc; i++) {
        struct jv k = kw.u.d->k[i];
        static const char *const reserved[] = {"messages", "tools", "documents",
                                               "add_generation_prompt"};
        for (size_t r = 0; r < 4; r++)
            if (strlen(reserved[r]) == k.u.s.n && memcmp(reserved[r], k.u.s.p, k.u.s.n) == 0) {
                snprintf(err, errlen, "chat_template_kwargs may not set \"%s\"", reserved[r]);
                rc = KVR_EINVAL;
            }
        if (!rc)
            add_var(vars, &n, cap, k.u.s.p, k.u.s.n, kw.u.d->v[i]);
    }
    if (!rc) {
        add_var(vars, &n, cap, "messages", 8, msgs);
        add_var(vars, &n, cap, "tools", 5, tools);
        add_var(vars, &n, cap, "documents", 9, jv_none());
        add_var(vars, &n, cap, "add_generation_prompt", 21, jv_bool(in->add_generation_prompt));
        struct jrender_opts o = {.max_output = t->lim.max_output,
                                 .max_memory = t->lim.max_memory,
                                 .max_steps = t->lim.max_steps,
                                 .max_depth = t->lim.max_depth * 4,
                                 .now_s = in->now_s ? in->now_s
                                                    : (int64_t)(kvr_wall_ns() / 1000000000u)};
        rc = jinja_render(root, &a, vars, n, &o, out, out_len, err, errlen);
    }
    free(vars);
    ja_free(&a);
    return rc;
}
