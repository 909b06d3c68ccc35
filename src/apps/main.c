/*
 * main.c: the kvrouter binary; dispatches to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include "apps/apps.h"
#include "kvrouter.h"

typedef struct subcommand {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} subcommand_t;

static const subcommand_t SUBCOMMANDS[] = {
    {"serve", kvr_cmd_serve, "the router daemon: OpenAI front end and routing API, KV events over ZeroMQ"},
    {"mocker", kvr_cmd_mocker,
     "a simulated vLLM engine: KV cache, batching, timing, KV events, OpenAI HTTP"},
    {"indexer", kvr_cmd_indexer,
     "a standalone KV indexer: per-model prefix indexes fed by KV events, HTTP queries"},
    {"top", kvr_cmd_top,
     "a router's live view in the terminal: figures, sparklines, one row per worker rank"},
    {"register", kvr_cmd_register,
     "keep an engine's entry in the NATS discovery bucket until stopped (a sidecar)"},
    {"trace", kvr_cmd_trace,
     "Mooncake traces: stats (lengths, rate, repeats, hit-ratio ceilings), gen (synthetic "
     "workloads), synth (a scaled copy of a trace's shape)"},
    {"hash", kvr_cmd_hash, "block and sequence hashes of JSON-lines prompts (engine parity)"},
    {"tokenize", kvr_cmd_tokenize, "token ids of prompts from a tokenizer.json, as HF tokenizers computes them"},
    {"bench", kvr_cmd_bench, "benchmarks: hash, index, ingest, events, route, mocker, frontend, all"},
    {"sim", kvr_cmd_sim, "a trace through the router core and simulated engines in virtual time"},
    {"replay", kvr_cmd_replay,
     "a trace replayed open loop against a live endpoint: TTFT, ITL, latency, cache hits"},
    {"demo", kvr_cmd_demo,
     "router + mocker engines on loopback, a trace replayed per policy: table and plot"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: kvrouter <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++)
        fprintf(out, "  %-8s %s\n", SUBCOMMANDS[i].name, SUBCOMMANDS[i].summary);
    fprintf(out, "\n'kvrouter <command> --help' describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kvrouter %s\n", KVR_VERSION_STRING);
        return 0;
    }
    for (size_t i = 0; i < sizeof SUBCOMMANDS / sizeof SUBCOMMANDS[0]; i++) {
        if (strcmp(argv[1], SUBCOMMANDS[i].name) == 0)
            return SUBCOMMANDS[i].run(argc - 1, argv + 1);
    }
    fprintf(stderr, "kvrouter: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
