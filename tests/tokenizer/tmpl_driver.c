/*
 * tmpl_driver.c: the C side of the chat-template oracle test (tests/oracle/tmpl_check.py).
 * Reads the corpus (tests/oracle/chat_corpus.py's JSON lines), renders each request with
 * kvr_tmpl_render against MODELS_DIR/tokenizer-<model>/models/tokenizer_config.json, and
 * writes one JSON line per request as template_oracle.py does: {"id", "ok", "text"} or
 * {"id", "ok": false, "raised", "error"}. The clock is KVR_TMPL_NOW (as the oracle's).
 * Prints the render time per request to stderr. Threads: one. Cost: the renders.
 *
 * A row with a "template" field renders that template (kvr_tmpl_load) instead of a model's.
 * Usage: tmpl_driver MODELS_DIR CORPUS.jsonl > results.jsonl
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <yajl/yajl_tree.h>

#include "kvrouter/status.h"
#include "tokenizer/tmpl.h"

struct model {
    char name[64];
    struct kvr_tmpl *t;
    int rc;
    char err[512];
};

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    size_t k;
    while (p && (k = fread(p + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (n + 1 == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q) {
                free(p);
                p = NULL;
            }
            p = q;
        }
    }
    fclose(f);
    if (p) {
        p[n] = 0;
        *len = n;
    }
    return p;
}

static void json_str(FILE *o, const char *s, size_t n)
{
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", o);
        else if (c < 0x20)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

static const char *str_field(yajl_val row, const char *key)
{
    const char *path[] = {key, NULL};
    yajl_val v = yajl_tree_get(row, path, yajl_t_string);
    return v ? v->u.string : NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tmpl_driver MODELS_DIR CORPUS.jsonl\n");
        return 2;
    }
    const char *now_env = getenv("KVR_TMPL_NOW");
    int64_t now = now_env ? strtoll(now_env, NULL, 10) : 1753000000;
    FILE *in = fopen(argv[2], "r");
    if (!in) {
        perror(argv[2]);
        return 2;
    }
    struct model models[16];
    size_t nmodels = 0;
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    double total_ns = 0;
    long renders = 0;
    while ((got = getline(&line, &cap, in)) > 0) {
        char ebuf[256];
        yajl_val row = yajl_tree_parse(line, ebuf, sizeof ebuf);
        if (!row) {
            fprintf(stderr, "corpus: bad line: %s\n", ebuf);
            return 2;
        }
        const char *id_path[] = {"id", NULL}, *agp_path[] = {"add_generation_prompt", NULL};
        yajl_val id = yajl_tree_get(row, id_path, yajl_t_number);
        yajl_val agp = yajl_tree_get(row, agp_path, yajl_t_any);
        const char *model = str_field(row, "model");
        const char *messages = str_field(row, "messages");
        const char *tools = str_field(row, "tools");
        const char *kwargs = str_field(row, "kwargs");
        if (!id || !model || !messages || strlen(model) >= 64) {
            fprintf(stderr, "corpus: a line without id, model or messages\n");
            return 2;
        }
        struct model *m = NULL, one;
        const char *tsrc = str_field(row, "template");
        if (tsrc) { /* a bare template (tests/oracle/jinja_cases.py) */
            m = &one;
            memset(m, 0, sizeof *m);
            m->rc = kvr_tmpl_load(tsrc, strlen(tsrc), NULL, &m->t, m->err, sizeof m->err);
        }
        for (size_t i = 0; !m && i < nmodels; i++)
            if (strcmp(models[i].name, model) == 0)
                m = &models[i];
        if (!m) {
            if (nmodels == 16)
                return 2;
            m = &models[nmodels++];
            memset(m, 0, sizeof *m);
            snprintf(m->name, sizeof m->name, "%s", model);
            char path[4096];
            snprintf(path, sizeof path, "%s/tokenizer-%s/models/tokenizer_config.json", argv[1],
                     model);
            size_t len;
            char *cfg = slurp(path, &len);
            if (!cfg) {
                m->rc = KVR_EIO;
                snprintf(m->err, sizeof m->err, "cannot read %.400s", path);
            } else {
                m->rc = kvr_tmpl_load_config(cfg, len, NULL, &m->t, m->err, sizeof m->err);
                free(cfg);
            }
            if (m->rc)
                fprintf(stderr, "%s: not loaded: %s (%s)\n", model, m->err, kvr_status_name(m->rc));
        }
        printf("{\"id\": %lld, ", (long long)YAJL_GET_INTEGER(id));
        if (m->rc) {
            printf("\"ok\": false, \"raised\": false, \"error\": ");
            json_str(stdout, m->err, strlen(m->err));
        } else {
            struct kvr_tmpl_input req = {
                .messages = messages,
                .messages_len = strlen(messages),
                .tools = tools,
                .tools_len = tools ? strlen(tools) : 0,
                .kwargs = kwargs,
                .kwargs_len = kwargs ? strlen(kwargs) : 0,
                .add_generation_prompt = agp && YAJL_IS_TRUE(agp),
                .now_s = now,
            };
            char *out = NULL, err[512] = "";
            size_t out_len = 0;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int rc = kvr_tmpl_render(m->t, &req, &out, &out_len, err, sizeof err);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            total_ns += (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
            renders++;
            if (rc == KVR_OK) {
                printf("\"ok\": true, \"text\": ");
                json_str(stdout, out, out_len);
            } else {
                bool raised = strncmp(err, "raise_exception: ", 17) == 0;
                printf("\"ok\": false, \"raised\": %s, \"error\": ", raised ? "true" : "false");
                const char *msg = raised ? err + 17 : err;
                json_str(stdout, msg, strlen(msg));
            }
            free(out);
        }
        printf("}\n");
        if (m == &one)
            kvr_tmpl_free(one.t);
        yajl_tree_free(row);
    }
    free(line);
    fclose(in);
    for (size_t i = 0; i < nmodels; i++)
        kvr_tmpl_free(models[i].t);
    if (renders)
        fprintf(stderr, "tmpl_driver: %ld renders, %.1f us per render\n", renders,
                total_ns / (double)renders / 1000.0);
    return 0;
}
