/*
 * model.c: a model's prompt ids from its folder (model.h): the tokenizer and the chat
 * template loaded side by side, a chat rendered then encoded.
 * Invariants: m->tok is never NULL; m->tmpl is NULL exactly when tokenizer_config.json has no
 * chat_template (or there is no such file). A scratch keeps the last rendered text until its
 * next use. Ownership: the model owns both halves; a scratch owns its encoder scratch and text.
 * Threads: see model.h. Cost: one malloc per chat render (the template's output buffer).
 */
#include "tokenizer/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "kvrouter/status.h"

struct kvr_tokmodel {
    kvr_tok_t *tok;
    struct kvr_tmpl *tmpl;
    size_t config_bytes;
};

struct kvr_tokmodel_scratch {
    kvr_tok_scratch_t *tok;
    char *text;
};

/* The chat template of dir/tokenizer_config.json, or none (*out NULL) when the file or its
 * chat_template is absent. */
static int load_template(const char *dir, struct kvr_tmpl **out, size_t *bytes, char *err,
                         size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    char *json;
    size_t len;
    *out = NULL;
    *bytes = 0;
    int rc = kvr_file_read(path, (size_t)1 << 26, &json, &len);
    if (rc == KVR_ENOTFOUND)
        return KVR_OK;
    if (rc != KVR_OK) {
        snprintf(err, errlen, "%s: %s", path, kvr_strerror(rc));
        return rc;
    }
    char e[400] = "";
    rc = kvr_tmpl_load_config(json, len, NULL, out, e, sizeof e);
    free(json);
    if (rc == KVR_ENOTFOUND)
        return KVR_OK;
    if (rc != KVR_OK) {
        snprintf(err, errlen, "%s: chat_template: %s", path, e);
        return rc;
    }
    *bytes = len;
    return KVR_OK;
}

kvr_tokmodel_t *kvr_tokmodel_load(const char *dir, int *status, char *err, size_t errlen)
{
    kvr_tokmodel_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        *status = KVR_ENOMEM;
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    m->tok = kvr_tok_load(dir, status, err, errlen);
    if (m->tok == NULL) {
        free(m);
        return NULL;
    }
    int rc = load_template(dir, &m->tmpl, &m->config_bytes, err, errlen);
    if (rc != KVR_OK) {
        *status = rc;
        kvr_tokmodel_free(m);
        return NULL;
    }
    *status = KVR_OK;
    return m;
}

void kvr_tokmodel_free(kvr_tokmodel_t *m)
{
    if (m == NULL)
        return;
    kvr_tok_free(m->tok);
    kvr_tmpl_free(m->tmpl);
    free(m);
}

const kvr_tok_t *kvr_tokmodel_tok(const kvr_tokmodel_t *m)
{
    return m->tok;
}

bool kvr_tokmodel_has_chat(const kvr_tokmodel_t *m)
{
    return m->tmpl != NULL;
}

size_t kvr_tokmodel_bytes(const kvr_tokmodel_t *m)
{
    return kvr_tok_bytes(m->tok) + m->config_bytes;
}

kvr_tokmodel_scratch_t *kvr_tokmodel_scratch_new(const kvr_tokmodel_t *m)
{
    kvr_tokmodel_scratch_t *s = calloc(1, sizeof *s);
    if (s != NULL && (s->tok = kvr_tok_scratch_new(m->tok)) == NULL) {
        free(s);
        s = NULL;
    }
    return s;
}

void kvr_tokmodel_scratch_free(kvr_tokmodel_scratch_t *s)
{
    if (s == NULL)
        return;
    kvr_tok_scratch_free(s->tok);
    free(s->text);
    free(s);
}

kvr_tok_scratch_t *kvr_tokmodel_scratch_tok(kvr_tokmodel_scratch_t *s) { return s->tok; }

/* The last occurrence of needle in hay, or NULL. */
static const char *last_of(const char *hay, size_t hn, const char *needle, size_t nn)
{
    if (nn > hn)
        return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(hay + i, needle, nn) == 0)
            return hay + i;
    return NULL;
}

/* The length of the code point at s[0..n) when it is whitespace to Python's str.strip()
 * (str.isspace), else 0. */
static size_t py_space_at(const unsigned char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (s[0] < 0x80)
        return (s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20) ? 1 : 0;
    uint32_t cp;
    size_t l;
    if ((s[0] & 0xe0) == 0xc0 && n >= 2) {
        cp = (uint32_t)(s[0] & 0x1f) << 6 | (s[1] & 0x3f);
        l = 2;
    } else if ((s[0] & 0xf0) == 0xe0 && n >= 3) {
        cp = (uint32_t)(s[0] & 0x0f) << 12 | (uint32_t)(s[1] & 0x3f) << 6 | (s[2] & 0x3f);
        l = 3;
    } else {
        return 0;
    }
    bool sp = cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) ||
              cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
    return sp ? l : 0;
}

/* Python's lstrip / rstrip of f[0..*len): the bytes dropped in front (lead) and behind. */
static void py_strip(const char *f, size_t len, size_t *lead, size_t *kept)
{
    const unsigned char *u = (const unsigned char *)f;
    size_t i = 0, k;
    while (i < len && (k = py_space_at(u + i, len - i)) > 0)
        i += k;
    size_t end = len;
    while (end > i) { /* the code point ending at end: step back over continuation bytes */
        size_t st = end - 1;
        while (st > i && (u[st] & 0xc0) == 0x80)
            st--;
        if (py_space_at(u + st, end - st) != end - st)
            break;
        end = st;
    }
    *lead = i;
    *kept = end - i;
}

/* transformers' continue_final_message: the rendered text cut just after the final content's
 * last occurrence (its stripped form found; the content kept with its trailing whitespace when
 * the template kept it); *len updated. */
static int cut_at_final(const kvr_tokmodel_input_t *in, const char *text, size_t *len, char *err,
                        size_t errlen)
{
    const char *f = in->final != NULL ? in->final : "";
    size_t fl = in->final_len, lead, kept;
    py_strip(f, fl, &lead, &kept);
    const char *at = last_of(text, *len, f + lead, kept);
    if (at == NULL) {
        snprintf(err, errlen, "continue_final_message is set but the final message does not "
                 "appear in the chat after applying the chat template");
        return KVR_EINVAL;
    }
    size_t loc = (size_t)(at - text);
    /* rendered[loc : loc + len(lstripped)] == final_message: only when nothing was stripped in
     * front and the template kept the content whole */
    if (lead == 0 && loc + fl <= *len && memcmp(text + loc, f, fl) == 0)
        *len = loc + fl;
    else
        *len = loc + kept;
    return KVR_OK;
}

int kvr_tokmodel_ids(const kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s,
                     const kvr_tokmodel_input_t *in, uint32_t *ids, size_t cap, size_t *n,
                     const char **rendered, size_t *rendered_len, char *err, size_t errlen)
{
    const char *text = in->text;
    size_t len = in->text_len;
    bool chat = in->chat.messages != NULL;
    *n = 0;
    if (chat) {
        if (m->tmpl == NULL) {
            snprintf(err, errlen, "the model's tokenizer_config.json has no chat_template");
            return KVR_ENOTFOUND;
        }
        if (in->continue_final && in->chat.add_generation_prompt) {
            snprintf(err, errlen, "continue_final_message and add_generation_prompt are both "
                     "set; the final message cannot be continued after a generation prompt");
            return KVR_EINVAL;
        }
        free(s->text);
        s->text = NULL;
        int rc = kvr_tmpl_render(m->tmpl, &in->chat, &s->text, &len, err, errlen);
        if (rc == KVR_OK && in->continue_final)
            rc = cut_at_final(in, s->text, &len, err, errlen);
        if (rc != KVR_OK)
            return rc;
        text = s->text;
    }
    if (rendered != NULL) {
        *rendered = text;
        *rendered_len = len;
    }
    bool add_special = in->add_special < 0 ? !chat : in->add_special != 0;
    int rc = kvr_tok_encode_r(m->tok, s->tok, text, len, add_special, ids, cap, n);
    if (rc == KVR_ETOOBIG)
        snprintf(err, errlen, "the prompt has %zu tokens, over the limit of %zu", *n, cap);
    else if (rc != KVR_OK)
        snprintf(err, errlen, "%s", kvr_strerror(rc));
    return rc;
}
