/*
 * tok_post.c: what the post-processor adds with add_special: the ids before and after the
 * sequence. TemplateProcessing's "single" template (special tokens around $A; its "pair" is
 * not used by single-text encoding), ByteLevel (offsets only: adds nothing), Sequence of those.
 * tokenizer_config.json's add_bos_token / add_eos_token rule replaces them (tok_load.c decides).
 * Anything else (BertProcessing, RobertaProcessing, $B in single) is refused by name.
 *
 * Ownership: the two id arrays are the post's. Threads: read-only once built. Cost: O(1) per
 * encoding (the ids copied).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_impl.h"

static int append(uint32_t **arr, size_t *n, uint32_t id)
{
    uint32_t *p = realloc(*arr, (*n + 1) * sizeof *p);
    if (p == NULL)
        return KVR_ENOMEM;
    *arr = p;
    p[(*n)++] = id;
    return KVR_OK;
}

static int template(const tj_node_t *node, tok_post_t *post, char *err, size_t err_len)
{
    static const char *const ok[] = {"type", "single", "pair", "special_tokens", NULL};
    const char *bad = kvr_tj_unknown_key(node, ok);
    if (bad != NULL) {
        snprintf(err, err_len, "post_processor: TemplateProcessing: option \"%s\" is not supported",
                 bad);
        return KVR_EPARSE;
    }
    const tj_node_t *single = kvr_tj_get(node, "single");
    const tj_node_t *specials = kvr_tj_get(node, "special_tokens");
    if (single == NULL || single->type != TJ_ARR) {
        snprintf(err, err_len, "post_processor: TemplateProcessing: no single template");
        return KVR_EPARSE;
    }
    if (post->n_pre || post->n_post) {
        snprintf(err, err_len, "post_processor: two templates are not supported");
        return KVR_EPARSE;
    }
    bool seen_a = false;
    for (size_t i = 0; i < single->n; i++) {
        const tj_node_t *it = single->kids[i];
        const tj_node_t *seq = kvr_tj_get(it, "Sequence"), *sp = kvr_tj_get(it, "SpecialToken");
        const tj_node_t *id = kvr_tj_get(seq ? seq : sp, "id");
        if (id == NULL || id->type != TJ_STR) {
            snprintf(err, err_len,
                     "post_processor: TemplateProcessing: single item %zu is not "
                     "a Sequence or a SpecialToken",
                     i);
            return KVR_EPARSE;
        }
        if (seq != NULL) {
            if (strcmp(id->s, "A") != 0 || seen_a) {
                snprintf(err, err_len,
                         "post_processor: TemplateProcessing: single with "
                         "sequence \"%.10s\" is not supported",
                         id->s);
                return KVR_EPARSE;
            }
            seen_a = true;
            continue;
        }
        const tj_node_t *st = kvr_tj_get(specials, id->s);
        const tj_node_t *ids = kvr_tj_get(st, "ids");
        if (ids == NULL || ids->type != TJ_ARR) {
            snprintf(err, err_len,
                     "post_processor: TemplateProcessing: special token \"%.40s\" "
                     "has no ids",
                     id->s);
            return KVR_EPARSE;
        }
        for (size_t k = 0; k < ids->n; k++) {
            const tj_node_t *v = ids->kids[k];
            char *end = NULL;
            unsigned long x = v->type == TJ_NUM ? strtoul(v->s, &end, 10) : 0;
            if (v->type != TJ_NUM || end == NULL || *end != 0 || x >= UINT32_MAX) {
                snprintf(err, err_len,
                         "post_processor: TemplateProcessing: special token "
                         "\"%.40s\": a bad id",
                         id->s);
                return KVR_EPARSE;
            }
            int rc = seen_a ? append(&post->post, &post->n_post, (uint32_t)x)
                            : append(&post->pre, &post->n_pre, (uint32_t)x);
            if (rc != KVR_OK)
                return rc;
        }
    }
    if (!seen_a) {
        snprintf(err, err_len, "post_processor: TemplateProcessing: single has no $A");
        return KVR_EPARSE;
    }
    return KVR_OK;
}

static int build(const tj_node_t *node, tok_post_t *post, char *err, size_t err_len, int depth)
{
    if (node == NULL || node->type == TJ_NULL)
        return KVR_OK;
    const tj_node_t *type = kvr_tj_get(node, "type");
    if (node->type != TJ_OBJ || type == NULL || type->type != TJ_STR || depth > 16) {
        snprintf(err, err_len, "post_processor: not an object with a type");
        return KVR_EPARSE;
    }
    if (strcmp(type->s, "ByteLevel") == 0)
        return KVR_OK; /* trims offsets; adds no token */
    if (strcmp(type->s, "TemplateProcessing") == 0)
        return template(node, post, err, err_len);
    if (strcmp(type->s, "Sequence") == 0) {
        const tj_node_t *list = kvr_tj_get(node, "processors");
        if (list == NULL || list->type != TJ_ARR) {
            snprintf(err, err_len, "post_processor: Sequence: no processors list");
            return KVR_EPARSE;
        }
        for (size_t i = 0; i < list->n; i++) {
            int rc = build(list->kids[i], post, err, err_len, depth + 1);
            if (rc != KVR_OK)
                return rc;
        }
        return KVR_OK;
    }
    snprintf(err, err_len, "post_processor: type \"%.40s\" is not supported", type->s);
    return KVR_EPARSE;
}

int kvr_tok_post_build(const tj_node_t *node, tok_post_t *post, char *err, size_t err_len)
{
    memset(post, 0, sizeof *post);
    int rc = build(node, post, err, err_len, 0);
    if (rc != KVR_OK)
        kvr_tok_post_free(post);
    return rc;
}

int kvr_tok_post_config(tok_post_t *post, bool add_bos, uint32_t bos, bool add_eos, uint32_t eos)
{
    kvr_tok_post_free(post);
    if (add_bos && append(&post->pre, &post->n_pre, bos) != KVR_OK)
        return KVR_ENOMEM;
    if (add_eos && append(&post->post, &post->n_post, eos) != KVR_OK)
        return KVR_ENOMEM;
    return KVR_OK;
}

void kvr_tok_post_free(tok_post_t *post)
{
    free(post->pre);
    free(post->post);
    memset(post, 0, sizeof *post);
}
