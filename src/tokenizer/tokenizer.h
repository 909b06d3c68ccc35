/*
 * tokenizer.h: in-process tokenization from a Hugging Face tokenizer.json, giving exactly the
 * ids HF tokenizers gives (checked against it: tests/oracle, docs/tokenize.md).
 *
 * Supported (anything else is refused at load with an error naming it): model BPE (merges,
 * byte-level vocab, byte_fallback, unk/fuse_unk, ignore_merges); normalizers NFC, Replace
 * (string pattern), Prepend, Sequence; pre-tokenizers Split (regex or string; every behavior
 * but invert), ByteLevel (last, no prefix space), Sequence, Metaspace (the whole of it);
 * post-processors TemplateProcessing (single), ByteLevel, Sequence; added tokens with
 * lstrip/rstrip/single_word/normalized.
 * tokenizer_config.json: add_bos_token / add_eos_token (when they are booleans) replace the
 * post-processor's specials by [bos] A [eos], as transformers' Llama and Gemma tokenizers do.
 *
 * Ownership: kvr_tok_load returns a tokenizer the caller frees with kvr_tok_free; it keeps no
 * pointer to its input. Text in is borrowed for the call.
 * Threads: a loaded tokenizer is immutable. kvr_tok_encode uses the tokenizer's own scratch:
 * one thread at a time per tokenizer. kvr_tok_encode_r takes a caller scratch (one per thread)
 * and may run on any number of threads at once on the same tokenizer.
 * Cost: load O(file) (Qwen3, 150K vocab: ~120 ms; Gemma 3, 262K: ~380 ms); encode O(n log n), no
 * allocation once the scratch has grown to the largest input (and its segment cache is made);
 * a segment the cache holds costs a hash of its bytes and a copy of its ids.
 */
#ifndef KVR_TOKENIZER_H
#define KVR_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/status.h"

typedef struct kvr_tok kvr_tok_t;
typedef struct kvr_tok_scratch kvr_tok_scratch_t;

/* Loads dir/tokenizer.json (and dir/tokenizer_config.json if present), or the file named
 * (its sibling tokenizer_config.json if present). NULL on failure: *status a KVR_E* code and
 * err the reason ("pre_tokenizer: type \"Whitespace\" is not supported"). */
kvr_tok_t *kvr_tok_load(const char *dir_or_file, int *status, char *err, size_t err_len);
/* The same from tokenizer.json bytes in memory (config NULL or tokenizer_config.json bytes). */
kvr_tok_t *kvr_tok_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                            int *status, char *err, size_t err_len);
void kvr_tok_free(kvr_tok_t *t);

/* The ids of text[0..len) (UTF-8; each maximal invalid sequence is read as U+FFFD, as Rust's
 * from_utf8_lossy does). add_special: the post-processor's BOS/EOS. Writes at most cap ids;
 * *n is the number of ids of the whole encoding. KVR_OK; KVR_ETOOBIG when *n > cap (ids
 * holds the first cap); KVR_ENOMEM. */
int kvr_tok_encode(const kvr_tok_t *t, const char *text, size_t len, bool add_special,
                   uint32_t *ids, size_t cap, size_t *n);
kvr_tok_scratch_t *kvr_tok_scratch_new(const kvr_tok_t *t);
void kvr_tok_scratch_free(kvr_tok_scratch_t *s);
int kvr_tok_encode_r(const kvr_tok_t *t, kvr_tok_scratch_t *s, const char *text, size_t len,
                     bool add_special, uint32_t *ids, size_t cap, size_t *n);

/* The segment cache of a scratch: the ids of the text between two added tokens (64 bytes or
 * more), which depend on nothing else, kept by content in a least-recently-used store bounded
 * in tokens, so that a chat's next turn encodes only its new messages (tok_segcache.c). A new
 * scratch has one of 1,048,576 tokens (4 MiB of ids, allocated at its first store). A hit
 * returns exactly the ids encoding would. */
typedef struct kvr_tok_cache_stats {
    uint64_t hits, misses;     /* lookups of segments of 64 bytes or more */
    uint64_t evictions;        /* segments dropped to make room (or the tokenizer changed) */
    uint64_t tokens_served;    /* ids the hits returned */
    uint64_t tokens, segments; /* held now */
    uint64_t capacity;         /* the bound in tokens (0: off) */
} kvr_tok_cache_stats_t;
/* Sets the bound (0 turns the cache off); what the cache held is dropped, the counters kept.
 * Call between encodings. */
void kvr_tok_scratch_set_cache(kvr_tok_scratch_t *s, size_t max_tokens);
void kvr_tok_scratch_cache_stats(const kvr_tok_scratch_t *s, kvr_tok_cache_stats_t *st);
/* The cache's invariants: KVR_OK, or KVR_EINVAL with msg saying which is broken. */
int kvr_tok_scratch_verify(const kvr_tok_scratch_t *s, char *msg, size_t msg_len);

/* Largest id + 1 (model vocabulary and added tokens). */
size_t kvr_tok_vocab_size(const kvr_tok_t *t);
/* Bytes the tokenizer holds (tables, strings, compiled patterns), scratch excluded. */
size_t kvr_tok_bytes(const kvr_tok_t *t);
/* The id of a token as tokenizer.json spells it (added tokens, then the vocabulary).
 * KVR_OK or KVR_ENOTFOUND. */
int kvr_tok_token_id(const kvr_tok_t *t, const char *token, uint32_t *id);
/* tokenizer_config.json's bos_token / eos_token (NULL when absent). */
const char *kvr_tok_bos_token(const kvr_tok_t *t);
const char *kvr_tok_eos_token(const kvr_tok_t *t);

#endif
