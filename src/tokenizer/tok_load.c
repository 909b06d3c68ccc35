/*
 * tok_load.c: a tokenizer from tokenizer.json (and tokenizer_config.json): the file read, its
 * parts built by their modules (normalizer, pre-tokenizer, BPE model, added tokens,
 * post-processor), anything unsupported refused with the part and option named; lookups of
 * token ids; the memory it holds.
 *
 * Config rule: transformers' Llama and Gemma tokenizers (tokenizer_class LlamaTokenizer[Fast],
 * CodeLlamaTokenizer[Fast], GemmaTokenizer[Fast]) rebuild the post-processor from
 * add_bos_token / add_eos_token when the config gives them, so the router's ids match what
 * vLLM (which loads through transformers) computes: DeepSeek-V3's tokenizer.json adds no BOS
 * but its config (LlamaTokenizerFast, add_bos_token true) does. Other classes keep the file's.
 * Invariants: a loaded tokenizer is complete and immutable; the load either succeeds or frees
 * everything. Ownership: the caller frees with kvr_tok_free. Threads: load and free on any one
 * thread; lookups are read-only. Cost: O(file); the parse tree and the file are freed before
 * return.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "tokenizer/tok_impl.h"

/* tokenizer.json files run to tens of MB (Gemma 3: 33 MB); a GiB is not one. */
#define TOK_FILE_MAX ((size_t)1 << 30)

kvr_tok_t *kvr_tok_load(const char *dir_or_file, int *status, char *err, size_t err_len)
{
    struct stat st;
    char path[4096], cfg[4096];
    if (stat(dir_or_file, &st) != 0) {
        *status = KVR_ENOTFOUND;
        snprintf(err, err_len, "%s: %s", dir_or_file, strerror(errno));
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir_or_file);
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir_or_file);
    } else {
        snprintf(path, sizeof path, "%s", dir_or_file);
        const char *slash = strrchr(dir_or_file, '/');
        if (slash == NULL)
            snprintf(cfg, sizeof cfg, "tokenizer_config.json");
        else
            snprintf(cfg, sizeof cfg, "%.*s/tokenizer_config.json", (int)(slash - dir_or_file),
                     dir_or_file);
    }
    char *json = NULL, *config = NULL;
    size_t json_len = 0, config_len = 0;
    int rc = kvr_file_read(path, TOK_FILE_MAX, &json, &json_len);
    if (rc != KVR_OK) {
        *status = rc;
        snprintf(err, err_len, "%s: %s", path,
                 rc == KVR_ENOTFOUND ? "no such file" : kvr_strerror(rc));
        return NULL;
    }
    rc = kvr_file_read(cfg, TOK_FILE_MAX, &config, &config_len);
    if (rc != KVR_OK && rc != KVR_ENOTFOUND) {
        free(json);
        *status = rc;
        snprintf(err, err_len, "%s: cannot read", cfg);
        return NULL;
    }
    char e[512] = "";
    kvr_tok_t *t = kvr_tok_load_mem(json, json_len, config, config_len, status, e, sizeof e);
    if (t == NULL)
        snprintf(err, err_len, "%s: %s", (strncmp(e, "tokenizer_config", 16) == 0) ? cfg : path, e);
    free(json);
    free(config);
    return t;
}

static bool get_bool(const tj_node_t *obj, const char *key, bool *out, bool *given)
{
    const tj_node_t *v = kvr_tj_get(obj, key);
    *given = v != NULL && v->type == TJ_BOOL;
    if (*given)
        *out = v->b;
    return v == NULL || v->type == TJ_BOOL || v->type == TJ_NULL;
}

/* A config token: "text" or {"content": "text", ...}. */
static char *config_token(const tj_node_t *cfg, const char *key)
{
    const tj_node_t *v = kvr_tj_get(cfg, key);
    if (v != NULL && v->type == TJ_OBJ)
        v = kvr_tj_get(v, "content");
    if (v == NULL || v->type != TJ_STR)
        return NULL;
    return strdup(v->s);
}

static int load_added(kvr_tok_t *t, const tj_node_t *list, char *err, size_t err_len)
{
    if (list == NULL || list->type == TJ_NULL)
        return KVR_OK;
    if (list->type != TJ_ARR) {
        snprintf(err, err_len, "added_tokens: not an array");
        return KVR_EPARSE;
    }
    t->all_added = calloc(list->n + 1, sizeof *t->all_added);
    if (t->all_added == NULL)
        return KVR_ENOMEM;
    tok_buf_t out = {0}, tmp = {0};
    int rc = KVR_OK;
    static const char *const ok[] = {"id",     "content",    "single_word", "lstrip",
                                     "rstrip", "normalized", "special",     NULL};
    for (size_t i = 0; i < list->n && rc == KVR_OK; i++) {
        const tj_node_t *a = list->kids[i];
        const tj_node_t *id = kvr_tj_get(a, "id"), *content = kvr_tj_get(a, "content");
        const char *bad = kvr_tj_unknown_key(a, ok);
        char *end = NULL;
        unsigned long x = id && id->type == TJ_NUM ? strtoul(id->s, &end, 10) : 0;
        bool f[4] = {false}, given;
        static const char *const fl[] = {"single_word", "lstrip", "rstrip", "normalized"};
        bool flags_ok = true;
        for (int k = 0; k < 4; k++)
            flags_ok = flags_ok && get_bool(a, fl[k], &f[k], &given);
        if (bad != NULL || end == NULL || *end != 0 || x >= UINT32_MAX - 1 || content == NULL ||
            content->type != TJ_STR || !flags_ok) {
            snprintf(err, err_len, "added_tokens: entry %zu: %s%.40s%s", i,
                     bad ? "option \"" : "needs an id, a content and boolean flags", bad ? bad : "",
                     bad ? "\" is not supported" : "");
            rc = KVR_EPARSE;
            break;
        }
        tok_added_tok_t *rec = &t->all_added[t->n_all_added++];
        rec->id = (uint32_t)x;
        rec->content = strdup(content->s);
        rec->len = content->len;
        if (rec->content == NULL) {
            rc = KVR_ENOMEM;
            break;
        }
        if ((size_t)x + 1 > t->vocab_size)
            t->vocab_size = (size_t)x + 1;
        if (f[3]) { /* normalized: matched in normalized text, as its normalized content */
            rc = kvr_tok_norm_run(&t->norm, content->s, content->len, &out, &tmp);
            if (rc == KVR_OK)
                rc = kvr_tok_added_add(&t->added_norm, (uint32_t)x, out.p, out.len, f[1], f[2],
                                       f[0]);
        } else {
            rc = kvr_tok_added_add(&t->added_raw, (uint32_t)x, content->s, content->len, f[1], f[2],
                                   f[0]);
        }
    }
    free(out.p);
    free(tmp.p);
    return rc;
}

static bool class_rebuilds_post(const char *cls)
{
    static const char *const classes[] = {"LlamaTokenizer",
                                          "LlamaTokenizerFast",
                                          "CodeLlamaTokenizer",
                                          "CodeLlamaTokenizerFast",
                                          "GemmaTokenizer",
                                          "GemmaTokenizerFast",
                                          NULL};
    for (int i = 0; cls != NULL && classes[i] != NULL; i++)
        if (strcmp(cls, classes[i]) == 0)
            return true;
    return false;
}

static int load_config(kvr_tok_t *t, const char *config, size_t len, char *err, size_t err_len)
{
    tj_doc_t doc;
    char e[200];
    int rc = kvr_tj_parse(config, len, false, &doc, e, sizeof e);
    if (rc != KVR_OK) {
        snprintf(err, err_len, "tokenizer_config.json: %s", e);
        return rc;
    }
    const tj_node_t *cfg = doc.root;
    t->bos = config_token(cfg, "bos_token");
    t->eos = config_token(cfg, "eos_token");
    bool add_bos = false, add_eos = false, g_bos = false, g_eos = false;
    if (!get_bool(cfg, "add_bos_token", &add_bos, &g_bos) ||
        !get_bool(cfg, "add_eos_token", &add_eos, &g_eos)) {
        snprintf(err, err_len, "tokenizer_config.json: add_bos_token/add_eos_token not boolean");
        kvr_tj_free(&doc);
        return KVR_EPARSE;
    }
    const tj_node_t *cls = kvr_tj_get(cfg, "tokenizer_class");
    if (cls != NULL && cls->type == TJ_STR && class_rebuilds_post(cls->s) && (g_bos || g_eos)) {
        uint32_t bos = 0, eos = 0;
        if (add_bos && (t->bos == NULL || kvr_tok_token_id(t, t->bos, &bos) != KVR_OK)) {
            snprintf(err, err_len,
                     "tokenizer_config.json: add_bos_token without a known bos_token");
            rc = KVR_EPARSE;
        } else if (add_eos && (t->eos == NULL || kvr_tok_token_id(t, t->eos, &eos) != KVR_OK)) {
            snprintf(err, err_len,
                     "tokenizer_config.json: add_eos_token without a known eos_token");
            rc = KVR_EPARSE;
        } else {
            rc = kvr_tok_post_config(&t->post, add_bos, bos, add_eos, eos);
        }
    }
    kvr_tj_free(&doc);
    return rc;
}

kvr_tok_t *kvr_tok_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                            int *status, char *err, size_t err_len)
{
    kvr_tok_t *t = calloc(1, sizeof *t);
    tj_doc_t doc;
    int rc = t ? kvr_tj_parse(json, len, true, &doc, err, err_len) : KVR_ENOMEM;
    if (rc != KVR_OK) {
        free(t);
        *status = rc;
        if (rc == KVR_ENOMEM)
            snprintf(err, err_len, "out of memory");
        return NULL;
    }
    const tj_node_t *root = doc.root;
    static const char *const ok[] = {
        "version",       "truncation",     "padding", "added_tokens", "normalizer",
        "pre_tokenizer", "post_processor", "decoder", "model",        NULL};
    const char *bad = kvr_tj_unknown_key(root, ok);
    const tj_node_t *trunc = kvr_tj_get(root, "truncation"), *pad = kvr_tj_get(root, "padding");
    if (root->type != TJ_OBJ) {
        snprintf(err, err_len, "not a JSON object");
        rc = KVR_EPARSE;
    } else if (bad != NULL) {
        snprintf(err, err_len, "member \"%.40s\" is not supported", bad);
        rc = KVR_EPARSE;
    } else if (trunc != NULL && trunc->type != TJ_NULL) {
        snprintf(err, err_len, "truncation is not supported");
        rc = KVR_EPARSE;
    } else if (pad != NULL && pad->type != TJ_NULL) {
        snprintf(err, err_len, "padding is not supported");
        rc = KVR_EPARSE;
    }
    if (rc == KVR_OK)
        rc = kvr_tok_norm_build(kvr_tj_get(root, "normalizer"), &t->norm, err, err_len);
    if (rc == KVR_OK)
        rc = kvr_tok_pretok_build(kvr_tj_get(root, "pre_tokenizer"), &t->pretok, err, err_len);
    if (rc == KVR_OK)
        rc = kvr_tok_bpe_build(kvr_tj_get(root, "model"), &doc, t->pretok.byte_level, &t->bpe, err,
                               err_len);
    if (rc == KVR_OK)
        rc = kvr_tok_post_build(kvr_tj_get(root, "post_processor"), &t->post, err, err_len);
    if (rc == KVR_OK) {
        t->vocab_size = t->bpe.n_ids;
        rc = load_added(t, kvr_tj_get(root, "added_tokens"), err, err_len);
    }
    kvr_tj_free(&doc);
    if (rc == KVR_OK && config != NULL)
        rc = load_config(t, config, config_len, err, err_len);
    for (size_t i = 0; rc == KVR_OK && i < t->post.n_pre + t->post.n_post; i++) {
        uint32_t id = i < t->post.n_pre ? t->post.pre[i] : t->post.post[i - t->post.n_pre];
        if (id >= t->vocab_size) {
            snprintf(err, err_len, "post_processor: special token id %u is not in the vocabulary",
                     id);
            rc = KVR_EPARSE;
        }
    }
    if (rc == KVR_OK) {
        t->scratch = kvr_tok_scratch_new(t);
        if (t->scratch == NULL)
            rc = KVR_ENOMEM;
    }
    if (rc != KVR_OK) {
        if (rc == KVR_ENOMEM)
            snprintf(err, err_len, "out of memory");
        kvr_tok_free(t);
        *status = rc;
        return NULL;
    }
    *status = KVR_OK;
    return t;
}

void kvr_tok_free(kvr_tok_t *t)
{
    if (t == NULL)
        return;
    kvr_tok_scratch_free(t->scratch);
    kvr_tok_norm_free(&t->norm);
    kvr_tok_pretok_free(&t->pretok);
    kvr_tok_bpe_free(&t->bpe);
    kvr_tok_added_free(&t->added_raw);
    kvr_tok_added_free(&t->added_norm);
    kvr_tok_post_free(&t->post);
    for (size_t i = 0; i < t->n_all_added; i++)
        free(t->all_added[i].content);
    free(t->all_added);
    free(t->bos);
    free(t->eos);
    free(t);
}

int kvr_tok_token_id(const kvr_tok_t *t, const char *token, uint32_t *id)
{
    size_t n = strlen(token);
    for (size_t i = 0; i < t->n_all_added; i++)
        if (t->all_added[i].len == n && memcmp(t->all_added[i].content, token, n) == 0) {
            *id = t->all_added[i].id;
            return KVR_OK;
        }
    const tok_bpe_t *b = &t->bpe;
    char *buf = malloc(n + 1);
    if (buf == NULL)
        return KVR_ENOMEM;
    size_t o = 0;
    bool ok = true;
    for (size_t i = 0; i < n && ok;) { /* a byte-level spelling back to bytes */
        size_t l;
        if (!b->byte_level) {
            buf[o++] = token[i++];
            continue;
        }
        if (kvr_tok_utf8_valid((const unsigned char *)token + i, n - i < 4 ? n - i : 4) == 0) {
            ok = false;
            break;
        }
        int c = kvr_tok_cp_to_byte(kvr_tok_utf8_decode((const unsigned char *)token + i, &l));
        ok = c >= 0;
        buf[o++] = (char)c;
        i += l;
    }
    uint32_t v = ok ? kvr_tok_bpe_lookup(b, buf, o) : UINT32_MAX;
    free(buf);
    for (size_t i = 0; v == UINT32_MAX && i < b->n_raw; i++)
        if (strcmp(b->raw_keys[i], token) == 0)
            v = b->raw_ids[i];
    if (v == UINT32_MAX)
        return KVR_ENOTFOUND;
    *id = v;
    return KVR_OK;
}

size_t kvr_tok_vocab_size(const kvr_tok_t *t) { return t->vocab_size; }

size_t kvr_tok_bytes(const kvr_tok_t *t)
{
    const tok_bpe_t *b = &t->bpe;
    size_t n = sizeof *t + b->str_len + b->n_ids * 8 +
               (b->vt ? (b->vmask + 1) * sizeof *b->vt : 0) +
               (b->mt ? (b->mmask + 1) * sizeof *b->mt : 0) + t->pretok.bytes;
    const tok_added_t *as[2] = {&t->added_raw, &t->added_norm};
    for (int k = 0; k < 2; k++) {
        n += as[k]->n_nodes * sizeof(tok_trie_node_t) + as[k]->n * sizeof(tok_added_tok_t);
        for (size_t i = 0; i < as[k]->n; i++)
            n += as[k]->toks[i].len + 1;
    }
    for (size_t i = 0; i < t->n_all_added; i++)
        n += sizeof(tok_added_tok_t) + t->all_added[i].len + 1;
    for (size_t i = 0; i < b->n_raw; i++)
        n += strlen(b->raw_keys[i]) + 1 + sizeof(char *) + 4;
    return n;
}

const char *kvr_tok_bos_token(const kvr_tok_t *t) { return t->bos; }
const char *kvr_tok_eos_token(const kvr_tok_t *t) { return t->eos; }
