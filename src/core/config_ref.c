/*
 * config_ref.c: the reference's (Dynamo's) spellings of the settings, so a command line or a
 * deployment's environment written for Dynamo's router starts this one (see kvrouter/config.h,
 * kvr_config_ref_*). Three kinds of name:
 *   a setting of ours under another name     --router-kv-overlap-score-credit, DYN_KV_CACHE_BLOCK_SIZE,
 *                                            --no-router-kv-events (a bare flag with its value)
 *   accepted, with no effect here (said why) --router-event-threads (the ingest is one thread)
 *   refused (said why)                       --router-durable-kv-events (no JetStream here)
 * Besides the table, `--router-X` and `DYN_ROUTER_X` name our setting `router_X` or `X` when one
 * exists, and `--no-router-X` / `--router-X` without a value set a boolean one. A DYN_* variable
 * that is none of these is reported as not read.
 * Invariants: every table entry names a setting that exists (test_config checks it); a name
 * resolves the same way as a flag and as a variable. Threads: none (pure). Cost: a table scan.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "kvrouter/config.h"
#include "kvrouter/status.h"

typedef struct ref_name {
    const char *ref;     /* a flag ("--...") or a variable ("DYN_...") */
    kvr_ref_kind_t kind;
    const char *setting; /* ours (KVR_REF_SETTING) */
    const char *value;   /* a bare flag's value; NULL: it takes one */
    const char *why;     /* KVR_REF_IGNORED / KVR_REF_REFUSED */
} ref_name_t;

#define SET(r, s) {r, KVR_REF_SETTING, s, NULL, NULL}
#define BARE(r, s, v) {r, KVR_REF_SETTING, s, v, NULL}
#define IGNORED(r, w) {r, KVR_REF_IGNORED, NULL, NULL, w}
#define REFUSED(r, w) {r, KVR_REF_REFUSED, NULL, NULL, w}

static const char NO_THREADS[] =
    "one ingest thread applies every engine's events to an index read without locks (RCU): "
    "there is no pool to size";
static const char NO_JETSTREAM[] =
    "there is no JetStream event stream here: events come over ZeroMQ from each engine, a "
    "restart resumes from state_file or a peer (docs/serve.md)";

static const ref_name_t NAMES[] = {
    SET("--router-kv-overlap-score-weight", "overlap_score_weight"),
    SET("--kv-overlap-score-weight", "overlap_score_weight"),
    SET("DYN_ROUTER_KV_OVERLAP_SCORE_WEIGHT", "overlap_score_weight"),
    SET("DYN_OVERLAP_SCORE_WEIGHT", "overlap_score_weight"),
    SET("--router-kv-overlap-score-credit", "overlap_score_credit"),
    SET("DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT", "overlap_score_credit"),
    SET("--router-kv-overlap-score-credit-decay", "overlap_score_credit_decay"),
    SET("DYN_ROUTER_KV_OVERLAP_SCORE_CREDIT_DECAY", "overlap_score_credit_decay"),
    BARE("--router-kv-events", "use_kv_events", "true"),
    BARE("--no-router-kv-events", "use_kv_events", "false"),
    BARE("--kv-events", "use_kv_events", "true"),
    BARE("--no-kv-events", "use_kv_events", "false"),
    SET("DYN_ROUTER_USE_KV_EVENTS", "use_kv_events"),
    SET("--kv-cache-block-size", "block_size"),
    SET("--router-block-size", "block_size"),
    SET("DYN_KV_CACHE_BLOCK_SIZE", "block_size"),
    SET("DYN_ROUTER_BLOCK_SIZE", "block_size"),
    SET("--router-session-affinity-ttl-secs", "session_ttl_secs"),
    SET("DYN_ROUTER_SESSION_AFFINITY_TTL_SECS", "session_ttl_secs"),
    BARE("--serve-indexer", "serve_indexer", "true"),
    BARE("--no-serve-indexer", "serve_indexer", "false"),
    SET("DYN_SERVE_INDEXER", "serve_indexer"),
    SET("--http-host", "bind"),
    SET("DYN_HTTP_HOST", "bind"),
    SET("DYN_HTTP_PORT", "http_port"),
    SET("DYN_ROUTER_MIN_INITIAL_WORKERS", "min_initial_workers"),
    IGNORED("--router-event-threads", NO_THREADS),
    IGNORED("DYN_ROUTER_EVENT_THREADS", NO_THREADS),
    IGNORED("--router-snapshot-threshold", NO_JETSTREAM),
    IGNORED("DYN_ROUTER_SNAPSHOT_THRESHOLD", NO_JETSTREAM),
    REFUSED("--router-durable-kv-events", NO_JETSTREAM),
    REFUSED("--durable-kv-events", NO_JETSTREAM),
    REFUSED("DYN_ROUTER_DURABLE_KV_EVENTS", NO_JETSTREAM),
    REFUSED("--router-reset-states", NO_JETSTREAM),
    REFUSED("DYN_ROUTER_RESET_STATES", NO_JETSTREAM),
    REFUSED("--router-prefill-load-model",
            "the prompt-side load model is not implemented here (only 'none': the static "
            "prompt load)"),
    REFUSED("DYN_ROUTER_PREFILL_LOAD_MODEL",
            "the prompt-side load model is not implemented here (only 'none': the static "
            "prompt load)"),
    REFUSED("--use-remote-indexer",
            "name the indexer instead: --remote-indexer http://HOST:PORT or --remote-indexer "
            "nats (docs/indexer.md)"),
    REFUSED("DYN_USE_REMOTE_INDEXER",
            "name the indexer instead: KVR_REMOTE_INDEXER=http://HOST:PORT or nats "
            "(docs/indexer.md)"),
};

#define N_NAMES (sizeof NAMES / sizeof NAMES[0])

static kvr_config_ref_t from_entry(const ref_name_t *e)
{
    return (kvr_config_ref_t){e->kind, e->setting, e->value, e->why};
}

/* "router-kv-events" / "ROUTER_KV_EVENTS" -> "router_kv_events" into out; false when too long. */
static bool snake(const char *s, char *out, size_t cap)
{
    size_t n = strlen(s);
    if (n == 0 || n >= cap)
        return false;
    for (size_t i = 0; i <= n; i++)
        out[i] = s[i] == '-' ? '_' : (char)tolower((unsigned char)s[i]);
    return true;
}

/* A setting of ours for the reference's router_X: router_X itself, else X. */
static const char *ours(const char *snake_name, char *buf, size_t cap)
{
    if (strncmp(snake_name, "router_", 7) != 0)
        return NULL;
    if (kvr_config_has(snake_name)) {
        snprintf(buf, cap, "%s", snake_name);
        return buf;
    }
    if (kvr_config_has(snake_name + 7)) {
        snprintf(buf, cap, "%s", snake_name + 7);
        return buf;
    }
    return NULL;
}

kvr_config_ref_t kvr_config_ref_flag(const char *flag, char *buf, size_t cap)
{
    kvr_config_ref_t none = {KVR_REF_NONE, NULL, NULL, NULL};
    for (size_t i = 0; i < N_NAMES; i++)
        if (strcmp(NAMES[i].ref, flag) == 0)
            return from_entry(&NAMES[i]);
    if (strncmp(flag, "--", 2) != 0 || kvr_config_has(flag))
        return none;
    bool negated = strncmp(flag, "--no-", 5) == 0;
    char name[96];
    if (!snake(flag + (negated ? 5 : 2), name, sizeof name))
        return none;
    const char *s = ours(name, buf, cap);
    if (s == NULL)
        return none;
    if (negated && !kvr_config_is_bool(s))
        return none;
    return (kvr_config_ref_t){KVR_REF_SETTING, s, negated ? "false" : NULL, NULL};
}

int kvr_config_ref_verify(char *msg, size_t msg_len)
{
    kvr_router_config_t probe;
    kvr_config_defaults(&probe);
    for (size_t i = 0; i < N_NAMES; i++) {
        const ref_name_t *e = &NAMES[i];
        bool flag = strncmp(e->ref, "--", 2) == 0, var = strncmp(e->ref, "DYN_", 4) == 0;
        bool ok = flag || var;
        if (ok && e->kind == KVR_REF_SETTING)
            ok = kvr_config_has(e->setting) && (e->value == NULL || flag) &&
                 (e->value == NULL ||
                  kvr_config_set(&probe, e->setting, e->value, NULL, 0) == KVR_OK);
        else if (ok)
            ok = e->why != NULL && e->setting == NULL;
        if (!ok) {
            if (msg != NULL && msg_len > 0)
                snprintf(msg, msg_len, "reference name %s: its entry is inconsistent", e->ref);
            return KVR_EINVAL;
        }
    }
    return KVR_OK;
}

const char *kvr_config_ref_value_note(const char *setting, const char *value)
{
    char key[64];
    if (!snake(setting[0] == '-' ? setting + 2 : setting, key, sizeof key))
        return NULL;
    if (strcmp(key, "router_selection_policy") == 0 && strcmp(value, "default") == 0)
        return "router_selection_policy 'default' (the reference's keyword) reads as locality, "
               "this router's default; the reference's own cost function is 'dynamo'";
    return NULL;
}

kvr_config_ref_t kvr_config_ref_env(const char *var, char *buf, size_t cap)
{
    kvr_config_ref_t none = {KVR_REF_NONE, NULL, NULL, NULL};
    for (size_t i = 0; i < N_NAMES; i++)
        if (strcmp(NAMES[i].ref, var) == 0)
            return from_entry(&NAMES[i]);
    char name[96];
    if (strncmp(var, "DYN_", 4) != 0 || !snake(var + 4, name, sizeof name))
        return none;
    const char *s = ours(name, buf, cap);
    return s != NULL ? (kvr_config_ref_t){KVR_REF_SETTING, s, NULL, NULL} : none;
}

int kvr_config_from_ref_env(kvr_router_config_t *cfg, char *const *envp,
                            void (*note)(void *arg, const char *line), void *arg, char *err,
                            size_t err_len)
{
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *kv = envp[i];
        const char *eq = strchr(kv, '=');
        char var[128], line[400], buf[96];
        if (strncmp(kv, "DYN_", 4) != 0 || eq == NULL || (size_t)(eq - kv) >= sizeof var)
            continue;
        memcpy(var, kv, (size_t)(eq - kv));
        var[eq - kv] = '\0';
        kvr_config_ref_t r = kvr_config_ref_env(var, buf, sizeof buf);
        switch (r.kind) {
        case KVR_REF_NONE:
            snprintf(line, sizeof line, "!environment %s: not read by kvrouter (no setting of "
                     "ours has that meaning; `kvrouter serve --help` lists them)", var);
            break;
        case KVR_REF_IGNORED:
            snprintf(line, sizeof line, "environment %s: accepted, no effect here: %s", var,
                     r.why);
            break;
        case KVR_REF_REFUSED:
            if (err != NULL && err_len > 0)
                snprintf(err, err_len, "environment %s (the reference's): not supported: %s",
                         var, r.why);
            return KVR_EINVAL;
        case KVR_REF_SETTING: {
            char e[200];
            int rc = kvr_config_set(cfg, r.setting, eq + 1, e, sizeof e);
            if (rc != KVR_OK) {
                if (err != NULL && err_len > 0)
                    snprintf(err, err_len, "environment %s (read as %s): %s", var, r.setting,
                             e);
                return rc;
            }
            snprintf(line, sizeof line, "reference name %s read as %s", var, r.setting);
            const char *vnote = kvr_config_ref_value_note(r.setting, eq + 1);
            if (vnote != NULL && note != NULL)
                note(arg, vnote);
            break;
        }
        }
        if (note != NULL)
            note(arg, line);
    }
    return KVR_OK;
}
