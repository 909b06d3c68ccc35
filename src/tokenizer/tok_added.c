/*
 * tok_added.c: added tokens (specials such as <|im_start|>, and the others) found in text
 * before the model sees it, as HF's AddedVocabulary does: a byte trie searched leftmost-longest
 * (what its Aho-Corasick with MatchKind::LeftmostLongest finds), matches not overlapping, then
 * each match's flags: single_word drops a match touching a word character (Unicode Alphabetic
 * or Numeric, as Rust's is_alphanumeric) on either side; lstrip takes the White_Space before it
 * (not past the previous match), rstrip the White_Space after it.
 *
 * Two instances per tokenizer: the tokens with normalized false are matched in the raw text,
 * those with normalized true in each normalized piece (their content normalized at load).
 * Invariants: node 0 is the unused sentinel, so 0 means "none" in child/sib/root.
 * Ownership: the instance owns its tokens and nodes. Threads: read-only once built.
 * Cost: O(n x depth of the longest partial match) per text; no allocation but the segments.
 * When every token starts with the same byte (five of the six oracle models: '<'), the text is
 * crossed with memchr from one occurrence of that byte to the next.
 */
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "tokenizer/tok_impl.h"

static int new_node(tok_added_t *a, uint8_t byte, uint32_t *out)
{
    size_t cap = a->n_nodes; /* grown by doubling with the count */
    if (a->n_nodes == 0 || (a->n_nodes & (a->n_nodes - 1)) == 0) {
        size_t want = a->n_nodes ? a->n_nodes * 2 : 64;
        tok_trie_node_t *p = realloc(a->nodes, want * sizeof *p);
        if (p == NULL)
            return KVR_ENOMEM;
        a->nodes = p;
        if (a->n_nodes == 0)
            a->nodes[a->n_nodes++] = (tok_trie_node_t){0, 0, -1, 0};
    }
    (void)cap;
    a->nodes[a->n_nodes] = (tok_trie_node_t){0, 0, -1, byte};
    *out = (uint32_t)a->n_nodes++;
    return KVR_OK;
}

int kvr_tok_added_add(tok_added_t *a, uint32_t id, const char *content, size_t len, bool lstrip,
                      bool rstrip, bool single_word)
{
    if (len == 0)
        return KVR_OK;
    if (single_word && a->word_re == NULL) {
        int ec;
        PCRE2_SIZE eo;
        static const char pat[] = "[\\p{Alphabetic}\\p{N}]";
        a->word_re = pcre2_compile((PCRE2_SPTR)pat, sizeof pat - 1,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &ec, &eo, NULL);
        if (a->word_re == NULL)
            return KVR_ENOMEM;
    }
    if (kvr_grow((void **)&a->toks, &a->cap, a->n + 1, SIZE_MAX / 64, sizeof *a->toks) != KVR_OK)
        return KVR_ENOMEM;
    tok_added_tok_t *t = a->toks;
    char *c = kvr_tj_dup(content, len);
    if (c == NULL)
        return KVR_ENOMEM;
    t[a->n] = (tok_added_tok_t){id, c, len, lstrip, rstrip, single_word};
    uint32_t cur = a->root[(uint8_t)content[0]];
    if (cur == 0) {
        if (new_node(a, (uint8_t)content[0], &cur) != KVR_OK)
            return KVR_ENOMEM;
        a->root[(uint8_t)content[0]] = cur;
        a->n_first++;
        a->first = (uint8_t)content[0];
    }
    for (size_t i = 1; i < len; i++) {
        uint8_t b = (uint8_t)content[i];
        uint32_t ch = a->nodes[cur].child;
        while (ch != 0 && a->nodes[ch].byte != b)
            ch = a->nodes[ch].sib;
        if (ch == 0) {
            if (new_node(a, b, &ch) != KVR_OK)
                return KVR_ENOMEM;
            a->nodes[ch].sib = a->nodes[cur].child;
            a->nodes[cur].child = ch;
        }
        cur = ch;
    }
    if (a->nodes[cur].tok < 0) /* the first of two equal contents keeps it */
        a->nodes[cur].tok = (int32_t)a->n;
    a->n++;
    return KVR_OK;
}

void kvr_tok_added_free(tok_added_t *a)
{
    for (size_t i = 0; i < a->n; i++)
        free(a->toks[i].content);
    free(a->toks);
    free(a->nodes);
    pcre2_code_free(a->word_re);
    memset(a, 0, sizeof *a);
}

/* The longest token starting at s[i]: its index, and its end in *end; -1 when none. */
static int32_t longest(const tok_added_t *a, const char *s, size_t n, size_t i, size_t *end)
{
    uint32_t cur = a->root[(uint8_t)s[i]];
    int32_t best = -1;
    size_t j = i + 1;
    while (cur != 0) {
        if (a->nodes[cur].tok >= 0) {
            best = a->nodes[cur].tok;
            *end = j;
        }
        if (j >= n)
            break;
        uint8_t b = (uint8_t)s[j];
        uint32_t ch = a->nodes[cur].child;
        while (ch != 0 && a->nodes[ch].byte != b)
            ch = a->nodes[ch].sib;
        cur = ch;
        j++;
    }
    return best;
}

static bool is_word_at(const tok_added_t *a, const char *s, size_t n, size_t at,
                       pcre2_match_data *md)
{
    return pcre2_match(a->word_re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

static int push(tok_segs_t *o, size_t off, size_t len, uint32_t id)
{
    if (o->n == o->cap &&
        kvr_grow((void **)&o->s, &o->cap, o->n + 1, SIZE_MAX / 16, sizeof *o->s) != KVR_OK)
        return KVR_ENOMEM;
    o->s[o->n++] = (tok_seg_t){(uint32_t)off, (uint32_t)len, id};
    return KVR_OK;
}

int kvr_tok_added_split(const tok_added_t *a, const char *s, size_t n, pcre2_match_data *md,
                        tok_segs_t *out)
{
    out->n = 0;
    size_t start_offset = 0;
    for (size_t i = 0; a->n > 0 && i < n;) {
        if (a->n_first == 1) { /* every token starts with one byte ('<'): memchr to the next */
            const char *at = memchr(s + i, a->first, n - i);
            if (at == NULL)
                break;
            i = (size_t)(at - s);
        }
        size_t stop = 0;
        int32_t k = a->root[(uint8_t)s[i]] ? longest(a, s, n, i, &stop) : -1;
        if (k < 0) {
            i++;
            continue;
        }
        const tok_added_tok_t *t = &a->toks[k];
        size_t start = i;
        i = stop; /* the search goes on after this match, taken or not */
        if (t->single_word) {
            bool start_space = true, stop_space = true;
            if (start > 0) {
                size_t p = start - 1;
                while (p > 0 && ((unsigned char)s[p] & 0xC0) == 0x80)
                    p--;
                start_space = !is_word_at(a, s, n, p, md);
            }
            if (stop < n)
                stop_space = !is_word_at(a, s, n, stop, md);
            if (!start_space || !stop_space)
                continue;
        }
        if (t->lstrip) {
            size_t p = start;
            while (p > 0) {
                size_t q = p - 1, l;
                while (q > 0 && ((unsigned char)s[q] & 0xC0) == 0x80)
                    q--;
                if (!kvr_tok_is_whitespace(kvr_tok_utf8_decode((const unsigned char *)s + q, &l)))
                    break;
                p = q;
            }
            start = p > start_offset ? p : start_offset;
        }
        if (t->rstrip) {
            while (stop < n) {
                size_t l;
                if (!kvr_tok_is_whitespace(
                        kvr_tok_utf8_decode((const unsigned char *)s + stop, &l)))
                    break;
                stop += l;
            }
            i = stop > i ? stop : i;
        }
        if (start_offset < start &&
            push(out, start_offset, start - start_offset, UINT32_MAX) != KVR_OK)
            return KVR_ENOMEM;
        if (push(out, start, stop - start, t->id) != KVR_OK)
            return KVR_ENOMEM;
        start_offset = stop;
    }
    if (start_offset < n && push(out, start_offset, n - start_offset, UINT32_MAX) != KVR_OK)
        return KVR_ENOMEM;
    return KVR_OK;
}
