/*
 * cmd_tokenize.c: `kvrouter tokenize`, token ids of prompts with the in-process tokenizer
 * (src/tokenizer), for parity checks against HF tokenizers (tests/oracle) and for scripts.
 *
 * Contract: with --json, one JSON object per input line, {"text": "..."} (or {"bytes_hex":
 * "..."}: the bytes as given, invalid UTF-8 allowed, for the tests of its repair), one output
 * line each, {"ids":[...]} or {"error":{"line":N,"message":"..."}} (N counts every input line
 * from 1); without --json, each input line (its newline removed) is the text and the output
 * line is the ids separated by spaces. A bad line never stops the run; the exit code is 1 if
 * any line failed (or on an I/O error), 2 on a usage error, else 0. The chat form (--chat:
 * {"messages": [...]} through the model's chat template) is the template module's and comes
 * with it: see the "chat" mark below.
 * Memory: the line, the text, the ids and the output are reused, grown to the largest line.
 * Threads: one. Cost: per line, one JSON pass and one encoding.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "apps/apps.h"
#include "base/hex.h"
#include "apps/cli.h"
#include "base/clock.h"
#include "base/grow.h"
#include "tokenizer/tokenizer.h"

typedef struct line_ctx {
    int depth;
    int key; /* 0 other, 1 text, 2 bytes_hex */
    char *text;
    size_t len, cap;
    bool have, have_hex, bad;
    char why[96];
} line_ctx_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvrouter tokenize --tokenizer DIR|FILE [--no-special] [--json] [--stats]\n"
            "\n"
            "Token ids of each input line, as HF tokenizers computes them from tokenizer.json\n"
            "(and tokenizer_config.json; docs/tokenize.md).\n"
            "  --tokenizer P  a directory with tokenizer.json, or the file itself\n"
            "  --no-special   without the post-processor's BOS/EOS (add_special_tokens=false)\n"
            "  --json         lines are {\"text\": \"...\"} (or {\"bytes_hex\": \"..\"}); output\n"
            "                 {\"ids\":[...]} or {\"error\":{\"line\":N,\"message\":\"...\"}}\n"
            "                 (default: each line is the text; output the ids, space-separated)\n"
            "  --stats        load time, vocabulary and memory on stderr\n");
}

static int on_str(void *u, const unsigned char *s, size_t n)
{
    line_ctx_t *c = u;
    if (c->depth != 1 || c->key == 0 || (c->key == 1 && c->have_hex))
        return 1; /* bytes_hex wins over text, in any order */
    size_t need = c->key == 1 ? n : n / 2;
    if (kvr_grow((void **)&c->text, &c->cap, need + 1, SIZE_MAX / 2, 1) != 0) {
        snprintf(c->why, sizeof c->why, "out of memory");
        c->bad = true;
        return 0;
    }
    if (c->key == 1) {
        memcpy(c->text, s, n);
    } else {
        for (size_t i = 0; i < n; i += 2) {
            int hi = kvr_hex_digit(s[i]), lo = i + 1 < n ? kvr_hex_digit(s[i + 1]) : -1;
            if (hi < 0 || lo < 0) {
                snprintf(c->why, sizeof c->why, "bytes_hex: not pairs of hex digits");
                c->bad = true;
                return 0;
            }
            c->text[i / 2] = (char)(hi * 16 + lo);
        }
    }
    c->len = need;
    c->have = true;
    c->have_hex = c->key == 2;
    return 1;
}
static int on_key(void *u, const unsigned char *s, size_t n)
{
    line_ctx_t *c = u;
    c->key = 0;
    if (c->depth == 1 && n == 4 && memcmp(s, "text", 4) == 0)
        c->key = 1;
    else if (c->depth == 1 && n == 9 && memcmp(s, "bytes_hex", 9) == 0)
        c->key = 2;
    return 1;
}
static int on_start(void *u)
{
    ((line_ctx_t *)u)->depth++;
    return 1;
}
static int on_end(void *u)
{
    ((line_ctx_t *)u)->depth--;
    return 1;
}
static const yajl_callbacks line_cb = {NULL,     NULL,   NULL,   NULL,     NULL,  on_str,
                                       on_start, on_key, on_end, on_start, on_end};

/* The text of one JSON line into c; false with c->why on error. */
static bool parse_line(line_ctx_t *c, const char *line, size_t n)
{
    c->depth = 0;
    c->key = 0;
    c->have = c->have_hex = c->bad = false;
    c->len = 0;
    yajl_handle h = yajl_alloc(&line_cb, NULL, c);
    if (h == NULL) {
        snprintf(c->why, sizeof c->why, "out of memory");
        return false;
    }
    yajl_status st = yajl_parse(h, (const unsigned char *)line, n);
    if (st == yajl_status_ok)
        st = yajl_complete_parse(h);
    yajl_free(h);
    if (st != yajl_status_ok) {
        if (!c->bad)
            snprintf(c->why, sizeof c->why, "invalid JSON");
        return false;
    }
    if (!c->have) {
        snprintf(c->why, sizeof c->why, "no text (a string member) nor bytes_hex");
        return false;
    }
    return true;
}

static char *put_u32(char *p, uint32_t v)
{
    char tmp[12];
    int k = 0;
    do {
        tmp[k++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (k)
        *p++ = tmp[--k];
    return p;
}

int kvr_cmd_tokenize(int argc, char **argv)
{
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter tokenize", argc, argv);
    const char *dir = NULL;
    bool special = true, json = false, stats = false;
    for (c.i = 1; c.i < argc; c.i++) {
        int rc;
        if (kvr_cli_is_help(&c)) {
            usage(stdout);
            return 0;
        } else if (kvr_cli_is(&c, "--tokenizer")) {
            if ((rc = kvr_cli_str(&c, kvr_cli_value(&c), &dir)) != 0)
                return rc;
        } else if (kvr_cli_is(&c, "--no-special")) {
            special = false;
        } else if (kvr_cli_is(&c, "--json")) {
            json = true;
        } else if (kvr_cli_is(&c, "--stats")) {
            stats = true;
        } else if (kvr_cli_is(&c, "--chat")) {
            /* chat: {"messages": [...]} rendered by the chat template (src/tokenizer/tmpl_*),
             * then encoded here; added with the template module. */
            return kvr_cli_fail(&c, "--chat: not available yet (the chat template module)");
        } else {
            return kvr_cli_unknown(&c);
        }
    }
    if (dir == NULL) {
        usage(stderr);
        return 2;
    }
    int st;
    char err[512];
    uint64_t t0 = kvr_now_ns();
    kvr_tok_t *tok = kvr_tok_load(dir, &st, err, sizeof err);
    if (tok == NULL) {
        fprintf(stderr, "kvrouter tokenize: %s\n", err);
        return 1;
    }
    if (stats)
        fprintf(stderr, "kvrouter tokenize: loaded in %.1f ms, vocab %zu, %.1f MB\n",
                (double)(kvr_now_ns() - t0) / 1e6, kvr_tok_vocab_size(tok),
                (double)kvr_tok_bytes(tok) / 1e6);
    line_ctx_t lc = {0};
    char *line = NULL, *out = NULL;
    size_t line_cap = 0, out_cap = 0, ids_cap = 1024, lineno = 0;
    uint32_t *ids = malloc(ids_cap * sizeof *ids);
    int exit_code = ids ? 0 : 1;
    ssize_t got;
    while (ids != NULL && (got = getline(&line, &line_cap, stdin)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        if (n > 0 && line[n - 1] == '\n')
            n--;
        const char *text = line;
        size_t len = n;
        if (json) {
            if (n == 0)
                continue;
            if (!parse_line(&lc, line, n)) {
                printf("{\"error\":{\"line\":%zu,\"message\":\"%s\"}}\n", lineno, lc.why);
                exit_code = 1;
                continue;
            }
            text = lc.text;
            len = lc.len;
        }
        size_t nid = 0;
        int rc = kvr_tok_encode(tok, text, len, special, ids, ids_cap, &nid);
        if (rc == KVR_ETOOBIG) {
            uint32_t *p = realloc(ids, nid * sizeof *ids);
            if (p == NULL) {
                rc = KVR_ENOMEM;
            } else {
                ids = p;
                ids_cap = nid;
                rc = kvr_tok_encode(tok, text, len, special, ids, ids_cap, &nid);
            }
        }
        if (rc != KVR_OK) {
            printf("{\"error\":{\"line\":%zu,\"message\":\"%s\"}}\n", lineno, kvr_strerror(rc));
            exit_code = 1;
            continue;
        }
        if (kvr_grow((void **)&out, &out_cap, nid * 11 + 16, SIZE_MAX / 2, 1) != 0) {
            exit_code = 1;
            break;
        }
        char *p = out;
        if (json) {
            memcpy(p, "{\"ids\":[", 8);
            p += 8;
        }
        for (size_t i = 0; i < nid; i++) {
            if (i)
                *p++ = json ? ',' : ' ';
            p = put_u32(p, ids[i]);
        }
        if (json) {
            *p++ = ']';
            *p++ = '}';
        }
        *p++ = '\n';
        fwrite(out, 1, (size_t)(p - out), stdout);
    }
    if (fflush(stdout) != 0 || ferror(stdin))
        exit_code = 1;
    free(line);
    free(out);
    free(ids);
    free(lc.text);
    kvr_tok_free(tok);
    return exit_code;
}
