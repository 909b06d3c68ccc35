/*
 * cli.h: the command-line helpers every subcommand shares, so that a flag is matched, a value
 * taken and checked, and a bad one reported the same way in each: `--flag VALUE` or
 * `--flag=VALUE`, strict unsigned integers in a range, finite doubles, comma polynomials,
 * bounded strings, one word of a list. A bad value prints one line on stderr,
 *     PROG: --flag VALUE: why        ("(missing)" for VALUE when there is none, '' if empty)
 * and the checker returns 2, the usage-error exit code (apps.h), for the caller to pass up;
 * 0 means the value was stored. Nothing is stored on error.
 *
 * Integers are decimal digits only (no sign, no blanks, no hex) and must fit [lo, hi]; doubles
 * are what strtod reads whole, finite and not out of range, with no leading blank.
 *
 * kvr_cli_parse runs the loop (help, each option, unknown ones); kvr_cli_engine_option is the
 * group of engine flags that `mocker` and `sim` both take.
 *
 * Ownership: a kvr_cli_t borrows argv and the program name; values returned point into argv
 * (or into the caller's name buffer for kvr_cli_setting). Threads: the caller's. Cost: a
 * strncmp per flag tried, nothing allocated.
 */
#ifndef KVR_APPS_CLI_H
#define KVR_APPS_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "nats/nats_auth.h"

struct kvr_engine_config;

typedef struct kvr_cli {
    const char *prog; /* message prefix, e.g. "kvrouter mocker" */
    int argc;
    char **argv;
    int i;            /* the argument being parsed; kvr_cli_value moves it past a value */
    const char *flag; /* the flag matched last (kvr_cli_is, kvr_cli_setting): messages name it */
    const char *eq;   /* its "=VALUE" part (after the '='), or NULL */
    /* the known flag nearest argv[near_i] among those tried on it (kvr_cli_is): a typo's fix */
    const char *near;
    size_t near_d;
    int near_i;
} kvr_cli_t;

void kvr_cli_init(kvr_cli_t *c, const char *prog, int argc, char **argv);

/* argv[i] is "--help" or "-h". */
bool kvr_cli_is_help(const kvr_cli_t *c);

/* argv[i] is `name` or `name=VALUE`: makes it the current flag. */
bool kvr_cli_is(kvr_cli_t *c, const char *name);

/* kvr_cli_is for name, or for its older spelling old (still read, with a note on stderr
 * naming the one every command uses). */
bool kvr_cli_is_or_old(kvr_cli_t *c, const char *name, const char *old);

/* argv[i] is "--NAME" or "--NAME=VALUE" for any NAME (settings looked up by name): copies
 * "--NAME" into name[cap] and makes it the current flag. False when argv[i] does not start
 * with "--" or the name does not fit. */
bool kvr_cli_setting(kvr_cli_t *c, char *name, size_t cap);

/* The current flag's value: after its '=', else the next argument (consumed); NULL if none. */
const char *kvr_cli_value(kvr_cli_t *c);

/* "PROG: FLAG V: why" for the current flag; returns 2. */
int kvr_cli_bad(const kvr_cli_t *c, const char *v, const char *why);

/* "PROG: <printf>"; returns 2. */
int kvr_cli_fail(const kvr_cli_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "PROG: unknown option ARG (did you mean --X?); see `PROG --help`" for argv[i], the
 * suggestion being the nearest flag the parse tried on it when that is a typo's distance away
 * (or "unexpected argument" when it is not an option); returns 2. */
int kvr_cli_unknown(const kvr_cli_t *c);

/* Checkers of a value v (NULL: missing) for the current flag: 0 and *out set, or 2 and the
 * error line. */
int kvr_cli_u64(const kvr_cli_t *c, const char *v, uint64_t lo, uint64_t hi, uint64_t *out);
int kvr_cli_u32(const kvr_cli_t *c, const char *v, uint32_t lo, uint32_t hi, uint32_t *out);
int kvr_cli_double(const kvr_cli_t *c, const char *v, double *out); /* finite */
int kvr_cli_pos(const kvr_cli_t *c, const char *v, double *out);    /* finite, > 0 */
/* "A,B,C": three finite numbers into out[0..2]. */
int kvr_cli_poly(const kvr_cli_t *c, const char *v, double out[3]);
/* Non-empty; *out = v (argv outlives the parse). */
int kvr_cli_str(const kvr_cli_t *c, const char *v, const char **out);
/* Non-empty and shorter than cap; copied with its terminator. */
int kvr_cli_copy(const kvr_cli_t *c, const char *v, char *out, size_t cap);
/* One of names[0..n-1]; *out = its index. The message lists them. */
int kvr_cli_choice(const kvr_cli_t *c, const char *v, const char *const *names, size_t n,
                   size_t *out);

/* debug | info | warn | error: *out the level (base/log.h's order). */
int kvr_cli_log_level(const kvr_cli_t *c, const char *v, int *out);

/* One option at argv[i] (and its value): 0 handled, 2 error (reported), -1 not an option of
 * the command. */
typedef int (*kvr_cli_option_fn)(kvr_cli_t *c, void *arg);

/* The loop of every command: from argv[1], "--help" / "-h" prints usage on stdout and returns
 * 1; otherwise option() runs, and an argument it does not know stops the parse with
 * kvr_cli_unknown. Returns 0 (all parsed), 1 (help shown) or 2 (usage error, reported). */
int kvr_cli_parse(kvr_cli_t *c, kvr_cli_option_fn option, void *arg, void (*usage)(FILE *out));

/* The engine flags `kvrouter mocker` and `kvrouter sim` share, with vLLM's names:
 * --block-size (at most 65536, as the router's), --num-gpu-blocks[-override], --max-num-seqs,
 * --max-num-batched-tokens, --max-model-len, --max-waiting, --prefill-poly, --decode-poly,
 * --decode-min-ms, --[no-]enable-prefix-caching, --[no-]enable-chunked-prefill.
 * A kvr_cli_option_fn's contract: 0, 2, or -1 when argv[i] is none of them. */
int kvr_cli_engine_option(kvr_cli_t *c, struct kvr_engine_config *e);

/* The value of a --block-size for a Mooncake trace: 1..512 and dividing 512 (the trace's
 * block), else reported. 0 or 2, as the kvr_cli_* value parsers. */
int kvr_cli_trace_block_size(const kvr_cli_t *c, const char *v, uint32_t *out);

/* The NATS flags of the engine-side commands (`mocker`, `register`): --nats-url URL,
 * --namespace NS ([A-Za-z0-9_-], default kvrouter), --nats-presence-ttl-ms MS (300..3600000,
 * default 3000), as `serve` names the same settings. */
typedef struct kvr_cli_nats {
    char url[512];
    char ns[65];
    uint64_t ttl_ms;
    /* --nats-creds-file, --nats-nkey-file, --nats-token-file, --nats-tls-ca, --nats-tls-cert,
     * --nats-tls-key: as serve's settings of those names (nats/nats_auth.h) */
    char creds_file[512], nkey_file[512], token_file[512], tls_ca[512], tls_cert[512],
        tls_key[512];
} kvr_cli_nats_t;
/* The link's auth settings from o (pointers into o). */
struct kvr_nats_auth kvr_cli_nats_auth(const kvr_cli_nats_t *o);
/* The usage lines of those options. */
#define KVR_CLI_NATS_AUTH_USAGE                                                                 \
    "  --nats-token-file F           NATS identity: a token, read from F\n"                    \
    "  --nats-nkey-file F            NATS identity: an nkey user (seed and public key lines)\n" \
    "  --nats-creds-file F           NATS identity: a .creds file (JWT and seed)\n"            \
    "  --nats-tls-ca F               TLS to NATS, the server checked against this CA\n"        \
    "  --nats-tls-cert F, --nats-tls-key F  a client certificate and its key\n"
void kvr_cli_nats_defaults(kvr_cli_nats_t *o);
/* A kvr_cli_option_fn's contract: 0, 2, or -1 when argv[i] is none of them. */
int kvr_cli_nats_option(kvr_cli_t *c, kvr_cli_nats_t *o);

/* A data file shipped with the source tree (e.g. "data/traces/conversation_trace.jsonl"):
 * rel itself when readable from the working directory, else <binary's dir>/../rel written into
 * buf when readable there (build/kvrouter run from anywhere), else NULL. */
const char *kvr_cli_data_file(const char *rel, char *buf, size_t cap);

#endif
