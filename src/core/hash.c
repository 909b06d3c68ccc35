/*
 * hash.c: Dynamo-compatible block hashing (docs/wire-formats.md, section 4).
 *
 * Invariants: results match ai-dynamo's LocalBlockHash / SequenceHash bit for bit
 * (tests/data/hash-vectors.json). Token bytes are little-endian u32; on little-endian hosts the
 * caller's token array is hashed in place, so no block is copied.
 * Memory: allocates nothing; multimodal hashes go through a stack XXH3 state.
 * Threads: pure functions, any thread.
 * Cost: one XXH3 per block (about 64 bytes at block size 16) plus one 16-byte XXH3 per
 * sequence hash.
 */
/* Debian's xxhash.h carries the whole implementation; inlining it lets the compiler
 * specialise XXH3 for our fixed 16-byte chain input and drop the PLT call per block. */
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <string.h>

#include "kvrouter/hash.h"
#include "base/hex.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KVR_HOST_LE 1
#else
#define KVR_HOST_LE 0
#endif

uint64_t kvr_xxh3(const void *bytes, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(bytes, len, seed);
}

uint64_t kvr_hash_seed(const kvr_hash_opts_t *opts)
{
    uint64_t seed = KVR_HASH_SEED;
    if (opts == NULL)
        return seed;
    if (opts->lora_name != NULL && opts->lora_name_len > 0)
        seed += XXH3_64bits_withSeed(opts->lora_name, opts->lora_name_len, 0);
    if (opts->cache_namespace != NULL && opts->cache_namespace_len > 0)
        seed += XXH3_64bits_withSeed(opts->cache_namespace, opts->cache_namespace_len, 1);
    return seed;
}

bool kvr_hash_mm_identifier(const char *s, size_t n, bool any_string, uint64_t *out)
{
    if (s == NULL || n == 0)
        return false;
    bool hex = n == 64;
    for (size_t i = 0; hex && i < n; i++)
        hex = kvr_hex_digit(s[i]) >= 0;
    if (hex) {
        uint64_t v = 0;
        for (size_t i = 0; i < 16; i++)
            v = v << 4 | (uint64_t)kvr_hex_digit(s[i]);
        *out = v;
        return true;
    }
    if (!any_string)
        return false;
    *out = XXH3_64bits_withSeed(s, n, 0);
    return true;
}

size_t kvr_hash_n_blocks(size_t n_tokens, uint32_t block_size, bool is_eagle)
{
    if (block_size == 0)
        return 0;
    if (is_eagle)
        return n_tokens == 0 ? 0 : (n_tokens - 1) / block_size;
    return n_tokens / block_size;
}

/* One 8-byte store on little-endian hosts: byte-wise stores followed by XXH3's 8-byte load
 * would defeat store-to-load forwarding on the serial chain. */
static inline void store_le64(unsigned char *p, uint64_t v)
{
#if KVR_HOST_LE
    memcpy(p, &v, sizeof v);
#else
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
#endif
}

/* Feeds window tokens to the streaming state as little-endian bytes. */
static void update_tokens(XXH3_state_t *st, const uint32_t *tokens, size_t n)
{
#if KVR_HOST_LE
    XXH3_64bits_update(st, tokens, n * sizeof(uint32_t));
#else
    unsigned char buf[256];
    size_t fill = 0;
    for (size_t i = 0; i < n; i++) {
        for (int b = 0; b < 4; b++)
            buf[fill++] = (unsigned char)(tokens[i] >> (8 * b));
        if (fill == sizeof buf) {
            XXH3_64bits_update(st, buf, fill);
            fill = 0;
        }
    }
    XXH3_64bits_update(st, buf, fill);
#endif
}

static void update_u64(XXH3_state_t *st, uint64_t v)
{
    unsigned char b[8];
    store_le64(b, v);
    XXH3_64bits_update(st, b, sizeof b);
}

/* Appends the block's mm hashes in ascending order (duplicates kept) without allocating.
 * Already-sorted input (the usual case; the JSON decoder sorts) is streamed as is in O(n);
 * otherwise this repeatedly emits the smallest value above the last one emitted, with its
 * multiplicity: O(n * distinct values). */
static void update_mm_sorted(XXH3_state_t *st, const uint64_t *h, size_t n)
{
    size_t sorted = 1;
    while (sorted < n && h[sorted - 1] <= h[sorted])
        sorted++;
    if (sorted >= n) {
        for (size_t i = 0; i < n; i++)
            update_u64(st, h[i]);
        return;
    }
    bool have_last = false;
    uint64_t last = 0;
    for (size_t emitted = 0; emitted < n;) {
        bool found = false;
        uint64_t min = 0;
        size_t count = 0;
        for (size_t i = 0; i < n; i++) {
            if (have_last && h[i] <= last)
                continue;
            if (!found || h[i] < min) {
                min = h[i];
                count = 1;
                found = true;
            } else if (h[i] == min) {
                count++;
            }
        }
        for (size_t c = 0; c < count; c++)
            update_u64(st, min);
        emitted += count;
        last = min;
        have_last = true;
    }
}

static uint64_t hash_window(const uint32_t *tokens, size_t window, const kvr_block_mm_t *mm,
                            uint64_t seed)
{
    if (mm == NULL || mm->n_hashes == 0) {
#if KVR_HOST_LE
        return XXH3_64bits_withSeed(tokens, window * sizeof(uint32_t), seed);
#endif
    }
    XXH3_state_t st;
    memset(&st, 0, sizeof st); /* reset initialises it; this quiets gcc's flow analysis */
    XXH3_64bits_reset_withSeed(&st, seed);
    update_tokens(&st, tokens, window);
    if (mm != NULL)
        update_mm_sorted(&st, mm->hashes, mm->n_hashes);
    return XXH3_64bits_digest(&st);
}

static bool mm_valid(const kvr_hash_opts_t *o, size_t n_blocks)
{
    for (size_t i = 0; i < o->n_mm; i++) {
        if (o->mm[i].n_hashes > 0 && o->mm[i].hashes == NULL)
            return false;
        if (i > 0 && o->mm[i].block <= o->mm[i - 1].block)
            return false;
        (void)n_blocks; /* entries past the last complete block are ignored */
    }
    return true;
}

/* Local block hashes, and when seq_out is non-NULL the chained sequence hashes in the same
 * pass: the chain is a serial dependency, and interleaving it with the independent block
 * hashes lets the CPU overlap the two. */
static long hash_prompt(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                        const kvr_hash_opts_t *opts, uint64_t *lbh_out, uint64_t *seq_out,
                        size_t cap)
{
    if (block_size == 0 || (tokens == NULL && n_tokens > 0))
        return KVR_EINVAL;
    bool eagle = opts != NULL && opts->is_eagle;
    size_t n_blocks = kvr_hash_n_blocks(n_tokens, block_size, eagle);
    if (n_blocks > cap)
        return KVR_ETOOBIG;
    if (n_blocks > 0 && lbh_out == NULL)
        return KVR_EINVAL;
    if (opts != NULL && opts->n_mm > 0 && (opts->mm == NULL || !mm_valid(opts, n_blocks)))
        return KVR_EINVAL;

    uint64_t seed = kvr_hash_seed(opts);
    size_t window = (size_t)block_size + (eagle ? 1 : 0);
    size_t mi = 0;
    uint64_t prev = 0;
    for (size_t b = 0; b < n_blocks; b++) {
        const kvr_block_mm_t *mm = NULL;
        if (opts != NULL) {
            while (mi < opts->n_mm && opts->mm[mi].block < b)
                mi++;
            if (mi < opts->n_mm && opts->mm[mi].block == b)
                mm = &opts->mm[mi];
        }
        uint64_t h = hash_window(tokens + b * (size_t)block_size, window, mm, seed);
        lbh_out[b] = h;
        if (seq_out != NULL) {
            prev = b == 0 ? h : kvr_hash_chain_next(prev, h);
            seq_out[b] = prev;
        }
    }
    return (long)n_blocks;
}

long kvr_hash_blocks(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                     const kvr_hash_opts_t *opts, uint64_t *lbh_out, size_t cap)
{
    return hash_prompt(tokens, n_tokens, block_size, opts, lbh_out, NULL, cap);
}

long kvr_hash_prompt(const uint32_t *tokens, size_t n_tokens, uint32_t block_size,
                     const kvr_hash_opts_t *opts, uint64_t *lbh_out, uint64_t *seq_out,
                     size_t cap)
{
    if (seq_out == NULL && n_tokens > 0)
        return KVR_EINVAL;
    return hash_prompt(tokens, n_tokens, block_size, opts, lbh_out, seq_out, cap);
}

uint64_t kvr_hash_chain_next(uint64_t prev_seq, uint64_t lbh)
{
    unsigned char buf[16];
    store_le64(buf, prev_seq);
    store_le64(buf + 8, lbh);
    return XXH3_64bits_withSeed(buf, sizeof buf, KVR_HASH_SEED);
}

void kvr_hash_chain(const uint64_t *lbh, size_t n, uint64_t *seq_out)
{
    if (n == 0)
        return;
    uint64_t prev = lbh[0];
    seq_out[0] = prev;
    for (size_t i = 1; i < n; i++) {
        prev = kvr_hash_chain_next(prev, lbh[i]);
        seq_out[i] = prev;
    }
}

uint32_t kvr_mm_pad_value(uint64_t mm_hash)
{
    return (uint32_t)(1000000u + (mm_hash & ((UINT64_C(1) << 30) - 1)));
}
