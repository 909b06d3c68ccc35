/*
 * cmd_tokenize.c: `kvrouter tokenize`, token ids of prompts with the in-process tokenizer
 * (src/tokenizer), for parity checks against HF tokenizers (tests/oracle) and for scripts.
 *
 * Contract: with --json, one JSON object per input line, {"text": "..."} (or {"bytes_hex":
 * "..."}: the bytes as given, invalid UTF-8 allowed, for the tests of its repair), one output
 * line each, {"ids":[...]} or {"error":{"line":N,"message":"..."}} (N counts every input line
 * from 1); without --json, each input line (its newline removed) is the text and the output
 * line is the ids separated by spaces. A bad line never stops the run; the exit code is 1 if
 * any line failed (or on an I/O error), 2 on a usage error, else 0. With --chat, each line is
 * a /tokenize body as vLLM takes it ({"messages": [...], "add_generation_prompt": true,
 * "tools": [...], "chat_template_kwargs": {...}, ...}, or {"prompt": "..."}), decoded and
 * turned into the conversation vLLM renders (wire/chat_conv.h), rendered by the model's chat
 * template and encoded (tokenizer/model.h); the output line is {"ids":[...],"prompt":"..."}.
 * Memory: the line, the text, the ids and the output are reused, grown to the largest line.
 * Threads: one. Cost: per line, one JSON pass and one encoding.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <yajl/yajl_parse.h>

#include "apps/apps.h"
#include "base/dec.h"
#include "base/hex.h"
#include "apps/cli.h"
#include "base/clock.h"
#include "base/grow.h"
#include "tokenizer/model.h"
#include "tokenizer/tokenizer.h"
#include "wire/chat_conv.h"
#include "wire/json_writer.h"
#include "wire/openai.h"

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
            "  --chat         lines are /tokenize bodies as vLLM takes them ({\"messages\":\n"
            "                 [...], \"add_generation_prompt\": true, \"tools\": ..., ...}):\n"
            "                 rendered by the model's chat template (DIR's\n"
            "                 tokenizer_config.json), then encoded; output\n"
            "                 {\"ids\":[...],\"prompt\":\"the rendered text\"}\n"
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

static char *put_u32(char *p, uint32_t v) { return kvr_dec_u64(p, v); }

/* One --chat line: its output (ids and the rendered prompt) into w; false with why. */
static bool chat_line(kvr_tokmodel_t *m, kvr_tokmodel_scratch_t *s, kvr_oai_decoder_t *dec,
                      kvr_json_writer_t *w, kvr_json_writer_t *cw, const char *line, size_t n,
                      uint32_t **ids, size_t *cap, char *why, size_t whylen)
{
    kvr_oai_request_t rq;
    int st = kvr_oai_decode(dec, KVR_OAI_TOKENIZE, line, n, &rq);
    if (st != KVR_OK) {
        snprintf(why, whylen, "%s", kvr_oai_decoder_error(dec));
        return false;
    }
    if (rq.prompt_kind == KVR_OAI_PROMPT_TOKENS) {
        snprintf(why, whylen, "the prompt is token ids already");
        return false;
    }
    kvr_chat_conv_t cv;
    if ((st = kvr_chat_conv_build(cw, line, n, &rq, &cv)) != KVR_OK || cv.unsupported != NULL) {
        snprintf(why, whylen, "not supported: %s", st != KVR_OK ? kvr_strerror(st) : cv.unsupported);
        return false;
    }
    kvr_tokmodel_input_t in = {.text = rq.text, .text_len = rq.text_len,
                               .add_special = cv.add_special, .continue_final = cv.continue_final,
                               .final = cv.final, .final_len = cv.final_len};
    if (rq.prompt_kind == KVR_OAI_PROMPT_MESSAGES)
        in.chat = (struct kvr_tmpl_input){.messages = cv.messages, .messages_len = cv.messages_len,
                                          .tools = cv.tools, .tools_len = cv.tools_len,
                                          .kwargs = cv.kwargs, .kwargs_len = cv.kwargs_len,
                                          .add_generation_prompt = cv.add_generation_prompt};
    const char *text;
    size_t len, nid;
    st = kvr_tokmodel_ids(m, s, &in, *ids, *cap, &nid, &text, &len, why, whylen);
    if (st == KVR_ETOOBIG && nid > *cap) {
        uint32_t *p = realloc(*ids, nid * sizeof *p);
        if (p == NULL) {
            snprintf(why, whylen, "out of memory");
            return false;
        }
        *ids = p;
        *cap = nid;
        st = kvr_tokmodel_ids(m, s, &in, *ids, *cap, &nid, &text, &len, why, whylen);
    }
    if (st != KVR_OK)
        return false;
    kvr_json_writer_reset(w);
    kvr_json_begin_object(w);
    kvr_json_key(w, "ids");
    kvr_json_begin_array(w);
    for (size_t i = 0; i < nid; i++)
        kvr_json_u64(w, (*ids)[i]);
    kvr_json_end_array(w);
    kvr_json_key(w, "prompt");
    kvr_json_string_n(w, text, len);
    kvr_json_end_object(w);
    return true;
}

/* --chat: every line a /tokenize body; 0, or 1 when a line failed or on an I/O error. */
static int run_chat(const char *dir, bool stats)
{
    int st;
    char err[512];
    uint64_t t0 = kvr_now_ns();
    kvr_tokmodel_t *m = kvr_tokmodel_load(dir, &st, err, sizeof err);
    if (m == NULL) {
        fprintf(stderr, "kvrouter tokenize: %s\n", err);
        return 1;
    }
    if (stats)
        fprintf(stderr, "kvrouter tokenize: loaded in %.1f ms, %.1f MB%s\n",
                (double)(kvr_now_ns() - t0) / 1e6, (double)kvr_tokmodel_bytes(m) / 1e6,
                kvr_tokmodel_has_chat(m) ? ", chat template" : ", no chat template");
    kvr_tokmodel_scratch_t *s = kvr_tokmodel_scratch_new(m);
    kvr_oai_decoder_t *dec = kvr_oai_decoder_new(NULL);
    kvr_json_writer_t w, cw;
    kvr_json_writer_init(&w);
    kvr_json_writer_init(&cw);
    size_t cap = 1024, line_cap = 0, lineno = 0;
    uint32_t *ids = malloc(cap * sizeof *ids);
    char *line = NULL;
    bool ready = s != NULL && dec != NULL && ids != NULL, failed = !ready;
    ssize_t got;
    while (ready && (got = getline(&line, &line_cap, stdin)) >= 0) {
        lineno++;
        size_t n = (size_t)got;
        if (n > 0 && line[n - 1] == '\n')
            n--;
        if (n == 0)
            continue;
        char why[512] = "";
        if (!chat_line(m, s, dec, &w, &cw, line, n, &ids, &cap, why, sizeof why)) {
            failed = true; /* said on its line; the run goes on */
            kvr_json_writer_reset(&w);
            kvr_json_begin_object(&w);
            kvr_json_key(&w, "error");
            kvr_json_begin_object(&w);
            kvr_json_key(&w, "line");
            kvr_json_u64(&w, lineno);
            kvr_json_key(&w, "message");
            kvr_json_string(&w, why);
            kvr_json_end_object(&w);
            kvr_json_end_object(&w);
        }
        const char *j;
        size_t jl;
        if (kvr_json_writer_finish(&w, &j, &jl) == KVR_OK) {
            fwrite(j, 1, jl, stdout);
            fputc('\n', stdout);
        }
    }
    int exit_code = failed ? 1 : 0;
    if (fflush(stdout) != 0 || ferror(stdin))
        exit_code = 1;
    free(line);
    free(ids);
    kvr_json_writer_deinit(&w);
    kvr_json_writer_deinit(&cw);
    kvr_oai_decoder_free(dec);
    kvr_tokmodel_scratch_free(s);
    kvr_tokmodel_free(m);
    return exit_code;
}

int kvr_cmd_tokenize(int argc, char **argv)
{
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter tokenize", argc, argv);
    const char *dir = NULL;
    bool special = true, json = false, stats = false, chat = false;
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
            chat = true;
        } else {
            return kvr_cli_unknown(&c);
        }
    }
    if (dir == NULL) {
        usage(stderr);
        return 2;
    }
    if (chat)
        return run_chat(dir, stats);
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
