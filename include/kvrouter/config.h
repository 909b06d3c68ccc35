/*
 * config.h: the router's configuration (Dynamo's KV router settings, plus kvrouter's own bounds),
 * one table of fields with types, defaults and ranges, settable by name from the command line
 * (--router-temperature 0.5), the environment (KVR_ROUTER_TEMPERATURE=0.5) and a config file
 * of `name = value` lines. Every value is validated when set and the whole struct again before
 * start-up (cross-field rules); an error names the field and the problem.
 * Ownership: the caller's struct, no allocation. Threads: any (pure). Cost: O(fields).
 */
#ifndef KVR_CONFIG_H
#define KVR_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvrouter/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVR_CONFIG_DEFAULT_TREE_SIZE 1048576u /* router_max_tree_size's default */

/* Where the router learns its workers: its flags and POST /v1/workers only, or also the
 * NATS bucket <namespace>_workers. */
/* What the front end does when its in-process tokenizer and a worker's /tokenize disagree on
 * the probe prompts: refuse (the model goes back to the workers' /tokenize), warn (keep it,
 * log), off (no probe). */
typedef enum kvr_tokenizer_check {
    KVR_TOKCHECK_REFUSE = 0,
    KVR_TOKCHECK_WARN,
    KVR_TOKCHECK_OFF
} kvr_tokenizer_check_t;

/* What the router does when a rank's predicted cached tokens stop agreeing with what its
 * engine reports (prediction_drift_*): resync (drop the rank's index state and replay its
 * engine's replay buffer), approximate (route the rank on its own decisions until its events
 * agree again), flag (mark and log only). */
typedef enum kvr_drift_action {
    KVR_DRIFT_RESYNC = 0,
    KVR_DRIFT_APPROXIMATE,
    KVR_DRIFT_FLAG
} kvr_drift_action_t;

typedef enum kvr_discovery_mode {
    KVR_DISCOVERY_STATIC = 0,
    KVR_DISCOVERY_NATS
} kvr_discovery_mode_t;

/* When a request of a disaggregated fleet skips its remote prefill (docs/disagg.md). */
typedef enum kvr_disagg_policy {
    KVR_DISAGG_ALWAYS = 0, /* every request is prefilled remotely while prefill workers serve */
    KVR_DISAGG_ISL,        /* not when the best decode worker's cache leaves few new tokens */
    KVR_DISAGG_LOAD,       /* not when every prefill worker is busy */
    KVR_DISAGG_ISL_OR_LOAD,
} kvr_disagg_policy_t;

/* The selection policy of the cache-aware modes (kv, approx): how a candidate's cost is
 * computed (docs/sim.md compares them; core/policy_<name>.c implements each). */
typedef enum kvr_select_policy {
    KVR_SELECT_POLICY_DYNAMO = 0,   /* the reference's: prefill_load_scale * adjusted prefill +
                                       decode (+ requests) */
    KVR_SELECT_POLICY_LMETRIC = 1,  /* adjusted prefill * (decode + 1) */
    KVR_SELECT_POLICY_LOCALITY = 2, /* lmetric with cached device blocks credited twice (the
                                       router's default: docs/sim.md) */
} kvr_select_policy_t;

/* The order of the queue of requests waiting while every worker is busy (reference 5.7). */
typedef enum kvr_queue_order {
    KVR_QUEUE_ORDER_FCFS = 0, /* max(priority_jump, 0) - arrival_offset_secs */
    KVR_QUEUE_ORDER_WSPT = 1, /* (1 + max(priority_jump, 0)) / cost_tokens */
    KVR_QUEUE_ORDER_LCFS = 2, /* max(priority_jump, 0) + arrival_offset_secs */
} kvr_queue_order_t;

/* How the router picks (core/policy_<name>.c, one file each). */
typedef enum kvr_router_mode {
    KVR_MODE_KV = 0,
    KVR_MODE_ROUND_ROBIN,
    KVR_MODE_RANDOM,
    KVR_MODE_LEAST_LOADED,
    KVR_MODE_APPROX,
    KVR_MODE_DIRECT, /* every request names its worker; the router books, tracks, proxies */
} kvr_router_mode_t;

/* An optional number: `set` false means "unset" (the feature is off). */
typedef struct kvr_opt_f64 {
    /* public */
    bool set;
    double v;
} kvr_opt_f64_t;

typedef struct kvr_router_config {
    /* public: every field, set by name (kvr_config_set) or directly */
    /* hashing and index */
    uint32_t block_size;          /* tokens per KV block; must equal the engines' */
    uint64_t index_max_pairs;     /* budget of (worker, block) pairs in the prefix index */
    uint32_t max_workers;         /* worker rank slots */
    kvr_router_mode_t router_mode;
    bool use_kv_events;           /* false = approximate mode */
    /* cost function (5.4) */
    double overlap_score_credit; /* 0 in kv mode: no index, no KV events (kvr_config_uses_index) */
    kvr_opt_f64_t overlap_score_weight; /* deprecated alias, applied by kvr_config_resolve */
    double overlap_score_credit_decay;
    double prefill_load_scale;
    double decode_active_request_weight;
    double host_cache_hit_weight;
    double disk_cache_hit_weight;
    double router_temperature;
    kvr_select_policy_t router_selection_policy;
    double router_step_wait_weight; /* locality: blocks per ms of the running step's wait */
    double router_inflight_credit_weight; /* credit per block in flight, not yet reported */
    /* load tracking (4) */
    bool router_track_active_blocks;
    bool router_track_output_blocks;
    bool router_assume_kv_reuse;
    bool router_track_prefill_tokens;
    uint64_t router_request_expiry_ms;
    uint64_t router_max_requests;
    uint64_t router_max_prompt_tokens; /* longer prompts are refused before hashing (S21) */
    /* approximate mode (3.7) */
    double router_ttl_secs;
    uint64_t router_max_tree_size;
    double router_prune_target_ratio;
    /* queue (5.7) and busy thresholds (5.8) */
    kvr_opt_f64_t router_queue_threshold;
    kvr_queue_order_t router_queue_policy;
    uint64_t router_queue_max_requests;
    uint64_t router_queue_max_isl_tokens;
    uint64_t router_queue_timeout_ms;
    kvr_opt_f64_t active_prefill_tokens_threshold;
    kvr_opt_f64_t active_prefill_tokens_threshold_frac;
    kvr_opt_f64_t active_decode_blocks_threshold;
    /* serving */
    uint32_t http_port;
    char bind[64];
    uint64_t http_max_header_bytes; /* request line + headers of one request; above: refused */
    uint64_t http_max_body_bytes;   /* one request's body; above: 413 */
    uint32_t http_max_connections;  /* per listener; above: 503 and close */
    uint64_t http_header_timeout_ms; /* first byte (or accept) to end of head; then 408 */
    uint64_t http_body_timeout_ms;   /* end of head to end of body; then 408 */
    uint64_t http_idle_timeout_ms;   /* kept-alive connection between requests; then closed */
    kvr_opt_f64_t admin_port;        /* the admin listener (fleet changes); unset = none */
    char admin_bind[64];
    char api_key_file[512];          /* Bearer token for every endpoint; "" = none */
    char admin_key_file[512];        /* Bearer token for fleet changes; "" = none */
    uint64_t shutdown_grace_ms;      /* SIGTERM: time in-flight answers get to finish */
    uint64_t health_interval_ms;
    uint32_t min_initial_workers; /* requests wait (bounded) until this many workers are ready */
    uint64_t min_initial_workers_wait_ms; /* ... at most this long, then 503 naming the count */
    uint64_t session_ttl_secs;            /* sticky sessions: a binding's idle life; 0 = off */
    uint64_t session_max;                 /* sticky sessions held at most (LRU beyond) */
    bool lora_strict; /* a LoRA no worker declares: refused (else any worker of the model) */
    uint32_t health_failures;     /* consecutive failed probes before a worker is fenced */
    char allowed_worker_hosts[1024]; /* hosts registrations may name; "" = any (endpoint.h) */
    char allowed_ipc_dirs[1024];     /* directories ipc:// events may be under; "" = none */
    char allowed_tokenizer_dirs[1024]; /* directories a registration's tokenizer may be under;
                                          "" = none */
    char state_file[512];         /* warm restart: index + cursors saved on exit, reloaded at
                                     start; "" = off */
    /* scale-out over NATS (net/nats_link.c, net/replica_sync.c) */
    char nats_url[512];           /* "" = no NATS: a single router, as before */
    char nats_namespace[65];      /* prefixes every subject and bucket (setting `namespace`) */
    char nats_creds_file[512];    /* NATS identity: a .creds file, an nkey file, or a token */
    char nats_nkey_file[512];     /* file (at most one of the three; "" = none) */
    char nats_token_file[512];
    char nats_tls_ca[512];        /* TLS to NATS: the CA, and a client certificate and key */
    char nats_tls_cert[512];
    char nats_tls_key[512];
    bool router_replica_sync;     /* share active load with the other replicas */
    uint64_t router_sync_max_peer_requests; /* peers' bookings held at most (apart from local) */
    uint64_t router_sync_max_requests_per_peer; /* ... and at most this many of one peer */
    uint64_t router_sync_max_peer_blocks; /* ... holding at most this many prompt blocks */
    uint64_t nats_presence_ttl_ms; /* a presence entry older than this is gone */
    kvr_discovery_mode_t discovery;
    char peers[2048]; /* routers to load the index from at start; "" = from <ns>_routers */
    char allowed_peer_hosts[1024]; /* hosts a peer url learnt from NATS may name; "" = the
                                      hosts of peers, bind and admin_bind */
    char peer_key_file[512];       /* token replicas send each other for GET /v1/index/snapshot
                                      (accepted there besides the admin key); "" = none */
    /* indexes shared between routers (net/ix_api.c, net/remote_indexer.c) */
    bool serve_indexer;       /* answer the indexer API's /query, /query_by_hash, /dump */
    char remote_indexer[512]; /* route with overlaps from this indexer; "" = the local index */
    uint64_t remote_indexer_timeout_ms; /* a remote answer later than this: zero overlap */
    char remote_indexer_key_file[512];       /* its api key, sent with lookups; "" = none */
    char remote_indexer_admin_key_file[512]; /* its admin key, sent with decisions; "" = the
                                                api key's file */
    /* the OpenAI front end (net/frontend.c) */
    uint32_t frontend_max_retries;         /* other workers tried after an upstream failure */
    uint32_t frontend_fence_failures;      /* consecutive upstream failures before fencing */
    uint64_t frontend_upstream_timeout_ms; /* silence on an upstream connection before giving up */
    uint64_t frontend_prefill_timeout_ms;  /* ... on a prefill leg (one token to compute) */
    uint64_t frontend_max_answer_bytes;    /* a non-streaming worker answer above: 502 */
    bool frontend_forward_authorization;   /* client's Authorization header sent to workers */
    bool frontend_chat_token_data;         /* chats sent to workers carry nvext.token_data */
    bool frontend_trust_kv_transfer;       /* client's kv_transfer_params / bootstrap_* forwarded
                                              (a trusted gateway sets them); off: stripped */
    char worker_api_key_file[512];         /* token sent to workers as Bearer; "" = none */
    uint64_t frontend_tokenize_cache_tokens; /* token ids the tokenize cache holds; 0 = off */
    char tokenizers[4096]; /* "MODEL=DIR,...": models tokenized in process; "" = none */
    kvr_tokenizer_check_t tokenizer_check; /* a probe disagreeing with a worker's /tokenize */
    uint32_t frontend_max_idle_connections;  /* kept-alive idle upstream connections per worker */
    uint64_t frontend_max_client_buffer_bytes; /* SSE bytes pending to a slow client; above:
                                                  * the request is aborted (no 0 = no cap) */
    /* disaggregated prefill/decode (net/fe_disagg.c) */
    bool enforce_disagg; /* no prefill worker: 503 (false: served aggregated) */
    kvr_disagg_policy_t disagg_policy;
    uint64_t disagg_isl_threshold; /* isl policy: effective new tokens below it stay local */
    kvr_opt_f64_t disagg_load_threshold; /* load policy: prefill tokens in flight on the chosen
                                            prefill worker at which it counts as busy; unset =
                                            the busy thresholds decide */
    /* the index checking itself (fleet/drift.c) */
    uint32_t prediction_drift_window;       /* answers per rank judged together; 0 = off */
    double prediction_drift_min_accuracy;   /* below it over a full window: drifting */
    kvr_drift_action_t prediction_drift_action;
    uint64_t seed;                /* random tie-breaks and sampling; 0 = random */
} kvr_router_config_t;

/* Fills every field with its default. */
void kvr_config_defaults(kvr_router_config_t *cfg);

/* Sets one field from text. name may be the field name (router_temperature), the flag form
 * (router-temperature, with or without leading dashes) or the environment form
 * (KVR_ROUTER_TEMPERATURE). Returns KVR_OK, KVR_ENOTFOUND (unknown name) or KVR_EINVAL (bad
 * value); err receives "router_temperature: must be a finite number >= 0, got 'nan'". The
 * field is unchanged on error. value "unset" (or "") clears an optional field. */
int kvr_config_set(kvr_router_config_t *cfg, const char *name, const char *value, char *err,
                   size_t err_len);

/* Applies every KVR_* variable of envp (NULL-terminated "NAME=value" strings) that names a
 * field. Unknown KVR_* names are errors, so a typo is not silently ignored. */
int kvr_config_from_env(kvr_router_config_t *cfg, char *const *envp, char *err, size_t err_len);

/* Applies a config file's text: one `name = value` per line, '#' comments, blank lines.
 * err names the line number and the field. */
int kvr_config_from_text(kvr_router_config_t *cfg, const char *text, size_t len, char *err,
                         size_t err_len);

/* Cross-field rules, run before start-up (e.g. router_track_output_blocks requires
 * router_track_active_blocks). */
int kvr_config_validate(const kvr_router_config_t *cfg, char *err, size_t err_len);

/* Applies the settings derived from others, as the reference does, after kvr_config_validate:
 *   - overlap_score_weight (deprecated): set and nonzero, prefill_load_scale = it; set and 0,
 *     prefill_load_scale = 0 and overlap_score_credit = 0; it takes precedence;
 *   - router_mode kv with use_kv_events false becomes approx (approximate mode), unless
 *     overlap_score_credit is 0 (after the line above): then it keeps no index at all, as the
 *     reference's Indexer::None wins (its load-aware preset).
 * Idempotent. note receives one line per derivation ("" when none), for the start-up log. */
void kvr_config_resolve(kvr_router_config_t *cfg, char *note, size_t note_len);

/* Whether the router keeps a prefix index: approx mode, or kv mode with overlap_score_credit
 * > 0 (with credit 0 the reference runs no indexer and subscribes to no KV events) and no
 * remote_indexer (whose index stands in for it). */
bool kvr_config_uses_index(const kvr_router_config_t *cfg);

/* `kvrouter serve --help`'s settings: by group, each as `--flag VALUE`, its meaning wrapped
 * at 80 columns (a setting named in it spelt as its flag) and its default in brackets; the
 * common groups, then the others' names (all: every group). Returns the length it needs (like
 * snprintf); out may be NULL. */
size_t kvr_config_help(char *out, size_t out_len, bool all);
/* msg with every setting named in it (snake_case) spelt as the flag a user types: "router_replica_
 * sync: needs nats_url" -> "--router-replica-sync: needs --nats-url". Like snprintf. */
size_t kvr_config_spell_flags(const char *msg, char *out, size_t out_len);
/* The name of the i-th setting (snake_case), i < kvr_config_count(); NULL past the end. */
size_t kvr_config_count(void);
const char *kvr_config_name(size_t i);

/* True when name (any accepted form) is a config field. */
bool kvr_config_has(const char *name);
/* The router mode's name ("kv", "round-robin", ...), and the policy in force: in kv and approx
 * modes the selection policy ("locality", "dynamo", "lmetric"; the reference's keyword
 * "default" reads as locality), in a load-only mode the mode itself. Static strings. */
const char *kvr_config_mode_name(const kvr_router_config_t *cfg);
const char *kvr_config_policy_name(const kvr_router_config_t *cfg);
/* True when it is a boolean one (a flag naming it alone means true). */
bool kvr_config_is_bool(const char *name);

/* The reference's (Dynamo's router's) names: its flags and DYN_* variables, read as ours. */
typedef enum kvr_ref_kind {
    KVR_REF_NONE,    /* not a reference name (or already one of ours) */
    KVR_REF_SETTING, /* our setting `setting`; a bare flag carries its `value` */
    KVR_REF_IGNORED, /* accepted, no effect here (`why`) */
    KVR_REF_REFUSED, /* not supported here (`why`) */
} kvr_ref_kind_t;

typedef struct kvr_config_ref {
    /* read-only */
    kvr_ref_kind_t kind;
    const char *setting; /* ours, for KVR_REF_SETTING (static, or in the caller's buf) */
    const char *value;   /* a flag that takes no value: the value it stands for; else NULL */
    const char *why;     /* for KVR_REF_IGNORED and KVR_REF_REFUSED */
} kvr_config_ref_t;

/* A reference flag ("--router-kv-overlap-score-credit", "--no-router-kv-events"): what it is
 * here. buf (>= 96 bytes) may hold the setting's name. */
kvr_config_ref_t kvr_config_ref_flag(const char *flag, char *buf, size_t cap);
/* A reference variable ("DYN_ROUTER_TEMPERATURE"). */
kvr_config_ref_t kvr_config_ref_env(const char *var, char *buf, size_t cap);
/* Checks the table of reference names (each names a setting that exists, a bare flag's value
 * is valid for it, ignored and refused ones say why): KVR_OK or KVR_EINVAL with msg. */
int kvr_config_ref_verify(char *msg, size_t msg_len);
/* A note on a value that means something else here than in the reference (router_selection_policy
 * "default"), or NULL. */
const char *kvr_config_ref_value_note(const char *setting, const char *value);
/* Applies every DYN_* variable of envp: a reference name is set as ours (note: "reference name
 * X read as Y"), one with no effect here is noted with why, any other DYN_* is noted as not
 * read, as a warning (the note starts with '!'); a refused one is an error naming it and why
 * (KVR_EINVAL). */
int kvr_config_from_ref_env(kvr_router_config_t *cfg, char *const *envp,
                            void (*note)(void *arg, const char *line), void *arg, char *err,
                            size_t err_len);

#ifdef __cplusplus
}
#endif
#endif /* KVR_CONFIG_H */
