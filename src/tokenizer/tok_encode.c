/*
 * tok_encode.c: text -> ids, the pipeline HF tokenizers runs for one sequence: UTF-8 repaired
 * (each maximal invalid subsequence -> U+FFFD), added tokens with normalized false cut out of
 * the raw text, each piece between normalized and cut again by the normalized added tokens,
 * each remaining piece pre-tokenized and each pre-token through the BPE model; then the
 * post-processor's specials around it when add_special.
 *
 * Invariants: the ids are written in order, never more than cap; *n counts them all.
 * Ownership: the scratch owns every buffer (grown to the largest input, kept); the text and
 * ids are the caller's. Threads: one scratch per thread; the tokenizer is shared read-only.
 * Cost: O(n log n) in the text; a piece between raw added tokens that the scratch's segment
 * cache holds (tok_segcache.c) costs a hash of its bytes and a copy of its ids; allocations
 * only while a buffer grows (and the cache's store, once).
 */
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "tokenizer/tok_impl.h"

#define NONE UINT32_MAX

kvr_tok_scratch_t *kvr_tok_scratch_new(const kvr_tok_t *t)
{
    (void)t;
    kvr_tok_scratch_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->md = pcre2_match_data_create(16, NULL);
    s->mc = pcre2_match_context_create(NULL);
    s->js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
    if (s->md == NULL || s->mc == NULL || s->js == NULL) {
        kvr_tok_scratch_free(s);
        return NULL;
    }
    pcre2_jit_stack_assign(s->mc, NULL, s->js);
    s->segs.cap_tokens = TOK_SC_DEFAULT_TOKENS; /* the store is made at the first store */
    return s;
}

void kvr_tok_scratch_free(kvr_tok_scratch_t *s)
{
    if (s == NULL)
        return;
    free(s->text.p);
    free(s->norm.p);
    free(s->tmp.p);
    free(s->meta.p);
    kvr_tok_sc_free(&s->segs);
    free(s->seg_raw.s);
    free(s->seg_norm.s);
    free(s->pieces.r);
    free(s->ptmp.r);
    kvr_tok_bpe_scratch_free(&s->bpe);
    pcre2_match_data_free(s->md);
    pcre2_match_context_free(s->mc);
    pcre2_jit_stack_free(s->js);
    free(s);
}

/* A piece of text between raw added tokens (at_start: it begins the text): normalized, cut by
 * the normalized added tokens, pre-tokenized (Metaspace's rewrite first), through the model. */
static int piece_ids(const kvr_tok_t *t, kvr_tok_scratch_t *sc, const char *p, size_t n,
                     bool at_start, tok_sink_t *k);

/* A piece through the segment cache (tok_segcache.c): its ids found, or made and kept. */
static int piece(const kvr_tok_t *t, kvr_tok_scratch_t *sc, const char *p, size_t n,
                 bool at_start, tok_sink_t *k)
{
    tok_sc_key_t key;
    if (kvr_tok_sc_get(&sc->segs, t, p, n, at_start, k, &key))
        return KVR_OK;
    size_t before = k->n;
    int rc = piece_ids(t, sc, p, n, at_start, k);
    if (rc == KVR_OK && k->n <= k->cap)
        kvr_tok_sc_put(&sc->segs, t, &key, k->ids + before, k->n - before);
    return rc;
}

static int piece_ids(const kvr_tok_t *t, kvr_tok_scratch_t *sc, const char *p, size_t n,
                     bool at_start, tok_sink_t *k)
{
    int rc = kvr_tok_norm_run(&t->norm, p, n, &sc->norm, &sc->tmp);
    if (rc != KVR_OK)
        return rc;
    const char *s = sc->norm.p;
    rc = kvr_tok_added_split(&t->added_norm, s, sc->norm.len, sc->md, &sc->seg_norm);
    if (rc != KVR_OK)
        return rc;
    for (size_t i = 0; i < sc->seg_norm.n; i++) {
        const tok_seg_t *g = &sc->seg_norm.s[i];
        if (g->id != NONE) {
            kvr_tok_emit(k, g->id);
            continue;
        }
        const char *w = s + g->off;
        size_t wn = g->len;
        if (t->pretok.metaspace) {
            rc = kvr_tok_metaspace(&t->pretok, w, wn, at_start && g->off == 0, &sc->meta);
            if (rc != KVR_OK)
                return rc;
            w = sc->meta.p;
            wn = sc->meta.len;
        }
        rc = kvr_tok_pretok_run(&t->pretok, w, wn, sc->md, sc->mc, &sc->pieces, &sc->ptmp);
        if (rc != KVR_OK)
            return rc;
        for (size_t j = 0; j < sc->pieces.n; j++) {
            const tok_range_t *r = &sc->pieces.r[j];
            rc = kvr_tok_bpe_word(&t->bpe, &sc->bpe, w + r->off, r->len, k);
            if (rc != KVR_OK)
                return rc;
        }
    }
    return KVR_OK;
}

int kvr_tok_encode_r(const kvr_tok_t *t, kvr_tok_scratch_t *sc, const char *text, size_t len,
                     bool add_special, uint32_t *ids, size_t cap, size_t *n)
{
    *n = 0;
    if (len > (size_t)INT32_MAX / 4) /* repaired text (x3) and piece lengths must fit 31 bits */
        return KVR_ETOOBIG;
    tok_sink_t k = {ids, cap, 0};
    if (add_special)
        for (size_t i = 0; i < t->post.n_pre; i++)
            kvr_tok_emit(&k, t->post.pre[i]);
    const char *s = text;
    size_t sn = len;
    if (kvr_tok_utf8_valid((const unsigned char *)text, len) != len) {
        if (kvr_grow((void **)&sc->text.p, &sc->text.cap, 3 * len + 1, SIZE_MAX / 4, 1) != KVR_OK)
            return KVR_ENOMEM;
        sn = kvr_tok_utf8_lossy((const unsigned char *)text, len, (unsigned char *)sc->text.p);
        s = sc->text.p;
    }
    int rc = kvr_tok_added_split(&t->added_raw, s, sn, sc->md, &sc->seg_raw);
    for (size_t i = 0; rc == KVR_OK && i < sc->seg_raw.n; i++) {
        const tok_seg_t *g = &sc->seg_raw.s[i];
        if (g->id != NONE)
            kvr_tok_emit(&k, g->id);
        else
            rc = piece(t, sc, s + g->off, g->len, g->off == 0, &k);
    }
    if (rc != KVR_OK)
        return rc;
    if (add_special)
        for (size_t i = 0; i < t->post.n_post; i++)
            kvr_tok_emit(&k, t->post.post[i]);
    *n = k.n;
    return k.n > cap ? KVR_ETOOBIG : KVR_OK;
}

int kvr_tok_encode(const kvr_tok_t *t, const char *text, size_t len, bool add_special,
                   uint32_t *ids, size_t cap, size_t *n)
{
    return kvr_tok_encode_r(t, t->scratch, text, len, add_special, ids, cap, n);
}
