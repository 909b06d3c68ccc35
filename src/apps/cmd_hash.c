/*
 * cmd_hash.c: `kvrouter hash`, block and sequence hashes of JSON-lines prompts, for parity
 * checks against engines and the reference router.
 *
 * Contract: one output line per non-blank input line, in order: either
 *   {"local_block_hashes":["..."],"sequence_hashes":["..."]}   (u64 as decimal strings)
 * or {"error":{"line":N,"message":"..."}} (N counts every input line from 1, blank ones too).
 * A bad line never stops the run; the exit code is 1 if any line failed (or on an I/O error),
 * 2 on a usage error, else 0.
 * Memory: the input line (getline), the decoder's buffers, the hash arrays and the output line
 * are each reused and grow to the largest line seen.
 * Threads: one. Cost: per line, one JSON pass, one XXH3 per block, one formatted write; stdout
 * is fully buffered unless it is a terminal or --line-buffered is given.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "base/dec.h"
#include "kvrouter.h"
#include "wire/hash_req.h"

typedef struct hash_run {
    kvr_hash_req_t req;
    uint64_t *lbh, *seq;
    size_t cap_blocks;
    char *out;
    size_t out_cap;
    bool line_buffered;
} hash_run_t;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvrouter hash [--line-buffered] < requests.jsonl\n"
            "\n"
            "Reads one JSON object per line on stdin:\n"
            "  {\"tokens\":[...], \"block_size\":16, \"lora_name\":null, \"cache_namespace\":null,\n"
            "   \"is_eagle\":false, \"block_mm_hashes\":{\"0\":[10754394637803157173]}}\n"
            "(tokens and block_size required; other keys optional, unknown keys ignored) and\n"
            "prints one line per request, hashes as decimal strings:\n"
            "  {\"local_block_hashes\":[\"...\"],\"sequence_hashes\":[\"...\"]}\n"
            "or, for a bad line, {\"error\":{\"line\":N,\"message\":\"...\"}} and goes on.\n"
            "Blank lines are skipped. Exit status: 0 all lines hashed, 1 some line failed,\n"
            "2 usage error.\n"
            "\n"
            "options:\n"
            "  --line-buffered  flush after every output line (to drive it interactively)\n"
            "  -h, --help       this text\n");
}

static bool ensure_out(hash_run_t *run, size_t need)
{
    if (need <= run->out_cap)
        return true;
    size_t cap = run->out_cap < 4096 ? 4096 : run->out_cap;
    while (cap < need)
        cap *= 2;
    char *p = realloc(run->out, cap);
    if (p == NULL)
        return false;
    run->out = p;
    run->out_cap = cap;
    return true;
}

static bool ensure_blocks(hash_run_t *run, size_t n)
{
    if (n <= run->cap_blocks)
        return true;
    size_t cap = run->cap_blocks < 256 ? 256 : run->cap_blocks;
    while (cap < n)
        cap *= 2;
    uint64_t *lbh = realloc(run->lbh, cap * sizeof *lbh);
    if (lbh == NULL)
        return false;
    run->lbh = lbh;
    uint64_t *seq = realloc(run->seq, cap * sizeof *seq);
    if (seq == NULL)
        return false;
    run->seq = seq;
    run->cap_blocks = cap;
    return true;
}

static char *put_u64(char *p, uint64_t v) { return kvr_dec_u64(p, v); }

static char *put_str(char *p, const char *s)
{
    size_t n = strlen(s);
    memcpy(p, s, n);
    return p + n;
}

static char *put_hash_array(char *p, const char *key, const uint64_t *h, size_t n)
{
    *p++ = '"';
    p = put_str(p, key);
    p = put_str(p, "\":[");
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            *p++ = ',';
        *p++ = '"';
        p = put_u64(p, h[i]);
        *p++ = '"';
    }
    *p++ = ']';
    return p;
}

static bool emit(hash_run_t *run, const char *p)
{
    size_t n = (size_t)(p - run->out);
    if (fwrite(run->out, 1, n, stdout) != n)
        return false;
    return !run->line_buffered || fflush(stdout) == 0;
}

/* {"error":{"line":N,"message":"..."}} with the message escaped for JSON. */
static bool emit_error(hash_run_t *run, size_t line_no, const char *msg)
{
    if (!ensure_out(run, 64 + 6 * strlen(msg)))
        return false;
    char *p = run->out;
    p = put_str(p, "{\"error\":{\"line\":");
    p = put_u64(p, line_no);
    p = put_str(p, ",\"message\":\"");
    for (const unsigned char *s = (const unsigned char *)msg; *s; s++) {
        if (*s == '"' || *s == '\\') {
            *p++ = '\\';
            *p++ = (char)*s;
        } else if (*s < 0x20) {
            static const char HEX[] = "0123456789abcdef";
            p = put_str(p, "\\u00");
            *p++ = HEX[*s >> 4];
            *p++ = HEX[*s & 15];
        } else {
            *p++ = (char)*s;
        }
    }
    p = put_str(p, "\"}}\n");
    return emit(run, p);
}

/* Hashes one decoded request and writes its line. Returns false on an I/O or memory error
 * (reported by the caller); a hashing error becomes an error line and *failed. */
static bool hash_line(hash_run_t *run, size_t line_no, const char *line, size_t len,
                      bool *failed)
{
    kvr_hash_req_t *req = &run->req;
    if (kvr_hash_req_parse(req, line, len) != KVR_OK) {
        *failed = true;
        return emit_error(run, line_no, req->err);
    }
    size_t n = kvr_hash_n_blocks(req->n_tokens, req->block_size, req->opts.is_eagle);
    if (!ensure_blocks(run, n) || !ensure_out(run, 64 + 2 * n * 24))
        return false;
    long got = kvr_hash_blocks(req->tokens, req->n_tokens, req->block_size, &req->opts,
                               run->lbh, run->cap_blocks);
    if (got < 0) {
        char msg[128];
        snprintf(msg, sizeof msg, "hashing failed: %s", kvr_strerror((int)got));
        *failed = true;
        return emit_error(run, line_no, msg);
    }
    kvr_hash_chain(run->lbh, (size_t)got, run->seq);
    char *p = run->out;
    *p++ = '{';
    p = put_hash_array(p, "local_block_hashes", run->lbh, (size_t)got);
    *p++ = ',';
    p = put_hash_array(p, "sequence_hashes", run->seq, (size_t)got);
    p = put_str(p, "}\n");
    return emit(run, p);
}

static bool is_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    }
    return true;
}

int kvr_cmd_hash(int argc, char **argv)
{
    hash_run_t run;
    memset(&run, 0, sizeof run);
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter hash", argc, argv);
    for (; c.i < argc; c.i++) {
        if (kvr_cli_is_help(&c)) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[c.i], "--line-buffered") == 0) {
            run.line_buffered = true;
            continue;
        }
        kvr_cli_unknown(&c);
        usage(stderr);
        return 2;
    }
    if (!run.line_buffered && !isatty(STDOUT_FILENO))
        setvbuf(stdout, NULL, _IOFBF, (size_t)1 << 16);

    kvr_hash_req_init(&run.req);
    char *line = NULL;
    size_t line_cap = 0;
    size_t line_no = 0;
    bool failed = false, io_ok = true;
    ssize_t got;
    while ((got = getline(&line, &line_cap, stdin)) >= 0) {
        line_no++;
        size_t len = (size_t)got;
        if (is_blank(line, len))
            continue;
        if (!hash_line(&run, line_no, line, len, &failed)) {
            io_ok = false;
            fprintf(stderr, "kvrouter hash: line %zu: %s\n", line_no,
                    ferror(stdout) ? "write error" : "out of memory");
            break;
        }
    }
    if (io_ok && ferror(stdin)) {
        fprintf(stderr, "kvrouter hash: read error: %s\n", strerror(errno));
        io_ok = false;
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (io_ok)
            fprintf(stderr, "kvrouter hash: write error: %s\n", strerror(errno));
        io_ok = false;
    }
    free(line);
    free(run.lbh);
    free(run.seq);
    free(run.out);
    kvr_hash_req_deinit(&run.req);
    return (failed || !io_ok) ? 1 : 0;
}
