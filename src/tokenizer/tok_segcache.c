/*
 * tok_segcache.c: the segment cache of a scratch (tok_impl.h). HF tokenizers cuts a text at
 * its added tokens first (before the normalizer, the pre-tokenizer and the model) and encodes
 * each segment between them on its own, so a segment's ids depend only on its bytes and on
 * whether it starts the text (Metaspace's "first" scheme). A chat template puts special tokens
 * around every message, and a chat client sends the whole history every turn: a turn's prompt
 * is the previous turn's segments plus new ones, and with this cache only the new ones are
 * encoded. Segments shorter than TOK_SC_MIN_BYTES are encoded every time (a lookup would cost
 * about as much).
 *
 * Structure: entries keyed by the XXH3-128 of the segment (seeded with its start flag) and its
 * length, chained from a power-of-two bucket array, on one LRU list; their ids in a store of
 * fixed chunks of TOK_SC_CHUNK ids, chained per entry. The bound is in tokens (the store's
 * chunks, a segment's last chunk partly used): storing a segment evicts the least recently
 * used entries until it fits; a segment needing more than half the store is not kept (it
 * would flush the rest). Entries <= chunks, so an entry is always free when its chunks are.
 * Invariants (kvr_tok_sc_verify): each entry in use is on the LRU list once and in its
 * bucket's chain once, with ceil(n / TOK_SC_CHUNK) chunks chained from e->chunk; chunks in use
 * plus the free list are the whole store; tokens and entries count what is held; every entry
 * is of the tokenizer `owner` (a scratch used with another tokenizer starts empty, its entries
 * counted as evicted). Exactness: an entry holds the ids encoding gave its segment (the caller
 * stores only a segment whose ids all fitted its buffer); a wrong hit would need an XXH3-128
 * collision between two segments of the same length.
 * Debug builds assert them every 64th store; tests call kvr_tok_scratch_verify after each.
 * Ownership: the scratch's; the store, the entries and the buckets are allocated together at
 * the first store, at the bound, and never grow (no allocation after). Threads: the scratch's
 * (one at a time). Cost: a lookup is one XXH3-128 of the segment (~3 us for a 40 KB message)
 * and a walk of a chain of about one entry; a hit copies its ids; a store copies them and
 * returns the evicted entries' chunks to the free list.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

#include "base/verify.h"
#include "tokenizer/tok_impl.h"

#define NIL UINT32_MAX

static uint32_t chunks_for(uint32_t n) { return (n + TOK_SC_CHUNK - 1) / TOK_SC_CHUNK; }

/* Everything free: the chunks and the entries on their free lists, the buckets empty. */
static void empty(tok_segcache_t *c)
{
    for (uint32_t i = 0; i < c->n_chunks; i++) {
        c->chunk_next[i] = i + 1 < c->n_chunks ? i + 1 : NIL;
        c->ent[i].hnext = i + 1 < c->n_chunks ? i + 1 : NIL;
        c->ent[i].n = 0;
    }
    memset(c->bucket, 0xff, ((size_t)c->mask + 1) * sizeof *c->bucket);
    c->free_chunk = c->n_chunks ? 0 : NIL;
    c->free_ent = c->n_chunks ? 0 : NIL;
    c->n_free = c->n_chunks;
    c->head = c->tail = NIL;
    c->n_ent = 0;
    c->tokens = 0;
}

void kvr_tok_sc_free(tok_segcache_t *c)
{
    free(c->ids);
    free(c->chunk_next);
    free(c->ent);
    free(c->bucket);
    c->ids = NULL;
    c->chunk_next = NULL;
    c->ent = NULL;
    c->bucket = NULL;
    c->n_chunks = c->mask = 0;
    c->n_ent = 0;
    c->tokens = 0;
    c->head = c->tail = NIL;
    c->owner = NULL;
}

/* The store ready for owner's segments: made at the bound (make), or emptied when it held
 * another tokenizer's. False when off, not made yet (and !make), or out of memory. */
static bool ready(tok_segcache_t *c, const void *owner, bool make)
{
    if (c->ids == NULL) {
        uint32_t nc = (uint32_t)(c->cap_tokens / TOK_SC_CHUNK);
        if (!make || nc == 0)
            return false;
        uint32_t nb = 1;
        while (nb < 2 * nc)
            nb <<= 1;
        c->ids = malloc((size_t)nc * TOK_SC_CHUNK * sizeof *c->ids);
        c->chunk_next = malloc((size_t)nc * sizeof *c->chunk_next);
        c->ent = malloc((size_t)nc * sizeof *c->ent);
        c->bucket = malloc((size_t)nb * sizeof *c->bucket);
        if (c->ids == NULL || c->chunk_next == NULL || c->ent == NULL || c->bucket == NULL) {
            kvr_tok_sc_free(c);
            return false;
        }
        c->n_chunks = nc;
        c->mask = nb - 1;
        empty(c);
        c->owner = owner;
    }
    if (c->owner != owner) {
        c->st.evictions += c->n_ent;
        empty(c);
        c->owner = owner;
    }
    return true;
}

static uint32_t *bucket_of(tok_segcache_t *c, const tok_sc_key_t *k)
{
    return &c->bucket[k->lo & c->mask];
}

static uint32_t find(tok_segcache_t *c, const tok_sc_key_t *k)
{
    for (uint32_t i = *bucket_of(c, k); i != NIL; i = c->ent[i].hnext) {
        const tok_sc_entry_t *e = &c->ent[i];
        if (e->lo == k->lo && e->hi == k->hi && e->len == k->len)
            return i;
    }
    return NIL;
}

static void lru_unlink(tok_segcache_t *c, uint32_t i)
{
    tok_sc_entry_t *e = &c->ent[i];
    if (e->prev != NIL)
        c->ent[e->prev].next = e->next;
    else
        c->head = e->next;
    if (e->next != NIL)
        c->ent[e->next].prev = e->prev;
    else
        c->tail = e->prev;
}

static void lru_front(tok_segcache_t *c, uint32_t i)
{
    tok_sc_entry_t *e = &c->ent[i];
    e->prev = NIL;
    e->next = c->head;
    if (c->head != NIL)
        c->ent[c->head].prev = i;
    c->head = i;
    if (c->tail == NIL)
        c->tail = i;
}

/* The least recently used entry dropped: its chunks and itself back on the free lists. */
static void evict_tail(tok_segcache_t *c)
{
    uint32_t i = c->tail;
    tok_sc_entry_t *e = &c->ent[i];
    tok_sc_key_t k = {e->lo, e->hi, e->len, true};
    uint32_t *link = bucket_of(c, &k);
    while (*link != i)
        link = &c->ent[*link].hnext;
    *link = e->hnext;
    lru_unlink(c, i);
    uint32_t nc = chunks_for(e->n), last = e->chunk;
    for (uint32_t j = 1; j < nc; j++)
        last = c->chunk_next[last];
    c->chunk_next[last] = c->free_chunk;
    c->free_chunk = e->chunk;
    c->n_free += nc;
    c->tokens -= e->n;
    c->n_ent--;
    e->n = 0;
    e->hnext = c->free_ent;
    c->free_ent = i;
    c->st.evictions++;
}

bool kvr_tok_sc_get(tok_segcache_t *c, const void *owner, const char *p, size_t n, bool at_start,
                    tok_sink_t *k, tok_sc_key_t *key)
{
    key->ok = false;
    if (n < TOK_SC_MIN_BYTES || n > UINT32_MAX || c->cap_tokens < TOK_SC_CHUNK)
        return false;
    XXH128_hash_t h = XXH3_128bits_withSeed(p, n, at_start ? 1 : 0);
    *key = (tok_sc_key_t){h.low64, h.high64, (uint32_t)n, true};
    uint32_t i = ready(c, owner, false) ? find(c, key) : NIL;
    if (i == NIL) {
        c->st.misses++;
        return false;
    }
    if (c->head != i) {
        lru_unlink(c, i);
        lru_front(c, i);
    }
    const tok_sc_entry_t *e = &c->ent[i];
    uint32_t ch = e->chunk;
    for (uint32_t left = e->n; left > 0; ch = c->chunk_next[ch]) {
        uint32_t m = left < TOK_SC_CHUNK ? left : TOK_SC_CHUNK;
        const uint32_t *src = c->ids + (size_t)ch * TOK_SC_CHUNK;
        if (k->n + m <= k->cap)
            memcpy(k->ids + k->n, src, m * sizeof *src);
        else
            for (uint32_t j = 0; j < m; j++)
                if (k->n + j < k->cap)
                    k->ids[k->n + j] = src[j];
        k->n += m;
        left -= m;
    }
    c->st.hits++;
    c->st.tokens_served += e->n;
    return true;
}

void kvr_tok_sc_put(tok_segcache_t *c, const void *owner, const tok_sc_key_t *key,
                    const uint32_t *ids, size_t nids)
{
    if (!key->ok || nids == 0 || nids > UINT32_MAX || !ready(c, owner, true))
        return;
    uint32_t need = chunks_for((uint32_t)nids);
    if (need > c->n_chunks / 2 || find(c, key) != NIL)
        return;
    while (c->n_free < need)
        evict_tail(c);
    uint32_t i = c->free_ent;
    tok_sc_entry_t *e = &c->ent[i];
    c->free_ent = e->hnext;
    *e = (tok_sc_entry_t){
        .lo = key->lo, .hi = key->hi, .len = key->len, .n = (uint32_t)nids, .chunk = c->free_chunk};
    uint32_t ch = c->free_chunk, last = ch;
    for (size_t done = 0; done < nids; done += TOK_SC_CHUNK) {
        size_t m = nids - done < TOK_SC_CHUNK ? nids - done : TOK_SC_CHUNK;
        memcpy(c->ids + (size_t)ch * TOK_SC_CHUNK, ids + done, m * sizeof *ids);
        last = ch;
        ch = c->chunk_next[ch];
    }
    c->free_chunk = c->chunk_next[last];
    c->chunk_next[last] = NIL;
    c->n_free -= need;
    uint32_t *b = bucket_of(c, key);
    e->hnext = *b;
    *b = i;
    lru_front(c, i);
    c->n_ent++;
    c->tokens += nids;
    /* debug builds: the invariants, every 64th store (a check walks the whole store) */
    assert((c->st.misses & 63) != 0 || kvr_tok_sc_verify(c, NULL, 0) == KVR_OK);
}

int kvr_tok_sc_verify(const tok_segcache_t *c, char *msg, size_t msg_len)
{
    if (c->ids == NULL) {
        if (c->n_ent != 0 || c->tokens != 0 || c->head != NIL || c->tail != NIL)
            KVR_VERIFY_FAIL("no store, yet %u entries and %llu tokens", c->n_ent,
                            (unsigned long long)c->tokens);
        return KVR_OK;
    }
    uint64_t tokens = 0, used = 0;
    uint32_t n = 0, prev = NIL;
    for (uint32_t i = c->head; i != NIL; prev = i, i = c->ent[i].next) {
        const tok_sc_entry_t *e = &c->ent[i];
        if (i >= c->n_chunks || ++n > c->n_ent)
            KVR_VERIFY_FAIL("the LRU list is longer than its %u entries or leaves the table",
                            c->n_ent);
        if (e->prev != prev)
            KVR_VERIFY_FAIL("entry %u: prev %u, the list says %u", i, e->prev, prev);
        if (e->n == 0)
            KVR_VERIFY_FAIL("entry %u on the list holds no ids", i);
        tok_sc_key_t k = {e->lo, e->hi, e->len, true};
        uint32_t j = c->bucket[k.lo & c->mask], hops = 0;
        while (j != NIL && j != i && ++hops <= c->n_ent)
            j = c->ent[j].hnext;
        if (j != i)
            KVR_VERIFY_FAIL("entry %u is not in its bucket's chain", i);
        uint32_t ch = e->chunk;
        for (uint32_t m = 1; m < chunks_for(e->n); m++) {
            if (ch >= c->n_chunks)
                KVR_VERIFY_FAIL("entry %u: a chunk out of the store", i);
            ch = c->chunk_next[ch];
        }
        if (ch >= c->n_chunks || c->chunk_next[ch] != NIL)
            KVR_VERIFY_FAIL("entry %u: its chunk chain is not %u long", i, chunks_for(e->n));
        tokens += e->n;
        used += chunks_for(e->n);
    }
    if (n != c->n_ent || prev != c->tail)
        KVR_VERIFY_FAIL("the LRU list has %u entries (count %u) or a wrong tail", n, c->n_ent);
    if (tokens != c->tokens)
        KVR_VERIFY_FAIL("entries hold %llu tokens, count says %llu", (unsigned long long)tokens,
                        (unsigned long long)c->tokens);
    uint32_t nfree = 0;
    for (uint32_t ch = c->free_chunk; ch != NIL; ch = c->chunk_next[ch])
        if (ch >= c->n_chunks || ++nfree > c->n_chunks)
            KVR_VERIFY_FAIL("the free chunk list leaves the store or loops");
    if (nfree != c->n_free || used + nfree != c->n_chunks)
        KVR_VERIFY_FAIL("%llu chunks used and %u free (count %u) of %u", (unsigned long long)used,
                        nfree, c->n_free, c->n_chunks);
    return KVR_OK;
}

/* ---- the scratch's cache, as tokenizer.h shows it ------------------------------------------ */

void kvr_tok_scratch_set_cache(kvr_tok_scratch_t *s, size_t max_tokens)
{
    kvr_tok_sc_free(&s->segs);
    s->segs.cap_tokens = max_tokens / TOK_SC_CHUNK > TOK_SC_MAX_CHUNKS
                             ? (size_t)TOK_SC_MAX_CHUNKS * TOK_SC_CHUNK
                             : max_tokens;
}

void kvr_tok_scratch_cache_stats(const kvr_tok_scratch_t *s, kvr_tok_cache_stats_t *st)
{
    *st = s->segs.st;
    st->tokens = s->segs.tokens;
    st->segments = s->segs.n_ent;
    st->capacity = s->segs.cap_tokens / TOK_SC_CHUNK * TOK_SC_CHUNK;
}

int kvr_tok_scratch_verify(const kvr_tok_scratch_t *s, char *msg, size_t msg_len)
{
    return kvr_tok_sc_verify(&s->segs, msg, msg_len);
}
