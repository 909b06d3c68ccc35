/*
 * tok_json.c: tokenizer.json read with yajl's event parser into a small tree, except the two
 * bulky members, model.vocab (an object of token -> id) and model.merges (an array of "a b"
 * strings or [a, b] pairs), which are streamed into flat arrays over one string pool: a
 * 262K-vocab file then costs a few large allocations instead of millions of tree nodes.
 *
 * Invariants: every tree string is NUL-terminated (embedded NULs kept, len is the length);
 * pool offsets fit 32 bits (files over 4 GB are refused); a vocab/merges member that is not
 * the shape expected (a Unigram vocab is an array) goes into the tree instead, for the
 * model's checks to refuse by name. Ownership: the doc owns the tree and the arrays
 * (kvr_tj_free). Threads: none. Cost: O(file), one pass.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "base/grow.h"
#include "tokenizer/tok_impl.h"

enum { F_TREE, F_VOCAB, F_MERGES, F_PAIR };

typedef struct frame {
    int kind;
    tj_node_t *node; /* F_TREE */
    bool is_model;
    int n_pair;
    tj_str_t pair[2];
} frame_t;

typedef struct ctx {
    tj_doc_t *doc;
    bool stream;
    frame_t st[64];
    int depth;
    char *key; /* pending object key (tree) */
    size_t key_len;
    tj_str_t vkey; /* pending vocab key */
    bool oom, bad;
    char msg[160];
} ctx_t;

static void node_free(tj_node_t *n)
{
    if (n == NULL)
        return;
    free(n->s);
    for (size_t i = 0; i < n->n; i++) {
        if (n->keys)
            free(n->keys[i]);
        node_free(n->kids[i]);
    }
    free(n->keys);
    free(n->kids);
    free(n);
}

void kvr_tj_free(tj_doc_t *doc)
{
    node_free(doc->root);
    free(doc->pool);
    free(doc->vocab_key);
    free(doc->vocab_id);
    free(doc->merge);
    memset(doc, 0, sizeof *doc);
}

const tj_node_t *kvr_tj_get(const tj_node_t *obj, const char *key)
{
    if (obj == NULL || obj->type != TJ_OBJ)
        return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (strcmp(obj->keys[i], key) == 0)
            return obj->kids[i];
    return NULL;
}

const char *kvr_tj_unknown_key(const tj_node_t *obj, const char *const *allowed)
{
    if (obj == NULL || obj->type != TJ_OBJ)
        return NULL;
    for (size_t i = 0; i < obj->n; i++) {
        size_t j = 0;
        while (allowed[j] != NULL && strcmp(allowed[j], obj->keys[i]) != 0)
            j++;
        if (allowed[j] == NULL)
            return obj->keys[i];
    }
    return NULL;
}

char *kvr_tj_dup(const void *s, size_t n)
{
    char *p = malloc(n + 1);
    if (p != NULL) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

static bool pool_add(ctx_t *c, const unsigned char *s, size_t n, tj_str_t *out)
{
    tj_doc_t *d = c->doc;
    if (d->pool_len + n > UINT32_MAX) {
        c->bad = true;
        snprintf(c->msg, sizeof c->msg, "the file's vocabulary is over 4 GB");
        return false;
    }
    if (kvr_grow((void **)&d->pool, &d->pool_cap, d->pool_len + n + 1, (size_t)UINT32_MAX + 1, 1) !=
        0) {
        c->oom = true;
        return false;
    }
    memcpy(d->pool + d->pool_len, s, n);
    out->off = (uint32_t)d->pool_len;
    out->len = (uint32_t)n;
    d->pool_len += n;
    return true;
}

/* Adds a value node to the current tree container (or makes it the root). */
static bool add_node(ctx_t *c, tj_node_t *n)
{
    if (n == NULL) {
        c->oom = true;
        return false;
    }
    if (c->depth == 0) {
        if (c->doc->root != NULL) {
            node_free(n);
            return false;
        }
        c->doc->root = n;
        return true;
    }
    tj_node_t *p = c->st[c->depth - 1].node;
    if (p->n == p->cap) { /* doubling: a realloc per member is quadratic where realloc copies */
        size_t m = p->cap < 4 ? 4 : 2 * p->cap;
        tj_node_t **kids = realloc(p->kids, m * sizeof *kids);
        if (kids == NULL) {
            node_free(n);
            c->oom = true;
            return false;
        }
        p->kids = kids;
        if (p->type == TJ_OBJ) {
            char **keys = realloc(p->keys, m * sizeof *keys);
            if (keys == NULL) {
                node_free(n);
                c->oom = true;
                return false;
            }
            p->keys = keys;
        }
        p->cap = m;
    }
    if (p->type == TJ_OBJ) {
        char **keys = p->keys;
        keys[p->n] = c->key ? c->key : kvr_tj_dup((const unsigned char *)"", 0);
        c->key = NULL;
        if (keys[p->n] == NULL) {
            node_free(n);
            c->oom = true;
            return false;
        }
    }
    p->kids[p->n++] = n;
    return true;
}

static tj_node_t *mk(int type)
{
    tj_node_t *n = calloc(1, sizeof *n);
    if (n != NULL)
        n->type = type;
    return n;
}

static frame_t *top(ctx_t *c) { return c->depth ? &c->st[c->depth - 1] : NULL; }

static int on_scalar(ctx_t *c, int type, bool b, const unsigned char *s, size_t n)
{
    frame_t *f = top(c);
    if (f != NULL && f->kind == F_VOCAB) {
        uint64_t v = 0;
        size_t i = 0;
        if (type != TJ_NUM || n == 0 || n > 10)
            goto bad_vocab;
        for (i = 0; i < n; i++) {
            if (s[i] < '0' || s[i] > '9')
                goto bad_vocab;
            v = v * 10 + (s[i] - '0');
        }
        if (v >= UINT32_MAX - 1)
            goto bad_vocab;
        tj_doc_t *d = c->doc;
        size_t need = d->n_vocab + 1, before = d->cap_vocab;
        if (kvr_grow((void **)&d->vocab_key, &d->cap_vocab, need, SIZE_MAX / 16,
                     sizeof *d->vocab_key) != 0) {
            c->oom = true;
            return 0;
        }
        if (d->cap_vocab != before || d->vocab_id == NULL) { /* ids grow with the keys */
            uint32_t *ids = realloc(d->vocab_id, d->cap_vocab * sizeof *ids);
            if (ids == NULL) {
                c->oom = true;
                return 0;
            }
            d->vocab_id = ids;
        }
        d->vocab_key[d->n_vocab] = c->vkey;
        d->vocab_id[d->n_vocab++] = (uint32_t)v;
        return 1;
    bad_vocab:
        c->bad = true;
        snprintf(c->msg, sizeof c->msg, "model: vocab: the id of token %zu is not an id",
                 c->doc->n_vocab);
        return 0;
    }
    if (f != NULL && (f->kind == F_MERGES || f->kind == F_PAIR)) {
        if (type != TJ_STR)
            goto bad_merge;
        if (f->kind == F_PAIR) {
            if (f->n_pair >= 2)
                goto bad_merge;
            if (!pool_add(c, s, n, &f->pair[f->n_pair]))
                return 0;
            f->n_pair++;
            return 1;
        }
        const unsigned char *sp = memchr(s, ' ', n);
        if (sp == NULL)
            goto bad_merge;
        tj_str_t a, bb;
        if (!pool_add(c, s, (size_t)(sp - s), &a) ||
            !pool_add(c, sp + 1, n - (size_t)(sp - s) - 1, &bb))
            return 0;
        tj_doc_t *d = c->doc;
        if (kvr_grow((void **)&d->merge, &d->cap_merges, 2 * d->n_merges + 2, SIZE_MAX / 16,
                     sizeof *d->merge) != 0) {
            c->oom = true;
            return 0;
        }
        d->merge[2 * d->n_merges] = a;
        d->merge[2 * d->n_merges + 1] = bb;
        d->n_merges++;
        return 1;
    bad_merge:
        c->bad = true;
        snprintf(c->msg, sizeof c->msg,
                 "model: merges: entry %zu is not \"a b\" nor a pair of strings", c->doc->n_merges);
        return 0;
    }
    tj_node_t *nd = mk(type);
    if (nd == NULL) {
        c->oom = true;
        return 0;
    }
    nd->b = b;
    if (type == TJ_STR || type == TJ_NUM) {
        nd->s = kvr_tj_dup(s, n);
        nd->len = n;
        if (nd->s == NULL) {
            free(nd);
            c->oom = true;
            return 0;
        }
    }
    return add_node(c, nd) ? 1 : 0;
}

static int cb_null(void *u) { return on_scalar(u, TJ_NULL, false, NULL, 0); }
static int cb_bool(void *u, int b) { return on_scalar(u, TJ_BOOL, b != 0, NULL, 0); }
static int cb_num(void *u, const char *s, size_t n)
{
    return on_scalar(u, TJ_NUM, false, (const unsigned char *)s, n);
}
static int cb_str(void *u, const unsigned char *s, size_t n)
{
    return on_scalar(u, TJ_STR, false, s, n);
}

static int push(ctx_t *c, frame_t f)
{
    if (c->depth >= (int)(sizeof c->st / sizeof c->st[0])) {
        c->bad = true;
        snprintf(c->msg, sizeof c->msg, "JSON nested deeper than %zu",
                 sizeof c->st / sizeof c->st[0]);
        return 0;
    }
    c->st[c->depth++] = f;
    return 1;
}

/* Whether the container starting now is model.<name>. */
static bool model_member(ctx_t *c, const char *name)
{
    frame_t *f = top(c);
    return c->stream && f != NULL && f->kind == F_TREE && f->is_model && c->key != NULL &&
           strcmp(c->key, name) == 0;
}

static int start(ctx_t *c, int type)
{
    frame_t *f = top(c);
    if (f != NULL && f->kind == F_MERGES) {
        if (type != TJ_ARR) {
            c->bad = true;
            snprintf(c->msg, sizeof c->msg, "model: merges: entry %zu is not a pair",
                     c->doc->n_merges);
            return 0;
        }
        return push(c, (frame_t){.kind = F_PAIR});
    }
    if (f != NULL && f->kind != F_TREE) {
        c->bad = true;
        snprintf(c->msg, sizeof c->msg, "model: %s: unexpected nesting",
                 f->kind == F_VOCAB ? "vocab" : "merges");
        return 0;
    }
    if (type == TJ_OBJ && model_member(c, "vocab") && !c->doc->has_vocab) {
        free(c->key);
        c->key = NULL;
        c->doc->has_vocab = true;
        return push(c, (frame_t){.kind = F_VOCAB});
    }
    if (type == TJ_ARR && model_member(c, "merges") && !c->doc->has_merges) {
        free(c->key);
        c->key = NULL;
        c->doc->has_merges = true;
        return push(c, (frame_t){.kind = F_MERGES});
    }
    bool is_model =
        c->depth == 1 && type == TJ_OBJ && c->key != NULL && strcmp(c->key, "model") == 0;
    tj_node_t *nd = mk(type);
    if (!add_node(c, nd))
        return 0;
    return push(c, (frame_t){.kind = F_TREE, .node = nd, .is_model = is_model});
}

static int cb_start_map(void *u) { return start(u, TJ_OBJ); }
static int cb_start_arr(void *u) { return start(u, TJ_ARR); }

static int cb_key(void *u, const unsigned char *s, size_t n)
{
    ctx_t *c = u;
    frame_t *f = top(c);
    if (f->kind == F_VOCAB)
        return pool_add(c, s, n, &c->vkey) ? 1 : 0;
    free(c->key);
    c->key = kvr_tj_dup(s, n);
    c->key_len = n;
    if (c->key == NULL) {
        c->oom = true;
        return 0;
    }
    return 1;
}

static int cb_end(void *u)
{
    ctx_t *c = u;
    frame_t *f = top(c);
    if (f->kind == F_PAIR) {
        if (f->n_pair != 2) {
            c->bad = true;
            snprintf(c->msg, sizeof c->msg, "model: merges: entry %zu is not a pair",
                     c->doc->n_merges);
            return 0;
        }
        tj_doc_t *d = c->doc;
        if (kvr_grow((void **)&d->merge, &d->cap_merges, 2 * d->n_merges + 2, SIZE_MAX / 16,
                     sizeof *d->merge) != 0) {
            c->oom = true;
            return 0;
        }
        d->merge[2 * d->n_merges] = f->pair[0];
        d->merge[2 * d->n_merges + 1] = f->pair[1];
        d->n_merges++;
    }
    c->depth--;
    return 1;
}

static const yajl_callbacks callbacks = {
    cb_null,      cb_bool, NULL,   NULL,         cb_num, cb_str,
    cb_start_map, cb_key,  cb_end, cb_start_arr, cb_end,
};

int kvr_tj_parse(const char *buf, size_t len, bool stream_model, tj_doc_t *doc, char *err,
                 size_t err_len)
{
    memset(doc, 0, sizeof *doc);
    ctx_t c = {.doc = doc, .stream = stream_model};
    yajl_handle h = yajl_alloc(&callbacks, NULL, &c);
    if (h == NULL)
        return KVR_ENOMEM;
    yajl_status st = yajl_parse(h, (const unsigned char *)buf, len);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    int rc = KVR_OK;
    if (st != yajl_status_ok) {
        if (c.oom) {
            rc = KVR_ENOMEM;
            snprintf(err, err_len, "out of memory");
        } else if (c.bad) {
            rc = KVR_EPARSE;
            snprintf(err, err_len, "%s", c.msg);
        } else {
            rc = KVR_EPARSE;
            unsigned char *m = yajl_get_error(h, 0, NULL, 0);
            size_t at = yajl_get_bytes_consumed(h);
            snprintf(err, err_len, "invalid JSON near byte %zu: %s", at, m ? (const char *)m : "?");
            if (m)
                yajl_free_error(h, m);
        }
    } else if (doc->root == NULL) {
        rc = KVR_EPARSE;
        snprintf(err, err_len, "invalid JSON: empty");
    }
    free(c.key);
    yajl_free(h);
    if (rc != KVR_OK)
        kvr_tj_free(doc);
    return rc;
}
