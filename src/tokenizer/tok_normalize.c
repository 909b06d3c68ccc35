/*
 * tok_normalize.c: the normalizer of a tokenizer.json as a list of steps: NFC (libunistring's
 * u8_normalize), Replace with a string pattern, Prepend (only to a non-empty piece, as HF),
 * nested Sequences flattened. Any other type or option is refused at build with its name.
 *
 * Invariants: a Replace pattern is non-empty. Ownership: the steps own their strings
 * (kvr_tok_norm_free). Threads: a built normalizer is read-only; run on any thread with that
 * thread's buffers. Cost: O(n) per step; NFC copies text whose code points are all stable
 * boundaries (below U+0300, Cyrillic letters, kana, CJK ideographs, Hangul syllables: already
 * NFC and never composing) and runs the library only on the runs of others (with the starter
 * before each); it allocates only when the buffer is short.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uninorm.h>

#include "base/ascii.h"
#include "base/grow.h"
#include "tokenizer/tok_impl.h"

/* Code points Unicode 10 to 14 gave a combining class or a decomposition, which HF's NFC
 * (unicode-normalization-alignments, older Unicode data) treats as unassigned: a starter that
 * never decomposes nor composes. Found by probing HF's NFC (tests/oracle's binding) with each
 * code point libunistring's Unicode 14 data normalizes, next to marks of classes 1, 220 and 230,
 * and keeping those where the two disagree. NFC runs on the pieces between them, so they stay
 * the inert starters HF sees. */
static const uint32_t hf_unknown[][2] = {
    {0x7FD, 0x7FD},     {0x898, 0x89F},     {0x8CA, 0x8D3},     {0x9FE, 0x9FE},
    {0xC3C, 0xC3C},     {0xD3B, 0xD3C},     {0xEBA, 0xEBA},     {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070},
    {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A}, {0x1193D, 0x1193E},
    {0x11943, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D42}, {0x11D44, 0x11D45}, {0x11D97, 0x11D97},
    {0x16FF0, 0x16FF1}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE}, {0x1E2EC, 0x1E2EF},
};

static bool hf_unknown_cp(uint32_t cp)
{
    size_t lo = 0, hi = sizeof hf_unknown / sizeof hf_unknown[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < hf_unknown[mid][0])
            hi = mid;
        else if (cp > hf_unknown[mid][1])
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

static int add_step(tok_norm_t *norm, tok_norm_step_t st)
{
    tok_norm_step_t *p = realloc(norm->steps, (norm->n + 1) * sizeof *p);
    if (p == NULL)
        return KVR_ENOMEM;
    norm->steps = p;
    p[norm->n++] = st;
    return KVR_OK;
}

static char *dup_str(const tj_node_t *n) { return kvr_tj_dup(n->s, n->len); }

static int build(const tj_node_t *node, tok_norm_t *norm, char *err, size_t err_len, int depth)
{
    if (node == NULL || node->type == TJ_NULL)
        return KVR_OK;
    const tj_node_t *type = kvr_tj_get(node, "type");
    if (node->type != TJ_OBJ || type == NULL || type->type != TJ_STR || depth > 16) {
        snprintf(err, err_len, "normalizer: not an object with a type");
        return KVR_EPARSE;
    }
    const char *t = type->s;
    if (strcmp(t, "Sequence") == 0) {
        static const char *const ok[] = {"type", "normalizers", NULL};
        const tj_node_t *list = kvr_tj_get(node, "normalizers");
        const char *bad = kvr_tj_unknown_key(node, ok);
        if (bad != NULL || list == NULL || list->type != TJ_ARR) {
            snprintf(err, err_len, "normalizer: Sequence: %s%s%s",
                     bad ? "option \"" : "no normalizers list", bad ? bad : "",
                     bad ? "\" is not supported" : "");
            return KVR_EPARSE;
        }
        for (size_t i = 0; i < list->n; i++) {
            int rc = build(list->kids[i], norm, err, err_len, depth + 1);
            if (rc != KVR_OK)
                return rc;
        }
        return KVR_OK;
    }
    if (strcmp(t, "NFC") == 0) {
        static const char *const ok[] = {"type", NULL};
        const char *bad = kvr_tj_unknown_key(node, ok);
        if (bad != NULL) {
            snprintf(err, err_len, "normalizer: NFC: option \"%s\" is not supported", bad);
            return KVR_EPARSE;
        }
        return add_step(norm, (tok_norm_step_t){.kind = NORM_NFC});
    }
    if (strcmp(t, "Replace") == 0) {
        static const char *const ok[] = {"type", "pattern", "content", NULL};
        const char *bad = kvr_tj_unknown_key(node, ok);
        const tj_node_t *pat = kvr_tj_get(node, "pattern");
        const tj_node_t *content = kvr_tj_get(node, "content");
        const tj_node_t *str = kvr_tj_get(pat, "String");
        if (bad != NULL) {
            snprintf(err, err_len, "normalizer: Replace: option \"%s\" is not supported", bad);
            return KVR_EPARSE;
        }
        if (kvr_tj_get(pat, "Regex") != NULL) {
            snprintf(err, err_len, "normalizer: Replace: a Regex pattern is not supported");
            return KVR_EPARSE;
        }
        if (str == NULL || str->type != TJ_STR || str->len == 0 || content == NULL ||
            content->type != TJ_STR || pat->n != 1) {
            snprintf(err, err_len,
                     "normalizer: Replace: needs pattern {\"String\": non-empty} and content");
            return KVR_EPARSE;
        }
        tok_norm_step_t st = {.kind = NORM_REPLACE,
                              .a = dup_str(str),
                              .alen = str->len,
                              .b = dup_str(content),
                              .blen = content->len};
        if (st.a == NULL || st.b == NULL || add_step(norm, st) != KVR_OK) {
            free(st.a);
            free(st.b);
            return KVR_ENOMEM;
        }
        return KVR_OK;
    }
    if (strcmp(t, "Prepend") == 0) {
        static const char *const ok[] = {"type", "prepend", NULL};
        const char *bad = kvr_tj_unknown_key(node, ok);
        const tj_node_t *pre = kvr_tj_get(node, "prepend");
        if (bad != NULL || pre == NULL || pre->type != TJ_STR) {
            snprintf(err, err_len, "normalizer: Prepend: %s%s%s",
                     bad ? "option \"" : "needs a prepend string", bad ? bad : "",
                     bad ? "\" is not supported" : "");
            return KVR_EPARSE;
        }
        tok_norm_step_t st = {.kind = NORM_PREPEND, .a = dup_str(pre), .alen = pre->len};
        if (st.a == NULL || add_step(norm, st) != KVR_OK) {
            free(st.a);
            return KVR_ENOMEM;
        }
        return KVR_OK;
    }
    snprintf(err, err_len, "normalizer: type \"%.40s\" is not supported", t);
    return KVR_EPARSE;
}

int kvr_tok_norm_build(const tj_node_t *node, tok_norm_t *norm, char *err, size_t err_len)
{
    memset(norm, 0, sizeof *norm);
    int rc = build(node, norm, err, err_len, 0);
    if (rc != KVR_OK)
        kvr_tok_norm_free(norm);
    return rc;
}

void kvr_tok_norm_free(tok_norm_t *norm)
{
    for (size_t i = 0; i < norm->n; i++) {
        free(norm->steps[i].a);
        free(norm->steps[i].b);
    }
    free(norm->steps);
    memset(norm, 0, sizeof *norm);
}

static int fit(tok_buf_t *b, size_t need)
{
    return kvr_grow((void **)&b->p, &b->cap, need + 1, SIZE_MAX / 2, 1);
}

/* Code points from U+0300 up that are stable boundaries as those below it are (combining class
 * 0, NFC_QC Yes, never the second of a composition; every one checked against Unicode 14 with
 * Python's unicodedata, which libunistring's data matches; HF's older data has them alike or
 * unassigned, inert either way): Cyrillic letters, kana, CJK ideographs, Hangul syllables. */
static bool stable_cp(uint32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7A3) ||
           (cp >= 0x0400 && cp <= 0x0482) || (cp >= 0x048A && cp <= 0x052F) ||
           (cp >= 0x3041 && cp <= 0x3096) || (cp >= 0x30A1 && cp <= 0x30FA);
}

/* The length of the code point at s[i] when it is a stable boundary (below U+0300: lead bytes
 * below 0xCC; or stable_cp), else 0. s is valid UTF-8. */
static size_t light_len(const unsigned char *s, size_t n, size_t i)
{
    if (s[i] < 0x80)
        return 1;
    if (s[i] < 0xCC)
        return 2;
    size_t l = 1;
    uint32_t cp = kvr_tok_utf8_decode(s + i, &l);
    return i + l <= n && stable_cp(cp) ? l : 0;
}

/* Whether every code point of s is a stable boundary (its own NFC, nothing composing). */
static bool all_light(const unsigned char *s, size_t n)
{
    for (size_t i = kvr_ascii_end(s, 0, n), l; i < n; i = kvr_ascii_end(s, i + l, n))
        if ((l = light_len(s, n, i)) == 0)
            return false;
    return true;
}

/* Appends NFC(s[0..n)) of a run that needs the library to out. */
static int nfc_lib(const char *s, size_t n, tok_buf_t *out)
{
    if (n == 0)
        return KVR_OK;
    if (fit(out, out->len + n + 16) != KVR_OK)
        return KVR_ENOMEM;
    size_t len = out->cap - out->len;
    uint8_t *dst = (uint8_t *)out->p + out->len;
    uint8_t *r = u8_normalize(UNINORM_NFC, (const uint8_t *)s, n, dst, &len);
    if (r == NULL)
        return KVR_ENOMEM;
    if (r != dst) {
        if (fit(out, out->len + len) != KVR_OK) {
            free(r);
            return KVR_ENOMEM;
        }
        memcpy(out->p + out->len, r, len);
        free(r);
    }
    out->len += len;
    return KVR_OK;
}

static int copy_append(const char *s, size_t n, tok_buf_t *out)
{
    if (n == 0)
        return KVR_OK;
    if (fit(out, out->len + n) != KVR_OK)
        return KVR_ENOMEM;
    memcpy(out->p + out->len, s, n);
    out->len += n;
    return KVR_OK;
}

/* Appends NFC(s[0..n)) to out. A code point below U+0300 is a stable boundary (UAX #15:
 * combining class 0, NFC_QC Yes, never the second of a composition), and so are those of
 * stable_cp: text may be cut before one, and a run of them is its own NFC. So only the runs of
 * other code points, each with the code point before it (a starter they may compose with), go
 * through the library; the rest is copied. Prose in a Latin script with some CJK or Cyrillic
 * words costs a copy for most of its bytes instead of libunistring's decompose-recompose
 * (about a third of an encoding's time on such text before this), and so does Chinese,
 * Japanese kana, Korean or Russian text since the stable ranges. */
static int nfc_append(const char *s, size_t n, tok_buf_t *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t light = 0, prev = 0; /* the light run's start; the last code point's start */
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) { /* an ASCII run: its last byte is the code point before what follows */
            size_t e = kvr_ascii_end(u, i, n);
            prev = e - 1;
            i = e;
            continue;
        }
        size_t l = light_len(u, n, i);
        if (l > 0) { /* a stable boundary */
            prev = i;
            i += l;
            continue;
        }
        size_t from = prev >= light && i > light ? prev : i; /* with the starter before it */
        size_t j = i;
        /* the heavy run: up to the next light code point */
        while (j < n && u[j] >= 0xCC && light_len(u, n, j) == 0) {
            size_t cl = 1;
            (void)kvr_tok_utf8_decode(u + j, &cl);
            j += cl;
            while (j < n && (u[j] & 0xC0) == 0x80) /* a stray continuation: stays heavy */
                j++;
        }
        if (copy_append(s + light, from - light, out) != KVR_OK ||
            nfc_lib(s + from, (j > n ? n : j) - from, out) != KVR_OK)
            return KVR_ENOMEM;
        light = prev = i = j > n ? n : j;
    }
    return copy_append(s + light, n - light, out);
}

static int run_step(const tok_norm_step_t *st, const char *s, size_t n, tok_buf_t *out)
{
    switch (st->kind) {
    case NORM_NFC: {
        if (all_light((const unsigned char *)s, n)) {
            if (fit(out, n) != KVR_OK)
                return KVR_ENOMEM;
            memcpy(out->p, s, n);
            out->len = n;
            return KVR_OK;
        }
        out->len = 0;
        size_t from = 0;
        for (size_t i = 0; i <= n;) { /* runs between HF-unknown code points, each normalized */
            if (i < n && (unsigned char)s[i] < 0x80) {
                i = kvr_ascii_end((const unsigned char *)s, i, n);
                continue;
            }
            if (i < n && (unsigned char)s[i] < 0xDF) { /* below U+07C0: never unknown */
                i += 2;
                continue;
            }
            size_t l = 1;
            uint32_t cp = i < n ? kvr_tok_utf8_decode((const unsigned char *)s + i, &l) : 0;
            if (i < n && (cp < 0x7FD || !hf_unknown_cp(cp))) {
                i += l;
                continue;
            }
            if (nfc_append(s + from, i - from, out) != KVR_OK)
                return KVR_ENOMEM;
            if (i < n) { /* the unknown code point itself, as is */
                if (fit(out, out->len + l) != KVR_OK)
                    return KVR_ENOMEM;
                memcpy(out->p + out->len, s + i, l);
                out->len += l;
            }
            i += l;
            from = i;
            if (i > n)
                break;
        }
        return KVR_OK;
    }
    case NORM_REPLACE: {
        size_t cnt = 0;
        for (size_t i = 0; i + st->alen <= n;) {
            if (memcmp(s + i, st->a, st->alen) == 0) {
                cnt++;
                i += st->alen;
            } else {
                i++;
            }
        }
        size_t need = n + cnt * st->blen;
        if (fit(out, need) != KVR_OK)
            return KVR_ENOMEM;
        size_t o = 0, i = 0;
        while (i < n) {
            if (i + st->alen <= n && memcmp(s + i, st->a, st->alen) == 0) {
                memcpy(out->p + o, st->b, st->blen);
                o += st->blen;
                i += st->alen;
            } else {
                out->p[o++] = s[i++];
            }
        }
        out->len = o;
        return KVR_OK;
    }
    default: /* NORM_PREPEND */
        if (fit(out, n + st->alen) != KVR_OK)
            return KVR_ENOMEM;
        size_t o = 0;
        if (n > 0) {
            memcpy(out->p, st->a, st->alen);
            o = st->alen;
        }
        memcpy(out->p + o, s, n);
        out->len = o + n;
        return KVR_OK;
    }
}

int kvr_tok_norm_run(const tok_norm_t *norm, const char *s, size_t n, tok_buf_t *out,
                     tok_buf_t *tmp)
{
    if (norm->n == 0) {
        if (fit(out, n) != KVR_OK)
            return KVR_ENOMEM;
        memcpy(out->p, s, n);
        out->len = n;
        return KVR_OK;
    }
    for (size_t i = 0; i < norm->n; i++) {
        const char *in = i == 0 ? s : out->p;
        size_t in_n = i == 0 ? n : out->len;
        int rc = run_step(&norm->steps[i], in, in_n, tmp);
        if (rc != KVR_OK)
            return rc;
        tok_buf_t t = *out;
        *out = *tmp;
        *tmp = t;
    }
    return KVR_OK;
}
