/*
 * tok_impl.h: the tokenizer's private structures, shared by its files (not included from
 * outside src/tokenizer; the one public header is tokenizer.h).
 *
 * A kvr_tok_t is built once by tok_load.c from the parts below and never changes after;
 * every part is owned by it and freed with it. The scratch (kvr_tok_scratch_t) holds every
 * buffer encoding needs, grown to the largest input and reused.
 */
#ifndef KVR_TOK_IMPL_H
#define KVR_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/tokenizer.h"

/* ---- tok_json.c: tokenizer.json as a small tree, vocab and merges streamed flat ---------- */
enum { TJ_NULL, TJ_BOOL, TJ_NUM, TJ_STR, TJ_ARR, TJ_OBJ };
typedef struct tj_node {
    int type;
    bool b;
    char *s; /* TJ_STR, TJ_NUM (text), NUL-terminated */
    size_t len;
    size_t n;              /* TJ_ARR, TJ_OBJ: members */
    size_t cap;            /* room in kids (and keys) */
    char **keys;           /* TJ_OBJ */
    struct tj_node **kids; /* TJ_ARR, TJ_OBJ */
} tj_node_t;

typedef struct tj_str {
    uint32_t off, len; /* into tj_doc_t.pool */
} tj_str_t;

typedef struct tj_doc {
    tj_node_t *root; /* everything but model.vocab and model.merges */
    char *pool;      /* the streamed strings */
    size_t pool_len, pool_cap;
    tj_str_t *vocab_key;
    uint32_t *vocab_id;
    size_t n_vocab, cap_vocab;
    tj_str_t *merge; /* pairs: merge[2i], merge[2i+1] */
    size_t n_merges, cap_merges;
    bool has_vocab, has_merges;
} tj_doc_t;

/* Parses tokenizer.json (stream_model: vocab and merges streamed) or any JSON (tree only). */
int kvr_tj_parse(const char *buf, size_t len, bool stream_model, tj_doc_t *doc, char *err,
                 size_t err_len);
void kvr_tj_free(tj_doc_t *doc);
/* A NUL-terminated copy of s[0..n) (NULs inside kept), or NULL. */
char *kvr_tj_dup(const void *s, size_t n);
const tj_node_t *kvr_tj_get(const tj_node_t *obj, const char *key);
/* The object's keys not in allowed (NULL-terminated): the first such key, or NULL. */
const char *kvr_tj_unknown_key(const tj_node_t *obj, const char *const *allowed);

/* ---- tok_utf8.c ---------------------------------------------------------------------------- */
/* The length of the valid UTF-8 prefix of s. */
size_t kvr_tok_utf8_valid(const unsigned char *s, size_t n);
/* s with each maximal invalid subsequence replaced by U+FFFD, into out (room for 3n). */
size_t kvr_tok_utf8_lossy(const unsigned char *s, size_t n, unsigned char *out);
/* The code point at s (valid UTF-8), its length in *len. */
uint32_t kvr_tok_utf8_decode(const unsigned char *s, size_t *len);
bool kvr_tok_is_whitespace(uint32_t cp); /* Unicode White_Space, as Rust's char::is_whitespace */
/* GPT-2's byte-level alphabet: the code point standing for byte b, and back (-1: not one). */
uint32_t kvr_tok_byte_to_cp(unsigned b);
int kvr_tok_cp_to_byte(uint32_t cp);

/* ---- tok_normalize.c ----------------------------------------------------------------------- */
enum { NORM_NFC, NORM_REPLACE, NORM_PREPEND };
typedef struct tok_norm_step {
    int kind;
    char *a, *b; /* REPLACE: pattern a -> content b; PREPEND: a */
    size_t alen, blen;
} tok_norm_step_t;
typedef struct tok_norm {
    tok_norm_step_t *steps;
    size_t n;
} tok_norm_t;
int kvr_tok_norm_build(const tj_node_t *node, tok_norm_t *norm, char *err, size_t err_len);
void kvr_tok_norm_free(tok_norm_t *norm);
/* Normalizes s[0..n) into *out (grown, a pair of ping-pong buffers). KVR_OK or KVR_ENOMEM. */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf_t;
int kvr_tok_norm_run(const tok_norm_t *norm, const char *s, size_t n, tok_buf_t *out,
                     tok_buf_t *tmp);

/* ---- tok_pretok.c ---------------------------------------------------------------------------- */
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_PREV, SPLIT_NEXT, SPLIT_CONTIGUOUS };
typedef struct tok_split {
    pcre2_code *re; /* a regex, or NULL for a literal */
    char *lit;
    size_t lit_len;
    int behavior;
    int ascii_scan; /* the GPT-4-style pattern with \p{N} (1) or \p{N}{1,3} (3): matches on
                       ASCII text are found by hand (tok_pretok.c), 0: PCRE2 only */
} tok_split_t;
enum { MS_ALWAYS, MS_FIRST, MS_NEVER };
typedef struct tok_pretok {
    tok_split_t *splits;
    size_t n;
    bool byte_level; /* a ByteLevel pre-tokenizer: the model reads bytes */
    bool metaspace;  /* a Metaspace pre-tokenizer (the whole of it): spaces -> rep, rep first */
    int ms_prepend;  /* MS_* */
    char ms_rep[5];  /* the replacement character, UTF-8 */
    size_t ms_rep_len;
    size_t bytes;
} tok_pretok_t;
/* Metaspace's rewrite of one normalized piece s[0..n) into out: spaces replaced, the
 * replacement prepended as its scheme says (first: only for the piece at the text's start).
 * KVR_OK or KVR_ENOMEM. */
int kvr_tok_metaspace(const tok_pretok_t *pt, const char *s, size_t n, bool at_start,
                      tok_buf_t *out);
typedef struct tok_range {
    uint32_t off, len;
} tok_range_t;
int kvr_tok_pretok_build(const tj_node_t *node, tok_pretok_t *pt, char *err, size_t err_len);
void kvr_tok_pretok_free(tok_pretok_t *pt);
/* Splits s[0..n) into pieces: *out (ranges of s, grown) through *tmp. KVR_OK/KVR_ENOMEM. */
typedef struct tok_ranges {
    tok_range_t *r;
    size_t n, cap;
} tok_ranges_t;
int kvr_tok_pretok_run(const tok_pretok_t *pt, const char *s, size_t n, pcre2_match_data *md,
                       pcre2_match_context *mc, tok_ranges_t *out, tok_ranges_t *tmp);

/* ---- tok_bpe.c ---------------------------------------------------------------------------------
 */
typedef struct tok_vent { /* vocab: bytes -> id */
    uint32_t id1;         /* id + 1; 0 empty */
    uint32_t h;           /* the key's hash (low 32 bits) */
} tok_vent_t;
typedef struct tok_ment { /* merges: (a, b) -> (rank, new id) */
    uint32_t a, b;        /* a == UINT32_MAX: empty */
    uint32_t rank, id;
} tok_ment_t;
typedef struct tok_bpe {
    char *str; /* the tokens' bytes (byte-level keys decoded) */
    size_t str_len;
    uint32_t *off, *len; /* by id; len UINT32_MAX: no such id in the model */
    size_t n_ids;        /* max model id + 1 */
    tok_vent_t *vt;
    size_t vmask;
    tok_ment_t *mt;
    size_t mmask, n_merges;
    bool byte_level, byte_fallback, fuse_unk, ignore_merges;
    uint32_t unk;              /* UINT32_MAX: none */
    uint32_t byte_id[256];     /* byte-level: the id of each byte; UINT32_MAX none */
    uint32_t fallback_id[256]; /* byte_fallback: <0xNN>; UINT32_MAX none */
    char **raw_keys;           /* keys not in the byte-level alphabet (kept for token_id) */
    uint32_t *raw_ids;
    size_t n_raw;
} tok_bpe_t;
int kvr_tok_bpe_build(const tj_node_t *model, const tj_doc_t *doc, bool byte_level, tok_bpe_t *bpe,
                      char *err, size_t err_len);
void kvr_tok_bpe_free(tok_bpe_t *bpe);
/* The id of the bytes s[0..n), or UINT32_MAX. */
uint32_t kvr_tok_bpe_lookup(const tok_bpe_t *bpe, const char *s, size_t n);
/* The word cache of a scratch: a word's ids by its bytes, direct-mapped (tok_bpe.c). */
#define TOK_WC_WORD 23 /* bytes of a cached word at most */
#define TOK_WC_IDS 7   /* ids of a cached word at most */
#define TOK_WC_SLOTS 8192
typedef struct tok_wc_slot {
    uint32_t ids[TOK_WC_IDS];
    uint8_t len, n; /* len 0: empty */
    char word[TOK_WC_WORD];
} tok_wc_slot_t;
typedef struct tok_bpe_scratch {
    void *sym, *heap;
    size_t sym_cap, heap_cap;
    tok_wc_slot_t *wc;      /* TOK_WC_SLOTS, made on first use; NULL: none (out of memory) */
    const void *wc_owner;   /* the model the cached ids are of */
    uint64_t wc_hits, wc_misses;
} tok_bpe_scratch_t;
/* Appends the ids of the word s[0..n) through emit. KVR_OK or KVR_ENOMEM. */
typedef struct tok_sink {
    uint32_t *ids;
    size_t cap, n;
} tok_sink_t;
static inline void kvr_tok_emit(tok_sink_t *k, uint32_t id)
{
    if (k->n < k->cap)
        k->ids[k->n] = id;
    k->n++;
}
int kvr_tok_bpe_word(const tok_bpe_t *bpe, tok_bpe_scratch_t *sc, const char *s, size_t n,
                     tok_sink_t *out);
void kvr_tok_bpe_scratch_free(tok_bpe_scratch_t *sc);

/* ---- tok_added.c ----------------------------------------------------------------------------- */
typedef struct tok_added_tok {
    uint32_t id;
    char *content; /* as matched (normalized tokens: normalized content) */
    size_t len;
    bool lstrip, rstrip, single_word;
} tok_added_tok_t;
typedef struct tok_trie_node {
    uint32_t child; /* first child, 0 none */
    uint32_t sib;   /* next sibling, 0 none */
    int32_t tok;    /* index into toks, -1 none */
    uint8_t byte;
} tok_trie_node_t;
typedef struct tok_added {
    tok_added_tok_t *toks;
    size_t n, cap;
    tok_trie_node_t *nodes;
    size_t n_nodes;
    uint32_t root[256];  /* first level, 0 none */
    unsigned n_first;    /* distinct first bytes of the tokens */
    uint8_t first;       /* the last one added (the only one when n_first is 1) */
    pcre2_code *word_re; /* for single_word: [\p{Alphabetic}\p{N}] */
} tok_added_t;
int kvr_tok_added_add(tok_added_t *a, uint32_t id, const char *content, size_t len, bool lstrip,
                      bool rstrip, bool single_word);
void kvr_tok_added_free(tok_added_t *a);
/* The pieces of s[0..n): tokens (id) and text between (id UINT32_MAX). */
typedef struct tok_seg {
    uint32_t off, len, id;
} tok_seg_t;
typedef struct tok_segs {
    tok_seg_t *s;
    size_t n, cap;
} tok_segs_t;
int kvr_tok_added_split(const tok_added_t *a, const char *s, size_t n, pcre2_match_data *md,
                        tok_segs_t *out);

/* ---- tok_post.c ------------------------------------------------------------------------------ */
typedef struct tok_post {
    uint32_t *pre, *post; /* ids before and after the sequence with add_special */
    size_t n_pre, n_post;
} tok_post_t;
/* From post_processor (and the added tokens / vocab through lookup for the config rule). */
int kvr_tok_post_build(const tj_node_t *node, tok_post_t *post, char *err, size_t err_len);
int kvr_tok_post_config(tok_post_t *post, bool add_bos, uint32_t bos, bool add_eos, uint32_t eos);
void kvr_tok_post_free(tok_post_t *post);

/* ---- the tokenizer ------------------------------------------------------------------------- */
struct kvr_tok {
    tok_norm_t norm;
    tok_pretok_t pretok;
    tok_bpe_t bpe;
    tok_added_t added_raw;  /* normalized: false */
    tok_added_t added_norm; /* normalized: true */
    tok_post_t post;
    tok_added_tok_t *all_added; /* every added token as spelled (token_id) */
    size_t n_all_added;
    size_t vocab_size;
    char *bos, *eos;
    kvr_tok_scratch_t *scratch; /* kvr_tok_encode's */
};

/* ---- tok_segcache.c: the ids of long segments between raw added tokens, per scratch ----- */
#define TOK_SC_MIN_BYTES 64                     /* shorter segments are not worth a lookup */
#define TOK_SC_CHUNK 64                         /* ids a chunk of the store holds */
#define TOK_SC_DEFAULT_TOKENS ((size_t)1 << 20) /* the bound of a new scratch: 4 MiB of ids */
#define TOK_SC_MAX_CHUNKS (1u << 24)            /* indexes stay 32-bit */
typedef struct tok_sc_key {
    uint64_t lo, hi; /* XXH3-128 of the segment, seeded with its start flag */
    uint32_t len;    /* its bytes */
    bool ok;         /* a key was made (the segment is long enough and the cache on) */
} tok_sc_key_t;
typedef struct tok_sc_entry {
    uint64_t lo, hi;
    uint32_t len, n;     /* bytes of the segment; its ids (0: a free entry) */
    uint32_t chunk;      /* its first chunk */
    uint32_t hnext;      /* the next entry of its bucket (free: of the free list) */
    uint32_t prev, next; /* the LRU list, head the most recent */
} tok_sc_entry_t;
typedef struct tok_segcache {
    size_t cap_tokens;    /* the bound; below one chunk: off */
    uint32_t *ids;        /* n_chunks * TOK_SC_CHUNK ids; NULL until the first store */
    uint32_t *chunk_next; /* an entry's chunk chain, or the free list; NIL ends */
    tok_sc_entry_t *ent;  /* n_chunks entries */
    uint32_t *bucket;     /* mask + 1 chains */
    uint32_t n_chunks, mask, free_chunk, n_free, free_ent, head, tail, n_ent;
    uint64_t tokens;          /* ids held */
    const void *owner;        /* the tokenizer the ids are of */
    kvr_tok_cache_stats_t st; /* the counters (hits, misses, evictions, tokens_served) */
} tok_segcache_t;
/* Emits the cached ids of segment p[0..n) into k: true on a hit. Otherwise *key is what
 * kvr_tok_sc_put stores it under (key->ok false: not cacheable). */
bool kvr_tok_sc_get(tok_segcache_t *c, const void *owner, const char *p, size_t n, bool at_start,
                    tok_sink_t *k, tok_sc_key_t *key);
/* Keeps ids[0..nids) as the segment's of key, evicting the least recently used as needed
 * (nothing when key->ok is false, out of memory, or the segment needs over half the store). */
void kvr_tok_sc_put(tok_segcache_t *c, const void *owner, const tok_sc_key_t *key,
                    const uint32_t *ids, size_t nids);
void kvr_tok_sc_free(tok_segcache_t *c); /* the store freed; the bound and counters kept */
int kvr_tok_sc_verify(const tok_segcache_t *c, char *msg, size_t msg_len);

struct kvr_tok_scratch {
    tok_buf_t text, norm, tmp, meta;
    tok_segcache_t segs;
    tok_segs_t seg_raw, seg_norm;
    tok_ranges_t pieces, ptmp;
    tok_bpe_scratch_t bpe;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

#endif
