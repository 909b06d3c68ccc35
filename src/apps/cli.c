/*
 * cli.c: the subcommands' shared flag matching and value checks (cli.h).
 */
#include "apps/cli.h"
#include "base/edit.h"
#include "base/namelist.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sim/engine.h"

void kvr_cli_init(kvr_cli_t *c, const char *prog, int argc, char **argv)
{
    *c = (kvr_cli_t){.prog = prog, .argc = argc, .argv = argv, .i = 1, .near_i = -1};
}

bool kvr_cli_is_help(const kvr_cli_t *c)
{
    const char *arg = c->argv[c->i];
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* Keeps name when it is the nearest flag to argv[i] tried so far. */
static void note_near(kvr_cli_t *c, const char *name)
{
    const char *arg = c->argv[c->i];
    char flag[64];
    size_t n = strcspn(arg, "=");
    if (strncmp(arg, "--", 2) != 0 || strncmp(name, "--", 2) != 0 || n >= sizeof flag)
        return;
    memcpy(flag, arg, n);
    flag[n] = '\0';
    size_t d = kvr_edit_distance(flag, name);
    if (c->near_i != c->i || d < c->near_d) {
        c->near = name;
        c->near_d = d;
        c->near_i = c->i;
    }
}

bool kvr_cli_is(kvr_cli_t *c, const char *name)
{
    const char *arg = c->argv[c->i];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0 || (arg[n] != '\0' && arg[n] != '=')) {
        note_near(c, name);
        return false;
    }
    c->flag = name;
    c->eq = arg[n] == '=' ? arg + n + 1 : NULL;
    return true;
}

bool kvr_cli_is_or_old(kvr_cli_t *c, const char *name, const char *old)
{
    if (kvr_cli_is(c, name))
        return true;
    if (!kvr_cli_is(c, old))
        return false;
    fprintf(stderr, "%s: %s is read as %s (its name in every command)\n", c->prog, old, name);
    c->flag = name;
    return true;
}

bool kvr_cli_setting(kvr_cli_t *c, char *name, size_t cap)
{
    const char *arg = c->argv[c->i];
    if (strncmp(arg, "--", 2) != 0)
        return false;
    const char *e = strchr(arg, '=');
    size_t n = e ? (size_t)(e - arg) : strlen(arg);
    if (n >= cap)
        return false;
    memcpy(name, arg, n);
    name[n] = '\0';
    c->flag = name;
    c->eq = e ? e + 1 : NULL;
    return true;
}

const char *kvr_cli_value(kvr_cli_t *c)
{
    if (c->eq != NULL)
        return c->eq;
    if (c->i + 1 < c->argc)
        return c->argv[++c->i];
    return NULL;
}

int kvr_cli_bad(const kvr_cli_t *c, const char *v, const char *why)
{
    fprintf(stderr, "%s: %s %s: %s\n", c->prog, c->flag ? c->flag : "",
            v == NULL ? "(missing)" : *v == '\0' ? "''" : v, why);
    return 2;
}

int kvr_cli_fail(const kvr_cli_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", c->prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

int kvr_cli_unknown(const kvr_cli_t *c)
{
    const char *arg = c->argv[c->i];
    size_t n = strcspn(arg, "=");
    if (arg[0] == '-' && c->near != NULL && c->near_i == c->i &&
        c->near_d <= kvr_edit_limit(n > 2 ? n - 2 : n))
        return kvr_cli_fail(c, "unknown option %.*s (did you mean %s?); see `%s --help`", (int)n,
                            arg, c->near, c->prog);
    if (arg[0] == '-')
        return kvr_cli_fail(c, "unknown option %s (see --help)", arg);
    return kvr_cli_fail(c, "unexpected argument '%s' (see --help)", arg);
}

int kvr_cli_u64(const kvr_cli_t *c, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    /* digits only: strtoull alone takes blanks, a sign, and wraps "-1" to the maximum */
    bool digit = *v >= '0' && *v <= '9';
    char *end = (char *)v;
    errno = 0;
    unsigned long long x = digit ? strtoull(v, &end, 10) : 0;
    if (!digit || *end != '\0' || errno != 0 || x < lo || x > hi) {
        char why[96];
        snprintf(why, sizeof why, "must be an integer in [%llu, %llu]", (unsigned long long)lo,
                 (unsigned long long)hi);
        return kvr_cli_bad(c, v, why);
    }
    *out = x;
    return 0;
}

int kvr_cli_u32(const kvr_cli_t *c, const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
    uint64_t x;
    int rc = kvr_cli_u64(c, v, lo, hi, &x);
    if (rc == 0)
        *out = (uint32_t)x;
    return rc;
}

/* One finite number at p (no leading blank, not out of range); *end after it. */
static bool scan_double(const char *p, double *x, char **end)
{
    if (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '\f' || *p == '\v') {
        *end = (char *)p;
        return false;
    }
    errno = 0;
    *x = strtod(p, end);
    return *end != p && errno != ERANGE && isfinite(*x);
}

int kvr_cli_double(const kvr_cli_t *c, const char *v, double *out)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    char *end;
    double x;
    if (!scan_double(v, &x, &end) || *end != '\0')
        return kvr_cli_bad(c, v, "must be a finite number");
    *out = x;
    return 0;
}

int kvr_cli_pos(const kvr_cli_t *c, const char *v, double *out)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    char *end;
    double x;
    if (!scan_double(v, &x, &end) || *end != '\0' || !(x > 0))
        return kvr_cli_bad(c, v, "must be a finite number > 0");
    *out = x;
    return 0;
}

int kvr_cli_poly(const kvr_cli_t *c, const char *v, double out[3])
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    double x[3];
    const char *p = v;
    for (int k = 0; k < 3; k++) {
        char *end;
        if (!scan_double(p, &x[k], &end) || *end != (k < 2 ? ',' : '\0'))
            return kvr_cli_bad(c, v, "must be three finite numbers A,B,C");
        p = end + 1;
    }
    memcpy(out, x, sizeof x);
    return 0;
}

int kvr_cli_str(const kvr_cli_t *c, const char *v, const char **out)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    *out = v;
    return 0;
}

int kvr_cli_copy(const kvr_cli_t *c, const char *v, char *out, size_t cap)
{
    if (v == NULL || *v == '\0')
        return kvr_cli_bad(c, v, "a value is required");
    size_t n = strlen(v);
    if (n >= cap)
        return kvr_cli_bad(c, v, "too long");
    memcpy(out, v, n + 1);
    return 0;
}

int kvr_cli_log_level(const kvr_cli_t *c, const char *v, int *out)
{
    static const char *const LEVELS[] = {"debug", "info", "warn", "error"};
    size_t k;
    int rc = kvr_cli_choice(c, v, LEVELS, 4, &k);
    if (rc == 0)
        *out = (int)k;
    return rc;
}

int kvr_cli_choice(const kvr_cli_t *c, const char *v, const char *const *names, size_t n,
                   size_t *out)
{
    for (size_t k = 0; v != NULL && k < n; k++) {
        if (strcmp(v, names[k]) == 0) {
            *out = k;
            return 0;
        }
    }
    char why[256] = "must be ";
    size_t len = strlen(why);
    for (size_t k = 0; k < n && len < sizeof why; k++) {
        const char *sep = k == 0 ? "" : k + 1 == n ? " or " : ", ";
        int w = snprintf(why + len, sizeof why - len, "%s%s", sep, names[k]);
        if (w < 0)
            break;
        len += (size_t)w;
    }
    return kvr_cli_bad(c, v, why);
}

int kvr_cli_parse(kvr_cli_t *c, kvr_cli_option_fn option, void *arg, void (*usage)(FILE *out))
{
    for (c->i = 1; c->i < c->argc; c->i++) {
        if (kvr_cli_is_help(c)) {
            usage(stdout);
            return 1;
        }
        int rc = option(c, arg);
        if (rc == -1)
            return kvr_cli_unknown(c);
        if (rc != 0)
            return 2;
    }
    return 0;
}

static int set_poly(kvr_cli_t *c, double *a, double *b, double *d)
{
    double x[3];
    int rc = kvr_cli_poly(c, kvr_cli_value(c), x);
    if (rc == 0) {
        *a = x[0];
        *b = x[1];
        *d = x[2];
    }
    return rc;
}

int kvr_cli_trace_block_size(const kvr_cli_t *c, const char *v, uint32_t *out)
{
    uint32_t bs;
    int rc = kvr_cli_u32(c, v, 1, 512, &bs);
    if (rc == 0 && 512 % bs != 0)
        return kvr_cli_bad(c, v, "must divide 512 (the trace's block)");
    if (rc == 0)
        *out = bs;
    return rc;
}

void kvr_cli_nats_defaults(kvr_cli_nats_t *o)
{
    memset(o, 0, sizeof *o);
    snprintf(o->ns, sizeof o->ns, "kvrouter");
    o->ttl_ms = 3000;
}

int kvr_cli_nats_option(kvr_cli_t *c, kvr_cli_nats_t *o)
{
    if (kvr_cli_is(c, "--nats-url"))
        return kvr_cli_copy(c, kvr_cli_value(c), o->url, sizeof o->url);
    if (kvr_cli_is(c, "--nats-presence-ttl-ms"))
        return kvr_cli_u64(c, kvr_cli_value(c), 300, 3600000, &o->ttl_ms);
    static const struct {
        const char *flag;
        size_t off;
    } files[] = {{"--nats-creds-file", offsetof(kvr_cli_nats_t, creds_file)},
                 {"--nats-nkey-file", offsetof(kvr_cli_nats_t, nkey_file)},
                 {"--nats-token-file", offsetof(kvr_cli_nats_t, token_file)},
                 {"--nats-tls-ca", offsetof(kvr_cli_nats_t, tls_ca)},
                 {"--nats-tls-cert", offsetof(kvr_cli_nats_t, tls_cert)},
                 {"--nats-tls-key", offsetof(kvr_cli_nats_t, tls_key)}};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        if (kvr_cli_is(c, files[i].flag))
            return kvr_cli_copy(c, kvr_cli_value(c), (char *)o + files[i].off, 512);
    if (kvr_cli_is(c, "--namespace")) {
        const char *v = kvr_cli_value(c);
        if (v == NULL || !kvr_token_ok(v))
            return kvr_cli_bad(c, v, "1 to 64 of [A-Za-z0-9_-]");
        return kvr_cli_copy(c, v, o->ns, sizeof o->ns);
    }
    return -1;
}

struct kvr_nats_auth kvr_cli_nats_auth(const kvr_cli_nats_t *o)
{
    return (struct kvr_nats_auth){.creds_file = o->creds_file,
                                  .nkey_file = o->nkey_file,
                                  .token_file = o->token_file,
                                  .tls_ca = o->tls_ca,
                                  .tls_cert = o->tls_cert,
                                  .tls_key = o->tls_key};
}

int kvr_cli_engine_option(kvr_cli_t *c, struct kvr_engine_config *e)
{
    kvr_engine_timing_t *t = &e->timing;
    if (kvr_cli_is(c, "--block-size"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, 65536, &e->block_size);
    if (kvr_cli_is(c, "--num-gpu-blocks") || kvr_cli_is(c, "--num-gpu-blocks-override"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &e->num_gpu_blocks);
    if (kvr_cli_is(c, "--max-num-seqs"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &e->max_num_seqs);
    if (kvr_cli_is(c, "--max-num-batched-tokens"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &e->max_num_batched_tokens);
    if (kvr_cli_is(c, "--max-model-len"))
        return kvr_cli_u32(c, kvr_cli_value(c), 2, UINT32_MAX, &e->max_model_len);
    if (kvr_cli_is(c, "--max-waiting"))
        return kvr_cli_u32(c, kvr_cli_value(c), 1, UINT32_MAX, &e->max_waiting);
    if (kvr_cli_is(c, "--prefill-poly"))
        return set_poly(c, &t->prefill_a, &t->prefill_b, &t->prefill_c);
    if (kvr_cli_is(c, "--decode-poly"))
        return set_poly(c, &t->decode_a, &t->decode_b, &t->decode_c);
    if (kvr_cli_is(c, "--decode-min-ms"))
        return kvr_cli_double(c, kvr_cli_value(c), &t->decode_min_ms);
    const char *arg = c->argv[c->i];
    if (strcmp(arg, "--enable-prefix-caching") == 0 ||
        strcmp(arg, "--no-enable-prefix-caching") == 0) {
        e->enable_prefix_caching = arg[2] != 'n';
        return 0;
    }
    if (strcmp(arg, "--enable-chunked-prefill") == 0 ||
        strcmp(arg, "--no-enable-chunked-prefill") == 0) {
        e->enable_chunked_prefill = arg[2] != 'n';
        return 0;
    }
    return -1;
}

const char *kvr_cli_data_file(const char *rel, char *buf, size_t cap)
{
    if (access(rel, R_OK) == 0)
        return rel;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0)
        return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL)
        return NULL;
    *slash = '\0';
    snprintf(buf, cap, "%s/../%s", exe, rel);
    return access(buf, R_OK) == 0 ? buf : NULL;
}
