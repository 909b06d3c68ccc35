/*
 * tok_bpe.c: the BPE model as HF tokenizers runs it: a word's initial symbols (its bytes for a
 * byte-level vocabulary, else its characters, with byte_fallback's <0xNN> tokens and the unk
 * token, fused or not), then merges applied lowest rank first, leftmost on ties, through a
 * binary heap of candidate pairs whose stale entries are skipped exactly as HF's
 * Word::merge_all skips them; ignore_merges takes a word found whole in the vocabulary as is.
 *
 * Tables (instances of base/oatab.h, at most half full): the vocabulary, bytes -> id (an entry
 * is the id and the key's 32-bit hash; keys are compared in the id -> bytes table), and the
 * merges, (id a, id b) -> (rank, new id), the later of two equal pairs winning as in HF's map.
 * A byte-level vocabulary is stored decoded (GPT-2's alphabet back to bytes) so words are
 * matched as the raw bytes they are; keys outside that alphabet (e.g. DeepSeek's special
 * tokens) cannot come out of merges and are kept aside only for kvr_tok_token_id.
 * Word cache: a word's ids are a pure function of its bytes, so each scratch keeps the ids of
 * short words (<= TOK_WC_WORD bytes, <= TOK_WC_IDS ids) in a direct-mapped table of
 * TOK_WC_SLOTS slots (about 450 KiB, allocated on first use), as HF's BPE keeps a cache of
 * words: prose repeats its words, and a hit costs a hash and a compare instead of the merges.
 * Measured on 8K-token texts of English-like words with some CJK and Cyrillic (Qwen3, 50
 * texts through `kvrouter tokenize`): 2.0 ms an encoding without it, 1.7 ms with it (then 0.7
 * ms once NFC skipped the Latin runs, tok_normalize.c). A scratch used with another model
 * starts its cache afresh.
 * Ownership: the model owns its tables. Threads: read-only once built; the scratch is the
 * caller's. Cost: load O(vocab + merges); a word of n symbols O(n log n), no allocation once
 * the scratch holds the longest word (and its cache).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/grow.h"
#include "base/oatab.h"
#include "tokenizer/tok_impl.h"

#define NONE UINT32_MAX

static inline uint64_t vent_home(const tok_bpe_t *b, const tok_vent_t *e)
{
    (void)b;
    return kvr_mix64(e->h);
}
static inline bool vent_empty(const tok_vent_t *e) { return e->id1 == 0; }
static inline void vent_clear(tok_vent_t *e) { e->id1 = 0; }
#define VENT_HOME(c, e) vent_home(c, e)
#define VENT_EMPTY(e) vent_empty(e)
#define VENT_CLEAR(e) vent_clear(e)
KVR_OATAB_DEFINE(vtab, tok_bpe_t, tok_vent_t, VENT_HOME, VENT_EMPTY, VENT_CLEAR)

static inline uint64_t pair_key(uint32_t a, uint32_t b) { return ((uint64_t)a << 32) | b; }
static inline uint64_t ment_home(const tok_bpe_t *c, const tok_ment_t *e)
{
    (void)c;
    return kvr_mix64(pair_key(e->a, e->b));
}
static inline bool ment_empty(const tok_ment_t *e) { return e->a == NONE; }
static inline void ment_clear(tok_ment_t *e) { e->a = NONE; }
#define MENT_HOME(c, e) ment_home(c, e)
#define MENT_EMPTY(e) ment_empty(e)
#define MENT_CLEAR(e) ment_clear(e)
KVR_OATAB_DEFINE(mtab, tok_bpe_t, tok_ment_t, MENT_HOME, MENT_EMPTY, MENT_CLEAR)

static inline uint32_t hash32(const char *s, size_t n) { return (uint32_t)XXH3_64bits(s, n); }

uint32_t kvr_tok_bpe_lookup(const tok_bpe_t *bpe, const char *s, size_t n)
{
    uint32_t h = hash32(s, n);
    for (size_t i = kvr_mix64(h) & bpe->vmask; bpe->vt[i].id1 != 0; i = (i + 1) & bpe->vmask) {
        const tok_vent_t *e = &bpe->vt[i];
        uint32_t id = e->id1 - 1;
        if (e->h == h && bpe->len[id] == n && memcmp(bpe->str + bpe->off[id], s, n) == 0)
            return id;
    }
    return NONE;
}

static inline const tok_ment_t *merge_find(const tok_bpe_t *bpe, uint32_t a, uint32_t b)
{
    for (size_t i = kvr_mix64(pair_key(a, b)) & bpe->mmask; bpe->mt[i].a != NONE;
         i = (i + 1) & bpe->mmask)
        if (bpe->mt[i].a == a && bpe->mt[i].b == b)
            return &bpe->mt[i];
    return NULL;
}

/* A byte-level key decoded into out (room for n bytes): its length, or -1 when a character
 * is not in the alphabet. Plain keys are copied. */
static long decode_key(bool byte_level, const char *s, size_t n, char *out)
{
    if (!byte_level) {
        memcpy(out, s, n);
        return (long)n;
    }
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t l;
        if (kvr_tok_utf8_valid((const unsigned char *)s + i, (n - i) < 4 ? n - i : 4) == 0)
            return -1;
        uint32_t cp = kvr_tok_utf8_decode((const unsigned char *)s + i, &l);
        if (i + l > n)
            return -1;
        int b = kvr_tok_cp_to_byte(cp);
        if (b < 0)
            return -1;
        out[o++] = (char)b;
        i += l;
    }
    return (long)o;
}

static const char *const model_keys[] = {"type",
                                         "dropout",
                                         "unk_token",
                                         "continuing_subword_prefix",
                                         "end_of_word_suffix",
                                         "fuse_unk",
                                         "byte_fallback",
                                         "ignore_merges",
                                         NULL};

static bool flag(const tj_node_t *m, const char *k)
{
    const tj_node_t *v = kvr_tj_get(m, k);
    return v != NULL && v->type == TJ_BOOL && v->b;
}

static int check_model(const tj_node_t *m, const tj_doc_t *doc, char *err, size_t err_len)
{
    if (m == NULL || m->type != TJ_OBJ) {
        snprintf(err, err_len, "model: missing");
        return KVR_EPARSE;
    }
    const tj_node_t *type = kvr_tj_get(m, "type");
    if (type != NULL && (type->type != TJ_STR || strcmp(type->s, "BPE") != 0)) {
        snprintf(err, err_len, "model: type \"%.40s\" is not supported",
                 type->type == TJ_STR ? type->s : "?");
        return KVR_EPARSE;
    }
    if (kvr_tj_get(m, "vocab") != NULL || !doc->has_vocab) {
        snprintf(err, err_len, "model: BPE needs a vocab object (token: id)");
        return KVR_EPARSE;
    }
    if (kvr_tj_get(m, "merges") != NULL || !doc->has_merges) {
        snprintf(err, err_len, "model: BPE needs a merges array");
        return KVR_EPARSE;
    }
    const char *bad = kvr_tj_unknown_key(m, model_keys);
    if (bad != NULL) {
        snprintf(err, err_len, "model: option \"%.40s\" is not supported", bad);
        return KVR_EPARSE;
    }
    const tj_node_t *d = kvr_tj_get(m, "dropout");
    if (d != NULL && d->type != TJ_NULL) {
        snprintf(err, err_len, "model: dropout is not supported");
        return KVR_EPARSE;
    }
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        const tj_node_t *a = kvr_tj_get(m, affixes[i]);
        if (a != NULL && a->type != TJ_NULL && !(a->type == TJ_STR && a->len == 0)) {
            snprintf(err, err_len, "model: a non-empty %s is not supported", affixes[i]);
            return KVR_EPARSE;
        }
    }
    static const char *const flags[] = {"fuse_unk", "byte_fallback", "ignore_merges"};
    for (int i = 0; i < 3; i++) {
        const tj_node_t *a = kvr_tj_get(m, flags[i]);
        if (a != NULL && a->type != TJ_BOOL && a->type != TJ_NULL) {
            snprintf(err, err_len, "model: %s is not a boolean", flags[i]);
            return KVR_EPARSE;
        }
    }
    return KVR_OK;
}

static int add_raw(tok_bpe_t *bpe, const char *s, size_t n, uint32_t id)
{
    char **k = realloc(bpe->raw_keys, (bpe->n_raw + 1) * sizeof *k);
    if (k == NULL)
        return KVR_ENOMEM;
    bpe->raw_keys = k;
    uint32_t *ids = realloc(bpe->raw_ids, (bpe->n_raw + 1) * sizeof *ids);
    if (ids == NULL)
        return KVR_ENOMEM;
    bpe->raw_ids = ids;
    char *p = kvr_tj_dup(s, n);
    if (p == NULL)
        return KVR_ENOMEM;
    k[bpe->n_raw] = p;
    ids[bpe->n_raw++] = id;
    return KVR_OK;
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

static int build_vocab(tok_bpe_t *bpe, const tj_doc_t *doc)
{
    uint32_t max_id = 0;
    for (size_t i = 0; i < doc->n_vocab; i++)
        if (doc->vocab_id[i] > max_id)
            max_id = doc->vocab_id[i];
    bpe->n_ids = doc->n_vocab ? (size_t)max_id + 1 : 0;
    bpe->off = malloc((bpe->n_ids + 1) * sizeof *bpe->off);
    bpe->len = malloc((bpe->n_ids + 1) * sizeof *bpe->len);
    size_t total = 0;
    for (size_t i = 0; i < doc->n_vocab; i++)
        total += doc->vocab_key[i].len;
    bpe->str = malloc(total + 1);
    if (bpe->off == NULL || bpe->len == NULL || bpe->str == NULL)
        return KVR_ENOMEM;
    for (size_t i = 0; i < bpe->n_ids; i++)
        bpe->len[i] = NONE;
    size_t cap = pow2_at_least(2 * doc->n_vocab + 2);
    bpe->vmask = 0;
    if (vtab_rehash(bpe, &bpe->vt, &bpe->vmask, cap) != KVR_OK)
        return KVR_ENOMEM;
    size_t o = 0;
    for (size_t i = 0; i < doc->n_vocab; i++) {
        const char *k = doc->pool + doc->vocab_key[i].off;
        size_t kn = doc->vocab_key[i].len;
        uint32_t id = doc->vocab_id[i];
        long dn = decode_key(bpe->byte_level, k, kn, bpe->str + o);
        if (dn < 0) {
            if (add_raw(bpe, k, kn, id) != KVR_OK)
                return KVR_ENOMEM;
            continue;
        }
        uint32_t old = kvr_tok_bpe_lookup(bpe, bpe->str + o, (size_t)dn);
        bpe->off[id] = (uint32_t)o;
        bpe->len[id] = (uint32_t)dn;
        if (old != NONE) { /* the same key twice: the later id, as a map would keep */
            for (size_t j = kvr_mix64(hash32(bpe->str + o, (size_t)dn)) & bpe->vmask;;
                 j = (j + 1) & bpe->vmask)
                if (bpe->vt[j].id1 == old + 1) {
                    bpe->vt[j].id1 = id + 1;
                    break;
                }
        } else {
            uint32_t h = hash32(bpe->str + o, (size_t)dn);
            bpe->vt[vtab_free_slot(bpe->vt, bpe->vmask, kvr_mix64(h))] = (tok_vent_t){id + 1, h};
        }
        o += (size_t)dn;
    }
    bpe->str_len = o;
    return KVR_OK;
}

static int build_merges(tok_bpe_t *bpe, const tj_doc_t *doc, char *err, size_t err_len)
{
    size_t cap = pow2_at_least(2 * doc->n_merges + 2);
    bpe->mmask = 0;
    if (mtab_rehash(bpe, &bpe->mt, &bpe->mmask, cap) != KVR_OK)
        return KVR_ENOMEM;
    char *buf = NULL;
    size_t buf_cap = 0;
    int rc = KVR_OK;
    for (size_t i = 0; i < doc->n_merges && rc == KVR_OK; i++) {
        const tj_str_t *a = &doc->merge[2 * i], *b = &doc->merge[2 * i + 1];
        if (kvr_grow((void **)&buf, &buf_cap, a->len + b->len + 1, SIZE_MAX / 2, 1) != KVR_OK) {
            rc = KVR_ENOMEM;
            break;
        }
        long an = decode_key(bpe->byte_level, doc->pool + a->off, a->len, buf);
        long bn = an < 0 ? -1 : decode_key(bpe->byte_level, doc->pool + b->off, b->len, buf + an);
        uint32_t ia = an < 0 ? NONE : kvr_tok_bpe_lookup(bpe, buf, (size_t)an);
        uint32_t ib = bn < 0 ? NONE : kvr_tok_bpe_lookup(bpe, buf + an, (size_t)bn);
        uint32_t in =
            ia == NONE || ib == NONE ? NONE : kvr_tok_bpe_lookup(bpe, buf, (size_t)(an + bn));
        if (in == NONE) {
            const tj_str_t *miss = ia == NONE ? a : ib == NONE ? b : NULL;
            if (miss != NULL)
                snprintf(err, err_len,
                         "model: merges: entry %zu: token \"%.*s\" is not in the vocabulary", i,
                         (int)(miss->len > 60 ? 60 : miss->len), doc->pool + miss->off);
            else
                snprintf(err, err_len,
                         "model: merges: entry %zu: the merged token is not in the vocabulary", i);
            rc = KVR_EPARSE;
            break;
        }
        tok_ment_t *e = (tok_ment_t *)merge_find(bpe, ia, ib);
        if (e != NULL) {
            e->rank = (uint32_t)i;
            e->id = in;
        } else {
            bpe->mt[mtab_free_slot(bpe->mt, bpe->mmask, kvr_mix64(pair_key(ia, ib)))] =
                (tok_ment_t){ia, ib, (uint32_t)i, in};
            bpe->n_merges++;
        }
    }
    free(buf);
    return rc;
}

int kvr_tok_bpe_build(const tj_node_t *model, const tj_doc_t *doc, bool byte_level, tok_bpe_t *bpe,
                      char *err, size_t err_len)
{
    memset(bpe, 0, sizeof *bpe);
    int rc = check_model(model, doc, err, err_len);
    if (rc != KVR_OK)
        return rc;
    bpe->byte_level = byte_level;
    bpe->byte_fallback = flag(model, "byte_fallback");
    bpe->fuse_unk = flag(model, "fuse_unk");
    bpe->ignore_merges = flag(model, "ignore_merges");
    bpe->unk = NONE;
    rc = build_vocab(bpe, doc);
    if (rc == KVR_OK)
        rc = build_merges(bpe, doc, err, err_len);
    if (rc == KVR_ENOMEM)
        snprintf(err, err_len, "out of memory");
    if (rc != KVR_OK) {
        kvr_tok_bpe_free(bpe);
        return rc;
    }
    for (unsigned b = 0; b < 256; b++) {
        char c = (char)b, hex[8];
        bpe->byte_id[b] = byte_level ? kvr_tok_bpe_lookup(bpe, &c, 1) : NONE;
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        bpe->fallback_id[b] = kvr_tok_bpe_lookup(bpe, hex, 6);
    }
    const tj_node_t *unk = kvr_tj_get(model, "unk_token");
    if (unk != NULL && unk->type == TJ_STR) {
        char *tmp = malloc(unk->len + 1);
        long dn = tmp ? decode_key(byte_level, unk->s, unk->len, tmp) : -1;
        bpe->unk = dn < 0 ? NONE : kvr_tok_bpe_lookup(bpe, tmp, (size_t)dn);
        free(tmp);
        for (size_t i = 0; bpe->unk == NONE && i < bpe->n_raw; i++)
            if (strcmp(bpe->raw_keys[i], unk->s) == 0)
                bpe->unk = bpe->raw_ids[i];
        if (bpe->unk == NONE) {
            snprintf(err, err_len, "model: unk_token \"%.40s\" is not in the vocabulary", unk->s);
            kvr_tok_bpe_free(bpe);
            return KVR_EPARSE;
        }
    } else if (unk != NULL && unk->type != TJ_NULL) {
        snprintf(err, err_len, "model: unk_token is not a string");
        kvr_tok_bpe_free(bpe);
        return KVR_EPARSE;
    }
    return KVR_OK;
}

void kvr_tok_bpe_free(tok_bpe_t *bpe)
{
    free(bpe->str);
    free(bpe->off);
    free(bpe->len);
    free(bpe->vt);
    free(bpe->mt);
    for (size_t i = 0; i < bpe->n_raw; i++)
        free(bpe->raw_keys[i]);
    free(bpe->raw_keys);
    free(bpe->raw_ids);
    memset(bpe, 0, sizeof *bpe);
}

void kvr_tok_bpe_scratch_free(tok_bpe_scratch_t *sc)
{
    free(sc->sym);
    free(sc->heap);
    free(sc->wc);
    memset(sc, 0, sizeof *sc);
}

typedef struct sym {
    uint32_t id;
    int32_t prev, next;
    uint32_t len; /* 0: merged away */
} sym_t;

typedef struct hent {
    uint32_t rank, pos, id;
} hent_t;

static inline bool hless(const hent_t *a, const hent_t *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void hpush(hent_t *h, size_t *n, hent_t e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!hless(&e, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static hent_t hpop(hent_t *h, size_t *n)
{
    hent_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && hless(&h[c + 1], &h[c]))
            c++;
        if (!hless(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

static int bpe_word(const tok_bpe_t *bpe, tok_bpe_scratch_t *sc, const char *s, size_t n,
                    tok_sink_t *out);

/* A short word (1 to TOK_WC_WORD bytes) as three lanes that together cover each of its bytes
 * without reading past them (overlapping 8-, 4- or 1-byte loads, as XXH3 reads short keys):
 * two words of one length are equal exactly when their lanes are. The cache hashes and
 * compares the lanes inline: a call to XXH3 and one to memcmp cost more than the rest of a
 * cached word (measured: 8K-token chats, Qwen3, 10% of an encoding). */
typedef struct wc_key {
    uint64_t l[3];
} wc_key_t;

static inline uint64_t ld64(const char *s)
{
    uint64_t v;
    memcpy(&v, s, 8);
    return v;
}

static inline uint32_t ld32(const char *s)
{
    uint32_t v;
    memcpy(&v, s, 4);
    return v;
}

_Static_assert(TOK_WC_WORD <= 24, "three lanes cover a cached word");

static inline wc_key_t wc_key(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n >= 8)
        return (wc_key_t){{ld64(s), n > 16 ? ld64(s + 8) : 0, ld64(s + n - 8)}};
    if (n >= 4)
        return (wc_key_t){{ld32(s), 0, ld32(s + n - 4)}};
    return (wc_key_t){{(uint64_t)u[0] | (uint64_t)u[n >> 1] << 8 | (uint64_t)u[n - 1] << 16, 0, 0}};
}

static inline size_t wc_home(wc_key_t k, size_t n)
{
    uint64_t h = (k.l[0] ^ n) * 0x9E3779B97F4A7C15ull;
    h = (h ^ (h >> 29) ^ k.l[1]) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 32) ^ k.l[2]) * 0x94D049BB133111EBull;
    return (size_t)(h >> 40) & (TOK_WC_SLOTS - 1);
}

/* The cache slot of a short word (the cache made or reset as needed); NULL: not cached. */
static tok_wc_slot_t *wc_slot(const tok_bpe_t *bpe, tok_bpe_scratch_t *sc, size_t n, wc_key_t k)
{
    if (n > TOK_WC_WORD)
        return NULL;
    if (sc->wc == NULL || sc->wc_owner != bpe) {
        if (sc->wc == NULL && (sc->wc = malloc(TOK_WC_SLOTS * sizeof *sc->wc)) == NULL)
            return NULL;
        for (size_t i = 0; i < TOK_WC_SLOTS; i++)
            sc->wc[i].len = 0;
        sc->wc_owner = bpe;
    }
    return &sc->wc[wc_home(k, n)];
}

static inline bool wc_holds(const tok_wc_slot_t *w, size_t n, wc_key_t k)
{
    if (w->len != n)
        return false;
    wc_key_t o = wc_key(w->word, n);
    return ((o.l[0] ^ k.l[0]) | (o.l[1] ^ k.l[1]) | (o.l[2] ^ k.l[2])) == 0;
}

int kvr_tok_bpe_word(const tok_bpe_t *bpe, tok_bpe_scratch_t *sc, const char *s, size_t n,
                     tok_sink_t *out)
{
    if (n == 0)
        return KVR_OK;
    wc_key_t k = n <= TOK_WC_WORD ? wc_key(s, n) : (wc_key_t){{0, 0, 0}};
    tok_wc_slot_t *w = wc_slot(bpe, sc, n, k);
    if (w != NULL && wc_holds(w, n, k)) {
        sc->wc_hits++;
        for (uint8_t i = 0; i < w->n; i++)
            kvr_tok_emit(out, w->ids[i]);
        return KVR_OK;
    }
    size_t before = out->n;
    int rc = bpe_word(bpe, sc, s, n, out);
    size_t made = out->n - before;
    if (w != NULL && rc == KVR_OK && made <= TOK_WC_IDS && out->n <= out->cap) {
        sc->wc_misses++;
        memcpy(w->word, s, n);
        memcpy(w->ids, out->ids + before, made * sizeof *w->ids);
        w->len = (uint8_t)n;
        w->n = (uint8_t)made;
    }
    return rc;
}

/* One word through the merges (no cache). */
static int bpe_word(const tok_bpe_t *bpe, tok_bpe_scratch_t *sc, const char *s, size_t n,
                    tok_sink_t *out)
{
    if (bpe->ignore_merges) {
        uint32_t id = kvr_tok_bpe_lookup(bpe, s, n);
        if (id != NONE) {
            kvr_tok_emit(out, id);
            return KVR_OK;
        }
    }
    /* at most n symbols; the heap holds at most n - 1 + 2 per merge < 3n entries */
    if (kvr_grow(&sc->sym, &sc->sym_cap, n, SIZE_MAX / 64, sizeof(sym_t)) != KVR_OK ||
        kvr_grow(&sc->heap, &sc->heap_cap, 3 * n + 1, SIZE_MAX / 64, sizeof(hent_t)) != KVR_OK)
        return KVR_ENOMEM;
    sym_t *sy = sc->sym;
    size_t ns = 0;
    uint32_t unk_len = 0; /* a pending unk (fuse_unk gathers a run) */
#define ADD(ID, LEN)                                                     \
    do {                                                                 \
        sy[ns] = (sym_t){(ID), (int32_t)ns - 1, (int32_t)ns + 1, (LEN)}; \
        ns++;                                                            \
    } while (0)
    for (size_t i = 0; i < n;) {
        size_t l = 1;
        uint32_t id;
        if (bpe->byte_level) {
            id = bpe->byte_id[(unsigned char)s[i]];
        } else {
            (void)kvr_tok_utf8_decode((const unsigned char *)s + i, &l);
            if (i + l > n)
                l = n - i;
            id = kvr_tok_bpe_lookup(bpe, s + i, l);
        }
        if (id != NONE) {
            if (unk_len) {
                ADD(bpe->unk, unk_len);
                unk_len = 0;
            }
            ADD(id, (uint32_t)l);
        } else {
            bool done = false;
            if (bpe->byte_fallback) {
                size_t k = 0;
                while (k < l && bpe->fallback_id[(unsigned char)s[i + k]] != NONE)
                    k++;
                if (k == l) { /* as HF: a pending unk is not flushed first */
                    for (k = 0; k < l; k++)
                        ADD(bpe->fallback_id[(unsigned char)s[i + k]], 1);
                    done = true;
                }
            }
            if (!done && bpe->unk != NONE) {
                if (unk_len && !bpe->fuse_unk) {
                    ADD(bpe->unk, unk_len);
                    unk_len = 0;
                }
                unk_len += (uint32_t)l;
            }
        }
        i += l;
    }
    if (unk_len)
        ADD(bpe->unk, unk_len);
#undef ADD
    if (ns == 0)
        return KVR_OK;
    sy[ns - 1].next = -1;
    hent_t *h = sc->heap;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
        const tok_ment_t *m = merge_find(bpe, sy[i].id, sy[i + 1].id);
        if (m != NULL)
            hpush(h, &nh, (hent_t){m->rank, (uint32_t)i, m->id});
    }
    while (nh > 0) {
        hent_t top = hpop(h, &nh);
        sym_t *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        sym_t *right = &sy[cur->next];
        const tok_ment_t *m = merge_find(bpe, cur->id, right->id);
        if (m == NULL || m->id != top.id)
            continue;
        cur->id = top.id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0)
            sy[cur->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const tok_ment_t *pm = merge_find(bpe, sy[cur->prev].id, cur->id);
            if (pm != NULL)
                hpush(h, &nh, (hent_t){pm->rank, (uint32_t)cur->prev, pm->id});
        }
        if (cur->next >= 0) {
            const tok_ment_t *nm = merge_find(bpe, cur->id, sy[cur->next].id);
            if (nm != NULL)
                hpush(h, &nh, (hent_t){nm->rank, top.pos, nm->id});
        }
    }
    for (size_t i = 0; i < ns; i++)
        if (sy[i].len != 0)
            kvr_tok_emit(out, sy[i].id);
    return KVR_OK;
}
