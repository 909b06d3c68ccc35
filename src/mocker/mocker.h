/*
 * mocker.h: `kvrouter mocker`, a simulated vLLM / SGLang engine process on one libevent loop,
 * and the only header of src/mocker for anyone outside it (src/apps, bench).
 *
 * What it serves: data-parallel ranks of the simulated engine (sim/engine.h), run in real time
 * divided by --speedup, behind a vLLM-compatible OpenAI HTTP server (POST /v1/completions,
 * /v1/chat/completions, /tokenize, /reset_prefix_cache, /kv/pull; GET /v1/models, /health,
 * /metrics, /version, /debug/kv_blocks; errors in vLLM's shape; a client that disconnects
 * cancels its request), each rank publishing its KV events over ZeroMQ as a vLLM rank does,
 * one batch per engine step. Published block hashes are kvr_mocker_engine_hash() of the
 * sequence hashes: routers must recompute them from token ids. Disaggregated roles (prefill,
 * decode; vLLM's pull or SGLang's bootstrap convention) move a modelled KV between processes.
 *
 * Contract:
 *   kvr_mocker_config_default(&c); ... kvr_mocker_config_validate(&c, err, len);
 *   m = kvr_mocker_new(base, zmq_ctx, &c, &st, err, len);   serving once it returns
 *   kvr_mocker_port(m), kvr_mocker_bootstrap_port(m);        the ports bound (0 = none)
 *   event_base_dispatch(base); ... kvr_mocker_free(m);
 *
 * Ownership: the mocker owns its ranks, engines, publishers and requests; the event base and
 * the ZMQ context are the caller's and must outlive it. Threads: the loop thread only.
 * Cost: per token one SSE chunk; per engine step one timer (or none when due within 20 us)
 * and one KV-event batch.
 */
#ifndef KVR_MOCKER_H
#define KVR_MOCKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sim/engine.h"
#include "wire/kv_encode.h"
#include "wire/kv_events_config.h"

#define KVR_MOCKER_MAX_DP 64

typedef enum kvr_mocker_role {
    KVR_MOCKER_BOTH = 0, /* aggregated: prefill and decode */
    KVR_MOCKER_PREFILL,
    KVR_MOCKER_DECODE,
} kvr_mocker_role_t;

typedef enum kvr_mocker_kvt {
    KVR_MOCKER_PULL = 0,  /* vLLM's NixlConnector: the decode worker reads the KV named by
                             kv_transfer_params */
    KVR_MOCKER_BOOTSTRAP, /* SGLang: both legs carry a bootstrap room; the decode worker reads
                             the room from the prefill worker's bootstrap server */
} kvr_mocker_kvt_t;

/* Silent KV-event faults (a subscriber cannot tell from the stream): what an index fed by
 * such events predicts stops matching what the engine reports it reused. */
typedef enum kvr_mocker_evfault {
    KVR_MOCKER_EVFAULT_NONE = 0,
    KVR_MOCKER_EVFAULT_WRONG, /* STORED events carry other token ids than the blocks hold */
    KVR_MOCKER_EVFAULT_DROP,  /* events are neither published nor numbered */
} kvr_mocker_evfault_t;
/* "none", "wrong", "drop"; index = value. */
extern const char *const KVR_MOCKER_EVFAULT_NAMES[];

typedef struct kvr_mocker_config {
    kvr_engine_config_t engine;  /* per rank */
    char host[256];              /* HTTP bind address */
    uint16_t port;               /* 0 = a free port (kvr_mocker_port) */
    char model[256];             /* served model name */
    char tokenizer[1024];        /* a folder with tokenizer.json (and tokenizer_config.json):
                                    text and chats are tokenized with it and its chat
                                    template, as vLLM does; "" = the toy tokenizer */
    bool ignore_token_data;      /* nvext.token_data is not read: text and chats are
                                    tokenized here, as vLLM does (it ignores nvext); false: the
                                    ids are taken, as Dynamo's backends take them */
    uint32_t dp_size;            /* ranks, 1..KVR_MOCKER_MAX_DP */
    double speedup;              /* > 0: modelled times are divided by it */
    kvr_kv_events_config_t events;
    kvr_kv_format_t event_format; /* VLLM_ARRAY (default) or VLLM_MAP */
    uint32_t drop_batches_every; /* fault injection: every Nth batch is not sent (0 = never) */
    kvr_mocker_evfault_t kv_events_fault; /* fault injection, silent (nothing counts it on
                                             the wire; POST /debug/kv_events_fault?mode=
                                             changes it at run time) */
    /* LoRA adapters served (vLLM's --lora-modules names), ';'-separated: listed in /v1/models
     * with the model as parent, taken as a request's model; an adapter's blocks are its own
     * (hashes salted by its name) and its KV events name it */
    char loras[1024];
    /* Disaggregation. A prefill worker keeps a prompt's KV (max_tokens forced to 1) until its
     * decode worker reads it over a real loopback connection (POST /kv/pull on the HTTP port,
     * or the bootstrap server's POST /kv/bootstrap) or kv_hold_timeout_s passes; a decode
     * worker reads it, waits blocks x kv_bytes_per_block / kv_transfer_gbps (modelled, divided
     * by speedup), stores it (STORED events) and decodes without prefilling. */
    kvr_mocker_role_t role;
    kvr_mocker_kvt_t kv_transfer;
    uint64_t kv_bytes_per_block; /* 2 MiB: an 8B model's 16 tokens in fp16 */
    double kv_transfer_gbps;     /* 100 */
    double kv_hold_timeout_s;    /* 30 (vLLM's lease) */
    double kv_wait_timeout_s;    /* 30: a bootstrap read waits this long for its prefill */
    uint16_t bootstrap_port;     /* prefill + bootstrap: 0 = a free port */
    bool kv_load_recompute;      /* decode: a failed read recomputes (vLLM's "recompute");
                                    false: the request fails ("fail", vLLM's default) */
    char kv_host[256];           /* the address decode workers reach this one at (remote_host;
                                    VLLM_NIXL_SIDE_CHANNEL_HOST): 127.0.0.1 */
    uint32_t kv_fault;           /* fault injection (prefill, pull): 1 = kv_transfer_params are a
                                    string, 2 = they name port 1 (nobody listens) */
} kvr_mocker_config_t;

void kvr_mocker_config_default(kvr_mocker_config_t *c);
/* err names the field ("speedup: must be a finite number > 0"). */
int kvr_mocker_config_validate(const kvr_mocker_config_t *c, char *err, size_t err_len);

typedef struct kvr_mocker kvr_mocker_t;
struct event_base;

/* NULL with *status and err (KVR_EINVAL config, KVR_EIO a port or endpoint in use). */
kvr_mocker_t *kvr_mocker_new(struct event_base *base, void *zmq_ctx,
                             const kvr_mocker_config_t *cfg, int *status, char *err,
                             size_t err_len);
void kvr_mocker_free(kvr_mocker_t *m);
uint16_t kvr_mocker_port(const kvr_mocker_t *m);
/* The bootstrap server's port (prefill role, bootstrap convention); 0 otherwise. */
uint16_t kvr_mocker_bootstrap_port(const kvr_mocker_t *m);

/* The engine block hash published for a block with this sequence hash (and its inverse). */
uint64_t kvr_mocker_engine_hash(uint64_t seq_hash);
uint64_t kvr_mocker_seq_hash(uint64_t engine_hash);

#endif /* KVR_MOCKER_H */
