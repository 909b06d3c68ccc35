/*
 * config.c: the router configuration table (see config.h).
 *
 * One static table describes every field: its name, type, offset, range and default text.
 * Defaults are applied by parsing that text through the same setter as user input, so the
 * table is the single source of truth for names, defaults, ranges and help.
 * Invariants: a kvr_router_config_t that went through kvr_config_defaults and any number of
 * successful kvr_config_set calls holds only values inside each field's range; a failed set
 * changes nothing.
 * Memory: no allocation. Threads: any (pure functions on the caller's struct).
 * Cost: O(fields) per set (a linear scan of ~40 names).
 */
#include "kvrouter/config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/endpoint.h"
#include "base/edit.h"
#include "base/namelist.h"

typedef enum ftype {
    T_U32,
    T_U64,
    T_F64,
    T_OPT_F64,
    T_BOOL,
    T_ENUM,
    T_STR,
} ftype_t;

/* The groups of `kvrouter serve --help`, in the order shown; the first N_COMMON are shown by
 * --help, every one by --help-all. */
typedef enum fgroup {
    G_WORKERS,
    G_ROUTING,
    G_LISTEN,
    G_SECURITY,
    G_FRONTEND,
    G_LOAD,
    G_QUEUE,
    G_INDEX,
    G_REPLICAS,
    G_INDEXER,
    G_DISAGG,
    N_GROUPS
} fgroup_t;
#define N_COMMON 5
static const char *const GROUP_TITLES[N_GROUPS] = {
    "Workers", "Routing", "Listening", "Security", "OpenAI front end",
    "Load tracking and busy workers", "Router queue",
    "Index: size, self-check, warm restart, approximate mode",
    "Replicas and discovery (NATS)", "Shared indexer", "Disaggregated prefill and decode"};

typedef struct field {
    const char *name;
    ftype_t type;
    size_t off;
    double min, max;       /* numbers: inclusive bounds, unless min_open */
    bool min_open;         /* min is exclusive (e.g. > 0) */
    const char *const *choices; /* T_ENUM: NULL-terminated names, index = value */
    size_t str_cap;        /* T_STR: buffer size */
    const char *def;       /* default, as text ("unset" for optional fields) */
    const char *help;
    fgroup_t group;        /* where --help lists it */
} field_t;

#define OFF(f) offsetof(kvr_router_config_t, f)
#define U32MAX 4294967295.0
#define U64MAX 18446744073709551615.0

static const char *const MODES[] = {"kv",     "round-robin", "random", "least-loaded",
                                    "approx", "direct",      NULL};
static const char *const QPOL[] = {"fcfs", "wspt", "lcfs", NULL};
static const char *const SPOL[] = {"dynamo", "lmetric", "locality", NULL};
static const char *const DISC[] = {"static", "nats", NULL};
static const char *const TOKCHECK[] = {"refuse", "warn", "off", NULL};
static const char *const DRIFT[] = {"resync", "approximate", "flag", NULL};
static const char *const DPOL[] = {"always", "isl", "load", "isl-or-load", NULL};

static const field_t FIELDS[] = {
    {"block_size", T_U32, OFF(block_size), 1, 65536, false, NULL, 0, "16",
     "tokens per KV block; must equal the engines' block size (vLLM --block-size, SGLang "
     "--page-size)", G_WORKERS},
    {"index_max_pairs", T_U64, OFF(index_max_pairs), 1024, 1e12, false, NULL, 0, "16777216",
     "budget of (worker, block) pairs in the prefix index; least-recently-used leaves are evicted "
     "beyond it", G_INDEX},
    {"max_workers", T_U32, OFF(max_workers), 1, 65535, false, NULL, 0, "4096",
     "worker rank slots (worker id x dp rank)", G_WORKERS},
    {"router_mode", T_ENUM, OFF(router_mode), 0, 0, false, MODES, 0, "kv",
     "kv | round-robin | random | least-loaded | approx (approx: no KV events, routing decisions "
     "with a TTL) | direct (every request names its worker: pinned_worker, x-worker-instance-id; "
     "the router only books, tracks and proxies)", G_ROUTING},
    {"use_kv_events", T_BOOL, OFF(use_kv_events), 0, 0, false, NULL, 0, "true",
     "subscribe to the engines' KV events; false (with router_mode kv) = approximate mode", G_ROUTING},
    {"overlap_score_credit", T_F64, OFF(overlap_score_credit), 0, 1e9, false, NULL, 0, "1.0",
     "credit per cached device block against the prefill cost; 0 = pure load balancing (no "
     "index, no KV-event subscription)", G_ROUTING},
    {"overlap_score_weight", T_OPT_F64, OFF(overlap_score_weight), 0, 1e9, false, NULL, 0, "unset",
     "deprecated: nonzero = prefill_load_scale; 0 = prefill_load_scale 0 and overlap_score_credit "
     "0; takes precedence over both (a value other than 0 or 1: router_selection_policy dynamo "
     "only)", G_ROUTING},
    {"overlap_score_credit_decay", T_F64, OFF(overlap_score_credit_decay), 0, 1e9, false, NULL, 0,
     "0.0", "decay of the device credit for workers above the least prefill load", G_ROUTING},
    {"prefill_load_scale", T_F64, OFF(prefill_load_scale), 0, 1e9, false, NULL, 0, "1.0",
     "weight of the adjusted prefill blocks in the cost (router_selection_policy dynamo only: "
     "refused elsewhere)", G_ROUTING},
    {"decode_active_request_weight", T_F64, OFF(decode_active_request_weight), 0, 1e9, false, NULL,
     0, "0.0", "cost per active request (router_selection_policy dynamo only: refused "
     "elsewhere)", G_ROUTING},
    {"host_cache_hit_weight", T_F64, OFF(host_cache_hit_weight), 0, 1, false, NULL, 0, "0.75",
     "credit per block cached in host memory, in [0, 1]", G_ROUTING},
    {"disk_cache_hit_weight", T_F64, OFF(disk_cache_hit_weight), 0, 1, false, NULL, 0, "0.25",
     "credit per block cached on disk or external storage, in [0, 1]", G_ROUTING},
    {"router_temperature", T_F64, OFF(router_temperature), 0, 1e9, false, NULL, 0, "0.0",
     "softmax temperature; 0 = pick the cheapest worker (random among ties)", G_ROUTING},
    {"router_selection_policy", T_ENUM, OFF(router_selection_policy), 0, 0, false, SPOL, 0,
     "locality",
     "locality | dynamo (the reference's cost) | lmetric (docs/sim.md); default = locality", G_ROUTING},
    {"router_step_wait_weight", T_F64, OFF(router_step_wait_weight), 0, 1e6, false, NULL, 0, "1.0",
     "locality policy: prefill charged per millisecond a worker's engine step under way has "
     "left (learnt from when its steps end), in 16-token blocks whatever the block size; "
     "0 = off", G_ROUTING},
    {"router_inflight_credit_weight", T_F64, OFF(router_inflight_credit_weight), 0, 1, false,
     NULL, 0, "1.0",
     "credit per prompt block a worker is computing now for a request routed there but its "
     "KV events have not reported stored yet (a burst on a new prefix follows its first "
     "request), in [0, 1]; 0 = only what the events report", G_ROUTING},
    {"router_track_active_blocks", T_BOOL, OFF(router_track_active_blocks), 0, 0, false, NULL, 0,
     "true", "track the prompt blocks of in-flight requests per worker", G_LOAD},
    {"router_track_output_blocks", T_BOOL, OFF(router_track_output_blocks), 0, 0, false, NULL, 0,
     "false", "also track output blocks as they are generated (needs router_track_active_blocks)", G_LOAD},
    {"router_assume_kv_reuse", T_BOOL, OFF(router_assume_kv_reuse), 0, 0, false, NULL, 0, "true",
     "shared prompt blocks of in-flight requests count once per worker", G_LOAD},
    {"router_track_prefill_tokens", T_BOOL, OFF(router_track_prefill_tokens), 0, 0, false, NULL, 0,
     "true", "count prompt tokens as load until the first token", G_LOAD},
    {"router_request_expiry_ms", T_U64, OFF(router_request_expiry_ms), 1000, 1e12, false, NULL, 0,
     "300000", "in-flight requests older than this are freed (a backstop for lost frees)", G_LOAD},
    {"router_max_requests", T_U64, OFF(router_max_requests), 1, 1e9, false, NULL, 0, "1048576",
     "in-flight requests tracked at most; beyond it new requests are rejected", G_LOAD},
    {"router_max_prompt_tokens", T_U64, OFF(router_max_prompt_tokens), 1, 1e9, false, NULL, 0,
     "2097152", "prompts longer than this many tokens are refused before hashing", G_LOAD},
    {"router_ttl_secs", T_F64, OFF(router_ttl_secs), 0, 1e9, true, NULL, 0, "120.0",
     "approximate mode only (ignored otherwise): how long a routing decision counts as cached", G_INDEX},
    {"router_max_tree_size", T_U64, OFF(router_max_tree_size), 1, 1e12, false, NULL, 0, "1048576",
     "approximate mode only (ignored otherwise): blocks recorded before pruning; the default is "
     "clamped to index_max_pairs, a larger value given is refused", G_INDEX},
    {"router_prune_target_ratio", T_F64, OFF(router_prune_target_ratio), 0, 1, true, NULL, 0, "0.8",
     "approximate mode only (ignored otherwise): prune down to this fraction of "
     "router_max_tree_size, in (0, 1]", G_INDEX},
    {"router_queue_threshold", T_OPT_F64, OFF(router_queue_threshold), 0, 1e9, false, NULL, 0,
     "unset",
     "queue requests while every worker's prefill tokens exceed this fraction of its batch (each "
     "--worker then needs max_num_batched_tokens=); unset = no queue", G_QUEUE},
    {"router_queue_policy", T_ENUM, OFF(router_queue_policy), 0, 0, false, QPOL, 0, "fcfs",
     "fcfs | wspt | lcfs", G_QUEUE},
    {"router_queue_max_requests", T_U64, OFF(router_queue_max_requests), 1, 1e9, false, NULL, 0,
     "4096", "queued requests at most; beyond it requests are rejected with 429", G_QUEUE},
    {"router_queue_max_isl_tokens", T_U64, OFF(router_queue_max_isl_tokens), 1, 1e15, false, NULL,
     0, "67108864", "queued prompt tokens at most; beyond it requests are rejected with 429", G_QUEUE},
    {"router_queue_timeout_ms", T_U64, OFF(router_queue_timeout_ms), 1, 1e9, false, NULL, 0,
     "30000", "a queued request waits at most this long", G_QUEUE},
    {"active_prefill_tokens_threshold", T_OPT_F64, OFF(active_prefill_tokens_threshold), 0, 1e15,
     false, NULL, 0, "unset", "a worker rank is busy above this many prefill tokens", G_LOAD},
    {"active_prefill_tokens_threshold_frac", T_OPT_F64, OFF(active_prefill_tokens_threshold_frac),
     0, 1e9, false, NULL, 0, "unset",
     "busy above this fraction of max_num_batched_tokens (each --worker then needs "
     "max_num_batched_tokens=)", G_LOAD},
    {"active_decode_blocks_threshold", T_OPT_F64, OFF(active_decode_blocks_threshold), 0, 1, false,
     NULL, 0, "unset", "busy above this fraction of the worker's KV blocks in use, in [0, 1]", G_LOAD},
    {"http_port", T_U32, OFF(http_port), 0, 65535, false, NULL, 0, "8080",
     "HTTP port; 0 = any free port (printed as `listening host:port` on stdout)", G_LISTEN},
    {"bind", T_STR, OFF(bind), 0, 0, false, NULL, sizeof(((kvr_router_config_t *)0)->bind),
     "127.0.0.1", "address to listen on", G_LISTEN},
    {"http_max_header_bytes", T_U64, OFF(http_max_header_bytes), 1024, 16777216, false, NULL, 0,
     "65536",
     "largest request line + headers accepted from a client; a larger one is refused at once "
     "with 431 before it is parsed", G_LISTEN},
    {"http_max_body_bytes", T_U64, OFF(http_max_body_bytes), 1024, 4294967296.0, false, NULL, 0,
     "67108864",
     "largest request body accepted from a client; a larger one is refused with 413 "
     "(a Content-Length above it before the body is read)", G_LISTEN},
    {"http_max_connections", T_U32, OFF(http_max_connections), 1, 1000000, false, NULL, 0, "4096",
     "client connections open at once, per listener; beyond it a new one is answered "
     "503 and closed (keep it below the file-descriptor limit)", G_LISTEN},
    {"http_header_timeout_ms", T_U64, OFF(http_header_timeout_ms), 100, 86400000, false, NULL, 0,
     "10000",
     "a request's line and headers must arrive within this long of its first byte "
     "(of the accept, for a new connection); else 408 and close", G_LISTEN},
    {"http_body_timeout_ms", T_U64, OFF(http_body_timeout_ms), 100, 86400000, false, NULL, 0,
     "60000", "a request's body must arrive within this long of its headers; else 408 and close", G_LISTEN},
    {"http_idle_timeout_ms", T_U64, OFF(http_idle_timeout_ms), 100, 86400000, false, NULL, 0,
     "90000", "a kept-alive client connection idle between requests this long is closed", G_LISTEN},
    {"admin_port", T_OPT_F64, OFF(admin_port), 0, 65535, false, NULL, 0, "unset",
     "port of the admin listener, which alone serves fleet changes (POST /v1/workers, DELETE "
     "/v1/workers/ID, GET /v1/dump); 0 = any free port; unset = they are served on http_port", G_LISTEN},
    {"admin_bind", T_STR, OFF(admin_bind), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->admin_bind), "127.0.0.1",
     "address the admin listener listens on", G_LISTEN},
    {"api_key_file", T_STR, OFF(api_key_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->api_key_file), "",
     "file holding the token clients must send as `Authorization: Bearer` (every endpoint but "
     "/health and /ready); empty = none", G_SECURITY},
    {"admin_key_file", T_STR, OFF(admin_key_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->admin_key_file), "",
     "file holding the token fleet changes need as `Authorization: Bearer` (it is accepted "
     "wherever the api key is); empty = none", G_SECURITY},
    {"shutdown_grace_ms", T_U64, OFF(shutdown_grace_ms), 0, 86400000, false, NULL, 0, "30000",
     "SIGTERM: new connections are refused and answers in progress (streams) get this long to "
     "finish before the rest are ended; a second signal ends them at once", G_LISTEN},
    {"health_interval_ms", T_U64, OFF(health_interval_ms), 10, 1e9, false, NULL, 0, "2000",
     "how often workers with a url are probed on /health", G_WORKERS},
    {"health_failures", T_U32, OFF(health_failures), 1, 1000, false, NULL, 0, "3",
     "consecutive failed probes before a worker is fenced", G_WORKERS},
    {"min_initial_workers", T_U32, OFF(min_initial_workers), 0, 65535, false, NULL, 0, "1",
     "until this many workers are ready (registered, not fenced), requests wait instead of "
     "failing; 0 = never wait", G_WORKERS},
    {"session_ttl_secs", T_U64, OFF(session_ttl_secs), 0, 31536000, false, NULL, 0, "0",
     "sticky sessions (x-session-id, nvext.session_control): a session's requests prefer the "
     "worker of its first while it is healthy and not busy, for this long after its last "
     "request; 0 = no sessions (the default, as the reference's: on the policy table they "
     "raise the hit ratio a little and cost the tail, docs/sim.md)", G_ROUTING},
    {"session_max", T_U64, OFF(session_max), 1, 1073741824, false, NULL, 0, "65536",
     "sticky sessions held at most; the least recently used is dropped beyond it", G_ROUTING},
    {"lora_strict", T_BOOL, OFF(lora_strict), 0, 0, false, NULL, 0, "false",
     "a request for a LoRA adapter no worker declares (--worker ...,loras=) is refused (404) "
     "instead of going to any worker of its model, which loads it on demand", G_WORKERS},
    {"min_initial_workers_wait_ms", T_U64, OFF(min_initial_workers_wait_ms), 0, 1e9, false, NULL, 0,
     "30000", "the start-up window: requests wait for min_initial_workers at most until this "
     "long after the router starts, then 503 naming it; a request arriving later is answered "
     "at once", G_WORKERS},
    {"allowed_worker_hosts", T_STR, OFF(allowed_worker_hosts), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->allowed_worker_hosts), "",
     "comma-separated hosts that worker urls and tcp:// event endpoints may name; empty = any", G_SECURITY},
    {"allowed_ipc_dirs", T_STR, OFF(allowed_ipc_dirs), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->allowed_ipc_dirs), "",
     "comma-separated absolute directories ipc:// event endpoints may be under; empty = ipc:// "
     "refused", G_SECURITY},
    {"allowed_tokenizer_dirs", T_STR, OFF(allowed_tokenizer_dirs), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->allowed_tokenizer_dirs), "",
     "comma-separated absolute directories a worker registration's tokenizer folder "
     "(tokenizer=DIR, POST /v1/workers' \"tokenizer\") may be under; empty = refused (the "
     "tokenizers setting is not limited by it)", G_SECURITY},
    {"state_file", T_STR, OFF(state_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->state_file), "",
     "warm restart: the index and each exact rank's event cursor are saved here on SIGTERM/SIGINT "
     "and reloaded at start, then caught up from the engines' replay buffers; empty = off", G_INDEX},
    {"nats_url", T_STR, OFF(nats_url), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_url), "",
     "NATS server(s) for router replicas and discovery, e.g. nats://127.0.0.1:4222 (a comma-"
     "separated list for a cluster); empty = no NATS (a single router)", G_REPLICAS},
    {"nats_creds_file", T_STR, OFF(nats_creds_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_creds_file), "",
     "NATS identity: a .creds file (user JWT and seed, as nsc writes it); at most one of "
     "nats_creds_file, nats_nkey_file, nats_token_file; empty = none", G_REPLICAS},
    {"nats_nkey_file", T_STR, OFF(nats_nkey_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_nkey_file), "",
     "NATS identity: a file holding an nkey user's seed (SU...) and public key (U...), as "
     "`nk -gen user -pubout` prints them; empty = none", G_REPLICAS},
    {"nats_token_file", T_STR, OFF(nats_token_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_token_file), "",
     "NATS identity: a file holding the token of the server's authorization block; empty "
     "= none (a secret in nats_url shows in ps: it is warned about)", G_REPLICAS},
    {"nats_tls_ca", T_STR, OFF(nats_tls_ca), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_tls_ca), "",
     "TLS to NATS: the CA (PEM) the server's certificate must chain to; setting any "
     "nats_tls_* turns TLS on", G_REPLICAS},
    {"nats_tls_cert", T_STR, OFF(nats_tls_cert), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_tls_cert), "",
     "TLS to NATS: this process's client certificate (PEM), with nats_tls_key", G_REPLICAS},
    {"nats_tls_key", T_STR, OFF(nats_tls_key), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_tls_key), "",
     "TLS to NATS: the client certificate's private key (PEM)", G_REPLICAS},
    {"namespace", T_STR, OFF(nats_namespace), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->nats_namespace), "kvrouter",
     "prefix of every NATS subject and bucket, so several fleets can share one NATS "
     "([A-Za-z0-9_-], at most 64 bytes)", G_REPLICAS},
    {"router_replica_sync", T_BOOL, OFF(router_replica_sync), 0, 0, false, NULL, 0, "false",
     "share active load with the other router replicas over NATS (needs nats_url): each "
     "publishes its bookings, first tokens and frees on <namespace>.active_sequences", G_REPLICAS},
    {"router_sync_max_peer_requests", T_U64, OFF(router_sync_max_peer_requests), 1, 16777216,
     false, NULL, 0, "262144",
     "replica sync: the other replicas' bookings held here at most, all peers together, in a "
     "budget of their own beside router_max_requests (so that no peer, nor anyone publishing "
     "on NATS, can make this router refuse its own clients); beyond it peers' adds are refused "
     "(counted)", G_REPLICAS},
    {"router_sync_max_requests_per_peer", T_U64, OFF(router_sync_max_requests_per_peer), 1,
     16777216, false, NULL, 0, "65536",
     "replica sync: one peer's bookings held here at most (of router_sync_max_peer_requests)", G_REPLICAS},
    {"router_sync_max_peer_blocks", T_U64, OFF(router_sync_max_peer_blocks), 1, 1e12, false,
     NULL, 0, "4194304",
     "replica sync: prompt blocks the other replicas' bookings hold here at most (each costs "
     "about 128 bytes of the load tracker: 512 MiB at the default); beyond it peers' adds are "
     "refused (counted)", G_REPLICAS},
    {"nats_presence_ttl_ms", T_U64, OFF(nats_presence_ttl_ms), 300, 3600000, false, NULL, 0, "3000",
     "a router's or worker's presence entry is refreshed every third of this; one not refreshed "
     "for this long is gone (its requests freed, the worker fenced)", G_REPLICAS},
    {"discovery", T_ENUM, OFF(discovery), 0, 0, false, DISC, 0, "static",
     "static = workers come from --worker and POST /v1/workers only; nats = also from the "
     "<namespace>_workers bucket, live (needs nats_url)", G_REPLICAS},
    {"peers", T_STR, OFF(peers), 0, 0, false, NULL, sizeof(((kvr_router_config_t *)0)->peers), "",
     "comma-separated urls of router replicas to load the index from at start (their GET "
     "/v1/index/snapshot, the admin listener's when they have one), so a new replica starts "
     "with the fleet's cache picture; empty = the live routers of <namespace>_routers when "
     "nats_url is set (none: it starts cold)", G_REPLICAS},
    {"allowed_peer_hosts", T_STR, OFF(allowed_peer_hosts), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->allowed_peer_hosts), "",
     "comma-separated hosts that a replica's url learnt from <namespace>_routers may name for "
     "this router to load its index from (and send it peer_key_file's token); a url on any "
     "other host is skipped (counted, logged); empty = the hosts of peers, bind and admin_bind", G_SECURITY},
    {"peer_key_file", T_STR, OFF(peer_key_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->peer_key_file), "",
     "file holding the token router replicas send each other for GET /v1/index/snapshot (it "
     "is accepted there besides the admin key, and is the only credential a joining replica "
     "sends: never the admin key); empty = none", G_SECURITY},
    {"serve_indexer", T_BOOL, OFF(serve_indexer), 0, 0, false, NULL, 0, "false",
     "also answer the indexer API (POST /query, POST /query_by_hash, GET /dump) from this "
     "router's index, so other routers can use it with remote_indexer (needs router_mode kv "
     "and overlap_score_credit > 0)", G_INDEXER},
    {"remote_indexer", T_STR, OFF(remote_indexer), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->remote_indexer), "",
     "http://host:port of an indexer (kvrouter indexer, a router with serve_indexer, or the "
     "reference's indexer) whose overlaps this router routes with instead of a local index "
     "(router_mode kv), or nats: a router with serve_indexer on the same NATS (<namespace>."
     "indexer.query); empty = the local index", G_INDEXER},
    {"remote_indexer_timeout_ms", T_U64, OFF(remote_indexer_timeout_ms), 1, 60000, false, NULL, 0,
     "20",
     "a remote indexer's answer later than this: the decision is taken with zero overlap "
     "(counted, logged)", G_INDEXER},
    {"remote_indexer_key_file", T_STR, OFF(remote_indexer_key_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->remote_indexer_key_file), "",
     "remote_indexer over HTTP: file holding the indexer's api key, sent as `Authorization: "
     "Bearer` with each lookup; empty = none", G_INDEXER},
    {"remote_indexer_admin_key_file", T_STR, OFF(remote_indexer_admin_key_file), 0, 0, false,
     NULL, sizeof(((kvr_router_config_t *)0)->remote_indexer_admin_key_file), "",
     "remote_indexer over HTTP, approximate mode: file holding the indexer's admin key, sent "
     "with each routing decision it records; empty = remote_indexer_key_file's", G_INDEXER},
    {"prediction_drift_window", T_U32, OFF(prediction_drift_window), 0, 1024, false, NULL, 0,
     "32",
     "answers per rank judged together: each answer whose engine reports "
     "usage.prompt_tokens_details.cached_tokens is compared with the cached tokens the router "
     "predicted for it (agreeing within one block); a rank whose last window of answers agrees "
     "less than prediction_drift_min_accuracy is drifting, and is well again once a later full "
     "window agrees; 0 = no comparison", G_INDEX},
    {"prediction_drift_min_accuracy", T_F64, OFF(prediction_drift_min_accuracy), 0, 1, false,
     NULL, 0, "0.5",
     "share of a window's answers whose prediction must agree with the engine's report for the "
     "rank to be trusted", G_INDEX},
    {"prediction_drift_action", T_ENUM, OFF(prediction_drift_action), 0, 0, false, DRIFT, 0,
     "resync",
     "a rank found drifting: resync = its index state is dropped and rebuilt from its engine's "
     "replay buffer (dropped only, without a replay socket), at most once a window; "
     "approximate = it is routed on the router's own decisions (as approximate mode) while its "
     "events go on being compared, until a window of them agrees; flag = marked and logged "
     "only", G_INDEX},
    {"seed", T_U64, OFF(seed), 0, U64MAX, false, NULL, 0, "0",
     "seed for random tie-breaks and sampling; 0 = a random one", G_ROUTING},
    {"frontend_max_retries", T_U32, OFF(frontend_max_retries), 0, 16, false, NULL, 0, "2",
     "OpenAI front end: other workers tried when an upstream refuses or fails before its first "
     "byte", G_FRONTEND},
    {"frontend_fence_failures", T_U32, OFF(frontend_fence_failures), 1, 1000, false, NULL, 0, "2",
     "OpenAI front end: consecutive upstream failures that fence a worker (readmitted by its "
     "/health)", G_FRONTEND},
    {"frontend_max_answer_bytes", T_U64, OFF(frontend_max_answer_bytes), 4096, 1e12, false, NULL, 0,
     "67108864",
     "OpenAI front end: largest non-streaming answer (or /tokenize answer) read from a worker; "
     "a longer one is cut off, answered 502 and counted as the worker failing", G_FRONTEND},
    {"frontend_forward_authorization", T_BOOL, OFF(frontend_forward_authorization), 0, 0, false,
     NULL, 0, "false",
     "OpenAI front end: send the client's Authorization header on to the worker (off: a "
     "client's credentials never reach a worker)", G_SECURITY},
    {"frontend_chat_token_data", T_BOOL, OFF(frontend_chat_token_data), 0, 0, false, NULL, 0,
     "true",
     "OpenAI front end: add the prompt's ids to each chat sent to a worker (nvext.token_data), "
     "as Dynamo-style backends read them; vLLM and SGLang ignore the member and tokenize the "
     "chat again, so for them false sends the client's body as it came and spares the router "
     "writing and the engine parsing about 5 bytes a token", G_FRONTEND},
    {"frontend_trust_kv_transfer", T_BOOL, OFF(frontend_trust_kv_transfer), 0, 0, false, NULL, 0,
     "false",
     "OpenAI front end: forward a client's kv_transfer_params, bootstrap_host, bootstrap_port, "
     "bootstrap_room and bootstrap_pair_key to workers (only behind a gateway that sets them "
     "itself); off: they are stripped from every body, so no client can choose where an engine "
     "reads or sends KV", G_SECURITY},
    {"worker_api_key_file", T_STR, OFF(worker_api_key_file), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->worker_api_key_file), "",
     "OpenAI front end: file holding the token sent to workers as `Authorization: Bearer` "
     "(unless the client's is forwarded); empty = none", G_SECURITY},
    {"frontend_upstream_timeout_ms", T_U64, OFF(frontend_upstream_timeout_ms), 100, 86400000, false,
     NULL, 0, "600000",
     "OpenAI front end: silence on an upstream connection (connect, headers, between chunks) "
     "before it fails", G_FRONTEND},
    {"frontend_prefill_timeout_ms", T_U64, OFF(frontend_prefill_timeout_ms), 100, 86400000,
     false, NULL, 0, "60000",
     "disaggregated fleets: silence on a prefill leg (the prompt and one token) before it fails, "
     "counted, and the request is served on the decode pool (or refused with enforce_disagg)", G_FRONTEND},
    {"frontend_tokenize_cache_tokens", T_U64, OFF(frontend_tokenize_cache_tokens), 0, 1e12, false,
     NULL, 0, "4194304",
     "OpenAI front end: token ids the text->ids cache holds (LRU); 0 = no cache", G_FRONTEND},
    {"tokenizers", T_STR, OFF(tokenizers), 0, 0, false, NULL,
     sizeof(((kvr_router_config_t *)0)->tokenizers), "",
     "OpenAI front end: comma-separated MODEL=DIR; requests for MODEL are tokenized in the "
     "router from DIR's tokenizer.json and tokenizer_config.json (its chat_template for "
     "chats) instead of by a worker's /tokenize (`--tokenizer MODEL=DIR` adds one); empty = "
     "every text and chat prompt is tokenized by a worker", G_FRONTEND},
    {"tokenizer_check", T_ENUM, OFF(tokenizer_check), 0, 0, false, TOKCHECK, 0, "refuse",
     "OpenAI front end: when the first worker of a model in `tokenizers` registers, probe "
     "prompts are tokenized both in process and by its /tokenize; on a difference, refuse = "
     "the model's prompts go to the workers' /tokenize (logged, counted), warn = logged and "
     "counted only, off = no probe", G_FRONTEND},
    {"frontend_max_idle_connections", T_U32, OFF(frontend_max_idle_connections), 0, 65535, false,
     NULL, 0, "64", "OpenAI front end: idle keep-alive upstream connections kept per worker", G_FRONTEND},
    {"frontend_max_client_buffer_bytes", T_U64, OFF(frontend_max_client_buffer_bytes), 4096, 1e12,
     false, NULL, 0, "16777216",
     "OpenAI front end: bytes of a streamed answer waiting for a slow client; above it the "
     "request is aborted as if it had disconnected", G_FRONTEND},
    {"enforce_disagg", T_BOOL, OFF(enforce_disagg), 0, 0, false, NULL, 0, "false",
     "disaggregated fleets: with no prefill worker serving (or a failed prefill), answer 503 "
     "instead of serving the request aggregated on the decode pool", G_DISAGG},
    {"disagg_policy", T_ENUM, OFF(disagg_policy), 0, 0, false, DPOL, 0, "always",
     "always | isl | load | isl-or-load: when a request skips its remote prefill (isl: the best "
     "decode worker's cache leaves fewer than disagg_isl_threshold new tokens and under 70% of "
     "the prompt; load: every prefill worker is busy)", G_DISAGG},
    {"disagg_isl_threshold", T_U64, OFF(disagg_isl_threshold), 0, 1e9, false, NULL, 0, "2048",
     "disagg_policy isl: effective new prompt tokens below which the decode worker prefills "
     "locally", G_DISAGG},
    {"disagg_load_threshold", T_OPT_F64, OFF(disagg_load_threshold), 0, 1e12, false, NULL, 0,
     "unset",
     "disagg_policy load: prefill tokens in flight on the chosen prefill worker at which the "
     "request is prefilled by a decode worker instead (when one is not busy); unset = when every "
     "prefill worker is busy by the busy thresholds", G_DISAGG},
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

static void seterr(char *err, size_t len, const char *fmt, ...)
{
    if (err == NULL || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

/* Canonical form of a name: leading dashes and a KVR_ prefix dropped, lower case, '-' -> '_'.
 * Returns false when it does not fit. */
static bool canonical(const char *name, char *out, size_t cap)
{
    while (*name == '-')
        name++;
    if (strncmp(name, "KVR_", 4) == 0 || strncmp(name, "kvr_", 4) == 0)
        name += 4;
    size_t n = strlen(name);
    if (n == 0 || n >= cap)
        return false;
    for (size_t i = 0; i <= n; i++) {
        char c = name[i];
        out[i] = c == '-' ? '_' : (char)tolower((unsigned char)c);
    }
    return true;
}

static const field_t *lookup(const char *name)
{
    char key[96];
    if (!canonical(name, key, sizeof key))
        return NULL;
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strcmp(FIELDS[i].name, key) == 0)
            return &FIELDS[i];
    return NULL;
}

bool kvr_config_has(const char *name) { return lookup(name) != NULL; }
size_t kvr_config_count(void) { return N_FIELDS; }
const char *kvr_config_name(size_t i) { return i < N_FIELDS ? FIELDS[i].name : NULL; }

const char *kvr_config_mode_name(const kvr_router_config_t *cfg)
{
    unsigned m = (unsigned)cfg->router_mode;
    return m < sizeof MODES / sizeof MODES[0] - 1 ? MODES[m] : "?";
}

const char *kvr_config_policy_name(const kvr_router_config_t *cfg)
{
    if (cfg->router_mode != KVR_MODE_KV && cfg->router_mode != KVR_MODE_APPROX)
        return kvr_config_mode_name(cfg); /* a load-only mode is its own policy */
    unsigned p = (unsigned)cfg->router_selection_policy;
    return p < sizeof SPOL / sizeof SPOL[0] - 1 ? SPOL[p] : "?";
}

bool kvr_config_is_bool(const char *name)
{
    const field_t *f = lookup(name);
    return f != NULL && f->type == T_BOOL;
}

/* The setting name closest to name when it is close enough to be a typo (at most 2 edits, or
 * a quarter of its length for long names), else NULL. */
static const char *nearest(const char *name)
{
    char key[96];
    if (!canonical(name, key, sizeof key))
        return NULL;
    size_t best = SIZE_MAX, limit = kvr_edit_limit(strlen(key));
    const char *found = NULL;
    for (size_t i = 0; i < N_FIELDS; i++) {
        size_t d = kvr_edit_distance(key, FIELDS[i].name);
        if (d < best) {
            best = d;
            found = FIELDS[i].name;
        }
    }
    return best <= limit ? found : NULL;
}

/* "unknown setting 'X'", with the nearest name spelt as X was (a --flag or a key). */
static void unknown_setting(const char *name, char *err, size_t err_len)
{
    const char *near = nearest(name);
    if (near == NULL) {
        seterr(err, err_len, "unknown setting '%s'", name);
        return;
    }
    char spelt[96];
    bool flag = strncmp(name, "--", 2) == 0;
    snprintf(spelt, sizeof spelt, "%s%s", flag ? "--" : "", near);
    for (char *c = spelt + (flag ? 2 : 0); flag && *c != '\0'; c++)
        *c = *c == '_' ? '-' : *c;
    seterr(err, err_len, "unknown setting '%s' (did you mean '%s'?)", name, spelt);
}

static void range_text(const field_t *f, char *buf, size_t len)
{
    if (f->max >= 1e9)
        snprintf(buf, len, "%s %g", f->min_open ? ">" : ">=", f->min);
    else
        snprintf(buf, len, "in %s%g, %g]", f->min_open ? "(" : "[", f->min, f->max);
}

static bool in_range(const field_t *f, double v)
{
    if (f->min_open ? !(v > f->min) : !(v >= f->min))
        return false;
    return v <= f->max;
}

static int parse_f64(const field_t *f, const char *v, double *out, char *err, size_t len)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    char r[64];
    range_text(f, r, sizeof r);
    if (end == v || *end != '\0' || errno == ERANGE || !isfinite(d) || !in_range(f, d)) {
        seterr(err, len, "%s: must be a finite number %s, got '%s'", f->name, r, v);
        return KVR_EINVAL;
    }
    *out = d;
    return KVR_OK;
}

static int parse_uint(const field_t *f, const char *v, uint64_t *out, char *err, size_t len)
{
    char r[64];
    range_text(f, r, sizeof r);
    const char *p = v;
    while (isspace((unsigned char)*p))
        p++;
    char *end;
    errno = 0;
    unsigned long long x = (*p == '-' || *p == '+') ? 0 : strtoull(p, &end, 10);
    if (*p == '-' || *p == '+' || end == p || *end != '\0' || errno == ERANGE ||
        !in_range(f, (double)x)) {
        seterr(err, len, "%s: must be a whole number %s, got '%s'", f->name, r, v);
        return KVR_EINVAL;
    }
    *out = (uint64_t)x;
    return KVR_OK;
}

static int parse_bool(const field_t *f, const char *v, bool *out, char *err, size_t len)
{
    static const char *const yes[] = {"true", "1", "yes", "on"};
    static const char *const no[] = {"false", "0", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (strcmp(v, yes[i]) == 0) {
            *out = true;
            return KVR_OK;
        }
        if (strcmp(v, no[i]) == 0) {
            *out = false;
            return KVR_OK;
        }
    }
    seterr(err, len, "%s: must be true or false, got '%s'", f->name, v);
    return KVR_EINVAL;
}

static int parse_enum(const field_t *f, const char *v, int *out, char *err, size_t len)
{
    if (strcmp(v, "default") == 0 && strcmp(f->def, "default") != 0)
        v = f->def; /* "default" names the setting's default */
    char list[160] = "";
    for (int i = 0; f->choices[i] != NULL; i++) {
        if (strcmp(v, f->choices[i]) == 0) {
            *out = i;
            return KVR_OK;
        }
        size_t used = strlen(list);
        snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "", f->choices[i]);
    }
    seterr(err, len, "%s: must be one of %s, got '%s'", f->name, list, v);
    return KVR_EINVAL;
}

static int set_field(kvr_router_config_t *cfg, const field_t *f, const char *v, char *err,
                     size_t len)
{
    char *base = (char *)cfg + f->off;
    int rc = KVR_OK;
    switch (f->type) {
    case T_U32:
    case T_U64: {
        uint64_t x;
        rc = parse_uint(f, v, &x, err, len);
        if (rc == KVR_OK && f->type == T_U32)
            *(uint32_t *)(void *)base = (uint32_t)x;
        else if (rc == KVR_OK)
            *(uint64_t *)(void *)base = x;
        break;
    }
    case T_F64:
        rc = parse_f64(f, v, (double *)(void *)base, err, len);
        break;
    case T_OPT_F64: {
        kvr_opt_f64_t *o = (kvr_opt_f64_t *)(void *)base;
        if (*v == '\0' || strcmp(v, "unset") == 0 || strcmp(v, "none") == 0) {
            o->set = false;
            o->v = 0;
            break;
        }
        double d;
        rc = parse_f64(f, v, &d, err, len);
        if (rc == KVR_OK) {
            o->set = true;
            o->v = d;
        }
        break;
    }
    case T_BOOL:
        rc = parse_bool(f, v, (bool *)(void *)base, err, len);
        break;
    case T_ENUM: {
        int e;
        rc = parse_enum(f, v, &e, err, len);
        if (rc == KVR_OK)
            memcpy(base, &e, sizeof e); /* the enums are int-sized (asserted below) */
        break;
    }
    case T_STR:
        if (strlen(v) >= f->str_cap) {
            seterr(err, len, "%s: longer than %zu bytes", f->name, f->str_cap - 1);
            rc = KVR_EINVAL;
        } else {
            memcpy(base, v, strlen(v) + 1);
        }
        break;
    }
    return rc;
}

_Static_assert(sizeof(kvr_router_mode_t) == sizeof(int) &&
                   sizeof(kvr_queue_order_t) == sizeof(int) &&
                   sizeof(kvr_select_policy_t) == sizeof(int) &&
                   sizeof(kvr_discovery_mode_t) == sizeof(int) &&
                   sizeof(kvr_tokenizer_check_t) == sizeof(int) &&
                   sizeof(kvr_drift_action_t) == sizeof(int),
               "enum fields are stored as int");

void kvr_config_defaults(kvr_router_config_t *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_FIELDS; i++)
        (void)set_field(cfg, &FIELDS[i], FIELDS[i].def, NULL, 0);
}

int kvr_config_set(kvr_router_config_t *cfg, const char *name, const char *value, char *err,
                   size_t err_len)
{
    if (cfg == NULL || name == NULL || value == NULL) {
        seterr(err, err_len, "config: missing name or value");
        return KVR_EINVAL;
    }
    const field_t *f = lookup(name);
    if (f == NULL) {
        unknown_setting(name, err, err_len);
        return KVR_ENOTFOUND;
    }
    return set_field(cfg, f, value, err, err_len);
}

int kvr_config_from_env(kvr_router_config_t *cfg, char *const *envp, char *err, size_t err_len)
{
    for (size_t i = 0; envp != NULL && envp[i] != NULL; i++) {
        const char *kv = envp[i];
        if (strncmp(kv, "KVR_", 4) != 0)
            continue;
        const char *eq = strchr(kv, '=');
        char name[96];
        size_t n = eq ? (size_t)(eq - kv) : strlen(kv);
        if (eq == NULL || n >= sizeof name) {
            seterr(err, err_len, "environment: malformed %.40s", kv);
            return KVR_EINVAL;
        }
        memcpy(name, kv, n);
        name[n] = '\0';
        if (strncmp(name, "KVR_TEST_", 9) == 0)
            continue; /* the test suite's own knobs */
        char e[200];
        int rc = kvr_config_set(cfg, name, eq + 1, e, sizeof e);
        if (rc != KVR_OK) {
            seterr(err, err_len, "environment %s: %s", name, e);
            return rc;
        }
    }
    return KVR_OK;
}

static const char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

/* Parses one line into cfg; line is modified. */
static int config_line(kvr_router_config_t *cfg, char *line, size_t lineno, char *err,
                       size_t err_len)
{
    char *hash = strchr(line, '#');
    if (hash != NULL)
        *hash = '\0';
    const char *s = trim(line);
    if (*s == '\0')
        return KVR_OK;
    char *eq = strchr((char *)s, '=');
    if (eq == NULL) {
        seterr(err, err_len, "line %zu: expected 'name = value'", lineno);
        return KVR_EINVAL;
    }
    *eq = '\0';
    const char *name = trim((char *)s);
    char *value = (char *)trim(eq + 1);
    size_t vl = strlen(value);
    if (vl >= 2 && value[0] == '"' && value[vl - 1] == '"') {
        value[vl - 1] = '\0';
        value++;
    }
    char e[200];
    int rc = kvr_config_set(cfg, name, value, e, sizeof e);
    if (rc != KVR_OK)
        seterr(err, err_len, "line %zu: %s", lineno, e);
    return rc;
}

int kvr_config_from_text(kvr_router_config_t *cfg, const char *text, size_t len, char *err,
                         size_t err_len)
{
    char line[1024];
    size_t lineno = 0, i = 0;
    while (i < len) {
        size_t start = i;
        while (i < len && text[i] != '\n')
            i++;
        size_t n = i - start;
        lineno++;
        if (i < len)
            i++; /* the newline */
        if (n >= sizeof line) {
            seterr(err, err_len, "line %zu: longer than %zu bytes", lineno, sizeof line - 1);
            return KVR_EINVAL;
        }
        if (memchr(text + start, '\0', n) != NULL) {
            seterr(err, err_len, "line %zu: contains a NUL byte", lineno);
            return KVR_EINVAL;
        }
        memcpy(line, text + start, n);
        line[n] = '\0';
        int rc = config_line(cfg, line, lineno, err, err_len);
        if (rc != KVR_OK)
            return rc;
    }
    return KVR_OK;
}

/* serve_indexer / remote_indexer: which combinations make sense (the reference's checks). */
static int check_indexer_settings(const kvr_router_config_t *cfg, char *err, size_t err_len)
{
    const char *mode = MODES[cfg->router_mode];
    bool remote = cfg->remote_indexer[0] != '\0';
    if (cfg->serve_indexer && remote) {
        seterr(err, err_len,
               "serve_indexer: cannot be combined with remote_indexer (a router "
               "serves its own index or uses another's)");
        return KVR_EINVAL;
    }
    bool kv_or_approx = cfg->router_mode == KVR_MODE_KV || cfg->router_mode == KVR_MODE_APPROX;
    if (cfg->serve_indexer && !kv_or_approx) {
        seterr(err, err_len,
               "serve_indexer: needs router_mode kv (with KV events, or use_kv_events false "
               "for approximate mode; got %s)",
               mode);
        return KVR_EINVAL;
    }
    if ((cfg->serve_indexer || remote) && cfg->overlap_score_credit == 0) {
        seterr(err, err_len, "%s: needs overlap_score_credit > 0 (0 keeps no prefix index)",
               remote ? "remote_indexer" : "serve_indexer");
        return KVR_EINVAL;
    }
    if (!remote)
        return KVR_OK;
    if (!kv_or_approx) {
        seterr(err, err_len,
               "remote_indexer: needs router_mode kv (with KV events, or use_kv_events false "
               "for approximate mode; got %s)",
               mode);
        return KVR_EINVAL;
    }
    if (strcmp(cfg->remote_indexer, "nats") == 0) {
        if (cfg->nats_url[0] == '\0') {
            seterr(err, err_len, "remote_indexer: nats needs nats_url");
            return KVR_EINVAL;
        }
    } else if (strncmp(cfg->remote_indexer, "http://", 7) != 0 || cfg->remote_indexer[7] == '\0') {
        seterr(err, err_len, "remote_indexer: '%.200s' is neither an http://host:port URL nor nats",
               cfg->remote_indexer);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* The dynamo cost's weights mean nothing under the other policies (lmetric and locality
 * multiply prefill by decode load: a scale of one term changes no choice, and a per-request
 * term has no unit there): a value that would change the dynamo cost is refused under them. */
static int check_cost_weights(const kvr_router_config_t *cfg, char *err, size_t err_len)
{
    if ((cfg->router_mode != KVR_MODE_KV && cfg->router_mode != KVR_MODE_APPROX) ||
        cfg->router_selection_policy == KVR_SELECT_POLICY_DYNAMO)
        return KVR_OK;
    const char *pol = kvr_config_policy_name(cfg);
    const char *name = NULL;
    double v = 0;
    if (cfg->overlap_score_weight.set && cfg->overlap_score_weight.v != 0 &&
        cfg->overlap_score_weight.v != 1)
        name = "overlap_score_weight", v = cfg->overlap_score_weight.v;
    else if (!cfg->overlap_score_weight.set && cfg->prefill_load_scale != 1)
        name = "prefill_load_scale", v = cfg->prefill_load_scale;
    else if (cfg->decode_active_request_weight != 0)
        name = "decode_active_request_weight", v = cfg->decode_active_request_weight;
    if (name == NULL)
        return KVR_OK;
    seterr(err, err_len,
           "%s %g: a weight of the dynamo cost, which router_selection_policy %s does not have "
           "(it multiplies prefill by decode load); set router_selection_policy dynamo for it, "
           "or leave %s at its default",
           name, v, pol, name);
    return KVR_EINVAL;
}

/* tokenizers: "MODEL=DIR" entries, comma-separated, each model once. */
static int check_tokenizers(const char *v, char *err, size_t err_len)
{
    const char *p = v;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        const char *eq = memchr(p, '=', len);
        if (eq == NULL || eq == p || eq == p + len - 1) {
            seterr(err, err_len, "tokenizers: '%.*s' is not MODEL=DIR", (int)len, p);
            return KVR_EINVAL;
        }
        size_t ml = (size_t)(eq - p);
        for (const char *q = v; q < p;) { /* an earlier entry for the same model */
            const char *qe = strchr(q, '=');
            if ((size_t)(qe - q) == ml && memcmp(q, p, ml) == 0) {
                seterr(err, err_len, "tokenizers: model '%.*s' is given twice", (int)ml, p);
                return KVR_EINVAL;
            }
            q = strchr(q, ',') + 1;
        }
        p += len + (end != NULL);
        if (end != NULL && *p == '\0') {
            seterr(err, err_len, "tokenizers: ends with a comma");
            return KVR_EINVAL;
        }
    }
    return KVR_OK;
}

int kvr_config_validate(const kvr_router_config_t *cfg, char *err, size_t err_len)
{
    if (check_tokenizers(cfg->tokenizers, err, err_len) != KVR_OK)
        return KVR_EINVAL;
    if (check_cost_weights(cfg, err, err_len) != KVR_OK)
        return KVR_EINVAL;
    if (cfg->router_track_output_blocks && !cfg->router_track_active_blocks) {
        seterr(err, err_len,
               "router_track_output_blocks: requires router_track_active_blocks = true");
        return KVR_EINVAL;
    }
    /* An approximate-mode setting never blocks another mode, and its default follows a
     * smaller index budget (router.c clamps it); only a tree size the user chose above the
     * budget is refused, and only in approximate mode. */
    if (cfg->router_mode == KVR_MODE_APPROX && cfg->router_max_tree_size > cfg->index_max_pairs &&
        cfg->router_max_tree_size != KVR_CONFIG_DEFAULT_TREE_SIZE) {
        seterr(err, err_len,
               "router_max_tree_size: %llu exceeds index_max_pairs %llu (approximate mode)",
               (unsigned long long)cfg->router_max_tree_size,
               (unsigned long long)cfg->index_max_pairs);
        return KVR_EINVAL;
    }
    int rc = kvr_endpoint_check_ipc_dirs(cfg->allowed_ipc_dirs, err, err_len);
    if (rc == KVR_OK)
        rc = kvr_endpoint_check_dir_list("allowed_tokenizer_dirs", cfg->allowed_tokenizer_dirs,
                                         err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (cfg->bind[0] == '\0') {
        seterr(err, err_len, "bind: must not be empty");
        return KVR_EINVAL;
    }
    if (cfg->admin_port.set && cfg->admin_port.v != floor(cfg->admin_port.v)) {
        seterr(err, err_len, "admin_port: must be a whole number in [0, 65535], got %g",
               cfg->admin_port.v);
        return KVR_EINVAL;
    }
    if (cfg->admin_port.set && cfg->admin_bind[0] == '\0') {
        seterr(err, err_len, "admin_bind: must not be empty");
        return KVR_EINVAL;
    }
    if (!kvr_token_ok(cfg->nats_namespace)) {
        seterr(err, err_len, "namespace: '%s' must be 1 to 64 of [A-Za-z0-9_-] (it goes into "
               "NATS subjects and bucket names)", cfg->nats_namespace);
        return KVR_EINVAL;
    }
    if (cfg->router_replica_sync && cfg->nats_url[0] == '\0') {
        seterr(err, err_len, "router_replica_sync: needs nats_url");
        return KVR_EINVAL;
    }
    if (cfg->discovery == KVR_DISCOVERY_NATS && cfg->nats_url[0] == '\0') {
        seterr(err, err_len, "discovery: nats needs nats_url");
        return KVR_EINVAL;
    }
    rc = check_indexer_settings(cfg, err, err_len);
    if (rc != KVR_OK)
        return rc;
    if (cfg->admin_port.set && cfg->admin_port.v != 0 && cfg->admin_port.v == cfg->http_port) {
        seterr(err, err_len, "admin_port: must differ from http_port (%u)", cfg->http_port);
        return KVR_EINVAL;
    }
    return KVR_OK;
}

/* Appends one line to note (truncated when it does not fit). */
static void add_note(char *note, size_t note_len, const char *fmt, ...)
{
    size_t used = strnlen(note, note_len);
    if (used + 1 >= note_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note + used, note_len - used, fmt, ap);
    va_end(ap);
}

void kvr_config_resolve(kvr_router_config_t *cfg, char *note, size_t note_len)
{
    char none[1];
    if (note == NULL || note_len == 0) {
        note = none;
        note_len = sizeof none;
    }
    note[0] = '\0';
    if (cfg->overlap_score_weight.set) {
        double w = cfg->overlap_score_weight.v;
        cfg->prefill_load_scale = w;
        if (w == 0)
            cfg->overlap_score_credit = 0;
        add_note(note, note_len,
                 "overlap_score_weight %g (deprecated): prefill_load_scale = %g%s\n", w, w,
                 w == 0 ? ", overlap_score_credit = 0" : "");
    }
    if (cfg->router_mode == KVR_MODE_KV && !cfg->use_kv_events &&
        cfg->overlap_score_credit == 0) {
        /* the reference's Indexer::None wins over approximate mode (its load-aware preset) */
        add_note(note, note_len,
                 "use_kv_events false with overlap_score_credit 0: no index at all, not "
                 "approximate mode (load-aware routing; the whole prompt booked as prefill)\n");
    } else if (cfg->router_mode == KVR_MODE_KV && !cfg->use_kv_events) {
        cfg->router_mode = KVR_MODE_APPROX;
        add_note(note, note_len,
                 "use_kv_events false: approximate mode (router_mode approx; "
                 "cached blocks predicted from the router's own decisions for "
                 "router_ttl_secs)\n");
    }
    if (cfg->router_mode == KVR_MODE_KV && cfg->overlap_score_credit == 0 && cfg->use_kv_events)
        add_note(note, note_len,
                 "overlap_score_credit 0: no prefix index and no KV-event "
                 "subscription (load balancing by the cost function alone)\n");
}

bool kvr_config_uses_index(const kvr_router_config_t *cfg)
{
    /* with a remote indexer the overlaps (and, approximate, the decisions) live there */
    if (cfg->remote_indexer[0] != '\0')
        return false;
    return cfg->router_mode == KVR_MODE_APPROX ||
           (cfg->router_mode == KVR_MODE_KV && cfg->overlap_score_credit > 0);
}

/* ---- --help ---------------------------------------------------------------------------- */

#define HELP_COLS 80
#define HELP_DESC 32 /* the column descriptions start at */

/* Appends to a help buffer like snprintf (out may be NULL: only counts). */
typedef struct hbuf {
    char *out;
    size_t cap, used;
    size_t col; /* of the line being written */
} hbuf_t;

static void hput(hbuf_t *b, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (b->out != NULL && b->used + 1 < b->cap)
            b->out[b->used] = s[i];
        b->used++;
        b->col = s[i] == '\n' ? 0 : b->col + 1;
    }
    if (b->out != NULL && b->cap > 0)
        b->out[b->used < b->cap ? b->used : b->cap - 1] = '\0';
}

static void hputs(hbuf_t *b, const char *s) { hput(b, s, strlen(s)); }

static void hpad(hbuf_t *b, size_t col)
{
    while (b->col < col)
        hput(b, " ", 1);
}

/* The flag of a setting: --name with '-' for '_'. */
static void flag_of(const char *name, char *flag, size_t cap)
{
    size_t k = 0;
    flag[k++] = '-';
    flag[k++] = '-';
    for (size_t i = 0; name[i] != '\0' && k + 1 < cap; i++)
        flag[k++] = name[i] == '_' ? '-' : name[i];
    flag[k] = '\0';
}

/* The setting spelt name[0..len) in snake_case (with an underscore: a plain word of prose is
 * never taken for one), or NULL. */
static const field_t *field_named(const char *name, size_t len)
{
    if (memchr(name, '_', len) == NULL)
        return NULL;
    for (size_t i = 0; i < N_FIELDS; i++)
        if (strlen(FIELDS[i].name) == len && memcmp(FIELDS[i].name, name, len) == 0)
            return &FIELDS[i];
    return NULL;
}

/* The value a setting takes, as --help shows it: its choices, N, X, FILE, ... */
static void placeholder(const field_t *f, char *out, size_t cap)
{
    size_t n = strlen(f->name);
    const char *ph = f->type == T_U32 || f->type == T_U64 ? "N"
                     : f->type == T_F64 || f->type == T_OPT_F64 ? "X"
                     : f->type == T_BOOL                         ? "true|false"
                     : n > 5 && strcmp(f->name + n - 5, "_file") == 0 ? "FILE"
                     : strstr(f->name, "_dirs") != NULL         ? "DIR;DIR"
                     : strstr(f->name, "_hosts") != NULL        ? "HOST;HOST"
                     : strstr(f->name, "url") != NULL || strcmp(f->name, "peers") == 0 ? "URL"
                     : strstr(f->name, "bind") != NULL          ? "ADDR"
                     : strstr(f->name, "nats_tls") != NULL       ? "FILE"
                     : strcmp(f->name, "tokenizers") == 0        ? "MODEL=DIR;..."
                                                                  : "TEXT";
    if (f->type != T_ENUM) {
        snprintf(out, cap, "%s", ph);
        return;
    }
    size_t k = 0;
    out[0] = '\0';
    for (size_t i = 0; f->choices[i] != NULL && k < cap; i++)
        k += (size_t)snprintf(out + k, cap - k, "%s%s", i ? "|" : "", f->choices[i]);
}

/* A word of help text w[0..n): the setting it names, if any, between a lead of *skip bytes
 * ("(" or "`") and trailing punctuation from *core on. */
static const field_t *word_setting(const char *w, size_t n, size_t *skip, size_t *core)
{
    *core = n;
    while (*core > 0 && strchr(".,;:)`'", w[*core - 1]) != NULL)
        (*core)--;
    *skip = *core > 0 && (w[0] == '(' || w[0] == '`') ? 1 : 0;
    return *core > *skip ? field_named(w + *skip, *core - *skip) : NULL;
}

/* Writes a word as the reader types it: a setting's name becomes its flag. Returns its width
 * (b NULL: only measures). */
static size_t word(hbuf_t *b, const char *w, size_t n)
{
    size_t skip, core;
    const field_t *f = word_setting(w, n, &skip, &core);
    if (b == NULL)
        return f != NULL ? n + 2 : n;
    if (f == NULL) {
        hput(b, w, n);
        return n;
    }
    char flag[96];
    hput(b, w, skip);
    flag_of(f->name, flag, sizeof flag);
    hputs(b, flag);
    hput(b, w + core, n - core);
    return n + 2;
}

/* Writes text from the current column, wrapped at HELP_COLS with continuation lines at
 * HELP_DESC. */
static void wrapped(hbuf_t *b, const char *text)
{
    for (const char *p = text; *p != '\0';) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (n == 0)
            break;
        size_t shown = word(NULL, p, n);
        if (b->col > HELP_DESC && b->col + 1 + shown > HELP_COLS) {
            hput(b, "\n", 1);
            hpad(b, HELP_DESC);
        } else if (b->col > HELP_DESC) {
            hput(b, " ", 1);
        }
        (void)word(b, p, n);
        p += n;
    }
}

static void help_field(hbuf_t *b, const field_t *f)
{
    char flag[96], ph[160], text[1200];
    flag_of(f->name, flag, sizeof flag);
    placeholder(f, ph, sizeof ph);
    size_t n = 0;
    text[0] = '\0';
    if (f->type == T_ENUM && strlen(ph) > 16) { /* too long to stand after the flag */
        char first[40];
        snprintf(first, sizeof first, "%s |", f->choices[0]);
        if (strstr(f->help, first) == NULL)
            n = (size_t)snprintf(text, sizeof text, "one of %s: ", ph);
        snprintf(ph, sizeof ph, "CHOICE");
    }
    snprintf(text + n, sizeof text - n, "%s", f->help);
    n = strlen(text);
    if (f->def[0] != '\0' && strcmp(f->def, "unset") != 0)
        snprintf(text + n, sizeof text - n, " [%s]", f->def);
    hputs(b, "  ");
    hputs(b, flag);
    hputs(b, " ");
    hputs(b, ph);
    if (b->col + 1 >= HELP_DESC)
        hput(b, "\n", 1);
    hpad(b, HELP_DESC);
    wrapped(b, text);
    hput(b, "\n", 1);
}

size_t kvr_config_spell_flags(const char *msg, char *out, size_t out_len)
{
    hbuf_t b = {.out = out, .cap = out_len};
    if (out != NULL && out_len > 0)
        out[0] = '\0';
    for (const char *p = msg; *p != '\0';) {
        size_t gap = strspn(p, " ");
        hput(&b, p, gap);
        p += gap;
        size_t n = strcspn(p, " ");
        if (n > 0)
            (void)word(&b, p, n);
        p += n;
    }
    return b.used;
}

size_t kvr_config_help(char *out, size_t out_len, bool all)
{
    hbuf_t b = {.out = out, .cap = out_len};
    if (out != NULL && out_len > 0)
        out[0] = '\0';
    for (int g = 0; g < (all ? N_GROUPS : N_COMMON); g++) {
        hputs(&b, "\n");
        hputs(&b, GROUP_TITLES[g]);
        hputs(&b, ":\n");
        for (size_t i = 0; i < N_FIELDS; i++)
            if (FIELDS[i].group == (fgroup_t)g)
                help_field(&b, &FIELDS[i]);
    }
    if (!all) {
        hputs(&b, "\nMore settings (kvrouter serve --help-all):");
        for (int g = N_COMMON; g < N_GROUPS; g++) {
            hputs(&b, g == N_COMMON ? " " : "; ");
            hputs(&b, GROUP_TITLES[g]);
        }
        hputs(&b, ".\n");
    }
    return b.used;
}
