/*
 * cmd_trace_gen.c: `kvrouter trace gen` (a synthetic workload, sim/trace_gen.h) and `kvrouter
 * trace synth --from FILE` (a scaled trace of a given one's shape, sim/trace_synth.h), both
 * writing Mooncake JSON lines to stdout or --output. Seeded: the same flags give the same
 * file. Cost: the trace is built in memory, then written.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "kvrouter.h"
#include "wire/trace.h"
#include "sim/trace_gen.h"
#include "sim/trace_synth.h"

typedef struct gen_args {
    kvr_tracegen_config_t g;
    kvr_synth_config_t s;
    const char *from, *output;
    uint64_t requests;
} gen_args_t;

static void gen_usage(FILE *out)
{
    fprintf(out, "usage: kvrouter trace gen [options] > trace.jsonl\n\n"
                 "A synthetic Mooncake trace (timestamp, input_length, output_length, hash_ids),\n"
                 "seeded: the same options give the same file. Workloads (docs/sim.md states\n"
                 "every distribution):\n"
                 "  chat   multi-turn sessions: each turn extends the previous prompt with its\n"
                 "         answer and a new message; 8 shared system prompts\n"
                 "  agent  tool-use loops over 6 agent types' long system prompt and tool schema,\n"
                 "         short appended steps, parallel sub-agents (bursts)\n"
                 "  rag    questions over 1-3 long documents of a shared pool (Zipf popularity)\n"
                 "  mix    all three: 40%% chat, 30%% agent, 30%% rag of the rate\n"
                 "  fanout a new long document with 3-17 questions sent together (within\n"
                 "         50 ms, inside one prefill of the document), sometimes a reduce\n"
                 "         call after the answers: the burst KV events report too late\n\n"
                 "  --workload NAME   chat | agent | rag | mix | fanout [chat]\n"
                 "  --rate R          requests per second [4]\n"
                 "  --duration S      seconds of arrivals [600]\n"
                 "  --requests N      stop after the first N requests (the duration is then\n"
                 "                    N / rate unless given)\n"
                 "  --arrival A       poisson | gamma [poisson]: how sessions, tasks and\n"
                 "                    questions arrive\n"
                 "  --cv X            gamma: coefficient of variation of the gaps [2]\n"
                 "  --docs N          rag: documents in the pool [1000]\n"
                 "  --seed N          [1]\n"
                 "  --output FILE     instead of stdout\n");
}

static void synth_usage(FILE *out)
{
    fprintf(out, "usage: kvrouter trace synth --from FILE [options] > trace.jsonl\n\n"
                 "A new trace with the prefix-tree shape of FILE (its rows' shared prefixes and\n"
                 "own tails), scaled:\n"
                 "  --rate-scale X    request rate x X (timestamps / X) [1]\n"
                 "  --users-scale N   N independent copies of the shared prefixes, each row once\n"
                 "                    per copy [1]\n"
                 "  --prompt-scale X  each row's own (unshared) blocks x X [1]\n"
                 "  --prefix-scale X  shared prefixes x X [1]\n"
                 "  --requests N      the first N rows [all]\n"
                 "  --seed N          [1]\n"
                 "  --output FILE     instead of stdout\n");
}

static int gen_option(kvr_cli_t *c, void *arg)
{
    gen_args_t *a = arg;
    static const char *const ARRIVALS[] = {"poisson", "gamma"};
    static const char *const WORKLOADS[] = {"chat", "agent", "rag", "mix", "fanout"};
    size_t k;
    int rc;
    if (kvr_cli_is(c, "--workload")) {
        rc = kvr_cli_choice(c, kvr_cli_value(c), WORKLOADS, sizeof WORKLOADS / sizeof *WORKLOADS, &k);
        a->g.workload = (kvr_workload_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--arrival")) {
        rc = kvr_cli_choice(c, kvr_cli_value(c), ARRIVALS, 2, &k);
        a->g.arrival = (kvr_arrival_t)k;
        return rc;
    }
    if (kvr_cli_is(c, "--rate"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->g.rate);
    if (kvr_cli_is(c, "--duration"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->g.duration_s);
    if (kvr_cli_is(c, "--cv"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->g.cv);
    if (kvr_cli_is(c, "--docs"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 1000000, &a->g.docs);
    if (kvr_cli_is(c, "--requests"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_C(1) << 32, &a->requests);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->g.seed);
    if (kvr_cli_is(c, "--output"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->output);
    return kvr_cli_unknown(c);
}

static int synth_option(kvr_cli_t *c, void *arg)
{
    gen_args_t *a = arg;
    if (kvr_cli_is(c, "--from"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->from);
    if (kvr_cli_is(c, "--rate-scale"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->s.rate_scale);
    if (kvr_cli_is(c, "--users-scale"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 100000, &a->s.users_scale);
    if (kvr_cli_is(c, "--prompt-scale"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->s.prompt_scale);
    if (kvr_cli_is(c, "--prefix-scale"))
        return kvr_cli_pos(c, kvr_cli_value(c), &a->s.prefix_scale);
    if (kvr_cli_is(c, "--requests"))
        return kvr_cli_u64(c, kvr_cli_value(c), 1, UINT64_C(1) << 32, &a->requests);
    if (kvr_cli_is(c, "--seed"))
        return kvr_cli_u64(c, kvr_cli_value(c), 0, UINT64_MAX, &a->s.seed);
    if (kvr_cli_is(c, "--output"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->output);
    return kvr_cli_unknown(c);
}

/* Writes t to --output or stdout. 0 or 1 (reported). */
static int write_out(const char *prog, const char *output, const kvr_trace_t *t)
{
    FILE *f = output ? fopen(output, "w") : stdout;
    if (f == NULL) {
        fprintf(stderr, "%s: --output %s: cannot write it\n", prog, output);
        return 1;
    }
    int rc = kvr_trace_write(f, t);
    if (output != NULL && fclose(f) != 0)
        rc = KVR_EIO;
    if (rc != KVR_OK) {
        fprintf(stderr, "%s: writing %s failed\n", prog, output ? output : "stdout");
        return 1;
    }
    return 0;
}

int kvr_cmd_trace_gen(int argc, char **argv)
{
    gen_args_t a = {
        .g = {.workload = KVR_WORKLOAD_CHAT, .rate = 4, .cv = 2, .duration_s = 0, .seed = 1}};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter trace gen", argc, argv);
    int rc = kvr_cli_parse(&c, gen_option, &a, gen_usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.g.duration_s == 0)
        a.g.duration_s = a.requests ? (double)a.requests / a.g.rate * 1.5 + 60 : 600;
    a.g.max_rows = (size_t)a.requests;
    kvr_trace_t t;
    char err[300];
    if (kvr_tracegen_run(&a.g, &t, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "%s", err);
    rc = write_out("kvrouter trace gen", a.output, &t);
    kvr_trace_free(&t);
    return rc;
}

int kvr_cmd_trace_synth(int argc, char **argv)
{
    gen_args_t a = {
        .s = {.rate_scale = 1, .users_scale = 1, .prompt_scale = 1, .prefix_scale = 1, .seed = 1}};
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter trace synth", argc, argv);
    int rc = kvr_cli_parse(&c, synth_option, &a, synth_usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.from == NULL)
        return kvr_cli_fail(&c, "--from FILE is required");
    a.s.max_rows = (size_t)a.requests;
    kvr_trace_t src, t;
    char err[1024];
    if (kvr_trace_load(a.from, 0, &src, err, sizeof err) != KVR_OK) {
        fprintf(stderr, "kvrouter trace synth: --from: %s\n", err);
        return 1;
    }
    rc = kvr_trace_synth(&src, &a.s, &t, err, sizeof err);
    kvr_trace_free(&src);
    if (rc != KVR_OK)
        return kvr_cli_fail(&c, "%s", err);
    rc = write_out("kvrouter trace synth", a.output, &t);
    kvr_trace_free(&t);
    return rc;
}
