/*
 * engine_capacity.c: see engine_capacity.h. Why by hand: the two lines wanted are a sliver
 * of an engine's exposition text, which no Debian C library parses (the Prometheus C client,
 * libprom, writes it; it does not read it), and a full exposition parser would accept far
 * more than the two lines need.
 */
#include "wire/engine_capacity.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrouter.h"
#include "wire/parse_fail.h"

#define VLLM_NAME "vllm:cache_config_info"
#define SGL_NAME "sglang:max_total_num_tokens"
#define MAX_TOKENS (UINT64_C(1) << 52) /* 4.5e15 tokens: no engine comes near */

typedef struct line {
    const char *p, *end; /* the cursor and the end of the line (its newline excluded) */
} line_t;

static bool is_name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* A decimal integer filling [s, e): true and *v, or false. */
static bool dec_u64(const char *s, const char *e, uint64_t *v)
{
    if (s == e || e - s > 16)
        return false;
    uint64_t x = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        x = x * 10 + (uint64_t)(*s - '0');
    }
    *v = x;
    return true;
}

typedef struct labels {
    const char *block_size, *block_size_end;
    const char *blocks, *blocks_end;
} labels_t;

/* Reads `{name="value",...}` at l->p (if there) into lb (the two vLLM labels); false when
 * malformed. */
static bool read_labels(line_t *l, labels_t *lb)
{
    if (l->p == l->end || *l->p != '{')
        return true;
    l->p++;
    while (l->p < l->end && *l->p != '}') {
        const char *n = l->p;
        while (l->p < l->end && is_name_char(*l->p, l->p == n) && *l->p != ':')
            l->p++;
        const char *ne = l->p;
        if (ne == n || l->p + 1 >= l->end || l->p[0] != '=' || l->p[1] != '"')
            return false;
        l->p += 2;
        const char *v = l->p;
        while (l->p < l->end && *l->p != '"') {
            if (*l->p == '\\')
                return false; /* no number or "None" needs an escape */
            l->p++;
        }
        if (l->p == l->end)
            return false;
        const char *ve = l->p++;
        size_t nl = (size_t)(ne - n);
        if (nl == 10 && memcmp(n, "block_size", 10) == 0) {
            lb->block_size = v;
            lb->block_size_end = ve;
        } else if (nl == 14 && memcmp(n, "num_gpu_blocks", 14) == 0) {
            lb->blocks = v;
            lb->blocks_end = ve;
        }
        if (l->p < l->end && *l->p == ',')
            l->p++;
        else if (l->p == l->end || *l->p != '}')
            return false;
    }
    if (l->p == l->end)
        return false;
    l->p++;
    return true;
}

/* The sample value after the labels: decimal or exponent notation, finite, >= 0. */
static bool read_value(line_t *l, double *v)
{
    if (l->p == l->end || (*l->p != ' ' && *l->p != '\t'))
        return false;
    while (l->p < l->end && (*l->p == ' ' || *l->p == '\t'))
        l->p++;
    char buf[48];
    size_t n = 0;
    while (l->p < l->end && *l->p != ' ' && *l->p != '\t' && *l->p != '\r') {
        char c = *l->p++;
        if (n + 1 >= sizeof buf ||
            !((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-'))
            return false;
        buf[n++] = c;
    }
    buf[n] = '\0';
    char *endp = NULL;
    double x = n ? strtod(buf, &endp) : NAN;
    if (n == 0 || endp != buf + n || !isfinite(x) || x < 0)
        return false;
    *v = x;
    return true;
}

typedef struct found {
    uint64_t vllm_tokens, sgl_tokens; /* smallest seen; 0 = none */
    bool vllm_unsized;
} found_t;

static int take_line(line_t *l, found_t *f, char *err, size_t err_len)
{
    const char *n = l->p;
    while (l->p < l->end && is_name_char(*l->p, l->p == n))
        l->p++;
    size_t nl = (size_t)(l->p - n);
    bool vllm = nl == sizeof VLLM_NAME - 1 && memcmp(n, VLLM_NAME, nl) == 0;
    bool sgl = nl == sizeof SGL_NAME - 1 && memcmp(n, SGL_NAME, nl) == 0;
    if (!vllm && !sgl)
        return KVR_OK;
    const char *what = vllm ? VLLM_NAME : SGL_NAME;
    labels_t lb = {0};
    double v;
    if (!read_labels(l, &lb) || !read_value(l, &v))
        return kvr_parse_fail(err, err_len, "%s: a malformed sample line", what);
    if (sgl) {
        if (v >= (double)MAX_TOKENS)
            return kvr_parse_fail(err, err_len, "%s: %g tokens is not a KV pool", what, v);
        uint64_t t = (uint64_t)v;
        if (f->sgl_tokens == 0 || t < f->sgl_tokens)
            f->sgl_tokens = t;
        return KVR_OK;
    }
    if (lb.blocks == NULL)
        return kvr_parse_fail(err, err_len, "%s: no num_gpu_blocks label", what);
    if (lb.blocks_end - lb.blocks == 4 && memcmp(lb.blocks, "None", 4) == 0) {
        f->vllm_unsized = true;
        return KVR_OK;
    }
    uint64_t blocks, bs;
    if (!dec_u64(lb.blocks, lb.blocks_end, &blocks))
        return kvr_parse_fail(err, err_len, "%s: num_gpu_blocks is not a count", what);
    if (lb.block_size == NULL || !dec_u64(lb.block_size, lb.block_size_end, &bs) || bs == 0 ||
        bs > 65536)
        return kvr_parse_fail(err, err_len, "%s: block_size missing or not a block size", what);
    if (blocks > MAX_TOKENS / bs)
        return kvr_parse_fail(err, err_len, "%s: num_gpu_blocks out of range", what);
    uint64_t t = blocks * bs;
    if (f->vllm_tokens == 0 || t < f->vllm_tokens)
        f->vllm_tokens = t;
    return KVR_OK;
}

int kvr_engine_capacity_parse(const char *text, size_t len, uint32_t block_size,
                              kvr_engine_capacity_t *out, char *err, size_t err_len)
{
    if (block_size == 0 || out == NULL || (text == NULL && len > 0)) {
        (void)kvr_parse_fail(err, err_len, "block size 0 or no text");
        return KVR_EINVAL;
    }
    found_t f = {0};
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        line_t l = {p, nl ? nl : end};
        if (l.p < l.end && *l.p != '#') {
            int rc = take_line(&l, &f, err, err_len);
            if (rc != KVR_OK)
                return rc;
        }
        p = nl ? nl + 1 : end;
    }
    uint64_t tokens = f.vllm_tokens ? f.vllm_tokens : f.sgl_tokens;
    if (tokens == 0) {
        (void)kvr_parse_fail(err, err_len, "%s",
                             f.vllm_unsized ? VLLM_NAME
                                 " says num_gpu_blocks=\"None\" (not sized yet)"
                                            : "no " VLLM_NAME " or " SGL_NAME " in the metrics");
        return KVR_ENOTFOUND;
    }
    if (tokens < block_size) {
        (void)kvr_parse_fail(err, err_len, "a KV pool of %llu tokens is under one block",
                             (unsigned long long)tokens);
        return KVR_EINVAL;
    }
    out->tokens = tokens;
    out->blocks = tokens / block_size;
    out->source = f.vllm_tokens ? KVR_CAPACITY_VLLM : KVR_CAPACITY_SGLANG;
    return KVR_OK;
}
