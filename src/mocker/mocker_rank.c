/*
 * mocker_rank.c: the mocker's ranks (mocker_rank.h): engine -> KV-event encoder -> publisher,
 * the step timer and the replay socket, and the engine-hash bijection on the wire.
 *
 * Engine hashes: the engine block hash published is a bijective mix of the block's sequence
 * hash (vLLM's are opaque digests unrelated to the router's), so routers must recompute block
 * hashes from token ids, as ours does.
 * Invariants: events gathered during a step are published as one batch when it ends (vLLM
 * publishes a scheduler step's events together); a rank whose step is due within RUN_NOW_NS
 * runs it from the loop (event_active) and its schedule carries on from the due time.
 * Ownership: see mocker_rank.h. Threads: the loop thread only. Cost: per event, one pass over
 * its hashes (the mix) into the rank's scratch; per step, at most one timer.
 */
#include "mocker/mocker_rank.h"
#include "base/clock.h"
#include "base/grow.h"

#include <stdio.h>
#include <stdlib.h>

#include <event2/event.h>

#include "events/kv_publisher.h"
#include "kvrouter.h"
#include "base/log.h"

/* ---- engine hashes: a bijection of the sequence hash ----------------------------------- */

#define MIX_C1 UINT64_C(0xff51afd7ed558ccd)
#define MIX_C2 UINT64_C(0xc4ceb9fe1a85ec53)
#define MIX_SALT UINT64_C(0x6b7650d1e2f3a4c5)

static uint64_t mul_inverse(uint64_t c)
{
    uint64_t x = c; /* Newton's iteration doubles the correct low bits each round */
    for (int i = 0; i < 6; i++)
        x *= 2 - c * x;
    return x;
}

uint64_t kvr_mocker_engine_hash(uint64_t h)
{
    h ^= MIX_SALT;
    h ^= h >> 33;
    h *= MIX_C1;
    h ^= h >> 33;
    h *= MIX_C2;
    h ^= h >> 33;
    return h;
}

uint64_t kvr_mocker_seq_hash(uint64_t h)
{
    h ^= h >> 33;
    h *= mul_inverse(MIX_C2);
    h ^= h >> 33;
    h *= mul_inverse(MIX_C1);
    h ^= h >> 33;
    return h ^ MIX_SALT;
}

/* ---- time ------------------------------------------------------------------------------ */

/* ---- KV events: engine -> encoder -> publisher ------------------------------------------ */

static bool scratch_fit(rank_t *rk, size_t n)
{
    if (n <= rk->scratch_cap)
        return true;
    size_t cap = rk->scratch_cap ? rk->scratch_cap : 64;
    while (cap < n)
        cap *= 2;
    uint64_t *p = realloc(rk->scratch, cap * sizeof *p);
    if (!p)
        return false;
    rk->scratch = p;
    rk->scratch_cap = cap;
    return true;
}

/* The "wrong" fault: the event's tokens, each moved to the next id (the router hashes other
 * blocks than the engine holds); NULL out of memory. */
static const uint32_t *wrong_tokens(rank_t *rk, const uint32_t *tokens, size_t n)
{
    if (kvr_grow((void **)&rk->tok_scratch, &rk->tok_cap, n, SIZE_MAX,
                 sizeof *rk->tok_scratch) != KVR_OK)
        return NULL;
    uint32_t vocab = rk->m->cfg.engine.vocab_size ? rk->m->cfg.engine.vocab_size : 32000;
    for (size_t i = 0; i < n; i++)
        rk->tok_scratch[i] = (tokens[i] + 1) % vocab;
    return rk->tok_scratch;
}

/* Adds one event (its engine hashes in rk->scratch) to the open batch. */
static int encode_event(rank_t *rk, const kvr_kvcache_event_t *ev)
{
    uint32_t bs = rk->m->cfg.engine.block_size;
    if (ev->kind == KVR_KVC_REMOVED) {
        kvr_kv_enc_removed_t r = {.hashes = rk->scratch, .n_hashes = ev->n_hashes,
                                  .medium = "GPU"};
        return kvr_kv_enc_add_removed(rk->enc, &r);
    }
    if (ev->kind != KVR_KVC_STORED)
        return kvr_kv_enc_add_cleared(rk->enc);
    const uint32_t *toks = ev->tokens;
    if (rk->m->cfg.kv_events_fault == KVR_MOCKER_EVFAULT_WRONG &&
        (toks = wrong_tokens(rk, ev->tokens, ev->n_hashes * bs)) == NULL)
        return KVR_ENOMEM;
    kvr_kv_enc_stored_t s = {.hashes = rk->scratch,
                             .n_hashes = ev->n_hashes,
                             .has_parent = ev->has_parent,
                             .parent = kvr_mocker_engine_hash(ev->parent),
                             .tokens = toks,
                             .n_tokens = ev->n_hashes * bs,
                             .block_size = bs,
                             .medium = "GPU",
                             .lora_name = ev->lora_name};
    return kvr_kv_enc_add_stored(rk->enc, &s);
}

static void on_kv_event(void *ctx, const kvr_kvcache_event_t *ev)
{
    rank_t *rk = ctx;
    if (!rk->enc || rk->m->cfg.kv_events_fault == KVR_MOCKER_EVFAULT_DROP)
        return;
    int st = KVR_OK;
    if (!rk->batch_open) {
        st = kvr_kv_enc_begin_batch(rk->enc, ((double)kvr_wall_ns() * 1e-9), true, rk->idx);
        rk->batch_open = st == KVR_OK;
    }
    if (st == KVR_OK && ev->kind != KVR_KVC_CLEARED && !scratch_fit(rk, ev->n_hashes))
        st = KVR_ENOMEM;
    if (st == KVR_OK) {
        for (size_t i = 0; ev->kind != KVR_KVC_CLEARED && i < ev->n_hashes; i++)
            rk->scratch[i] = kvr_mocker_engine_hash(ev->hashes[i]);
        st = encode_event(rk, ev);
    }
    if (st != KVR_OK) {
        rk->encode_errors++;
        kvr_log_limited(&rk->m->rl_events, KVR_LOG_ERROR,
                        "rank %u: a KV event could not be encoded (%s); subscribers will miss it",
                        rk->idx, kvr_strerror(st));
    }
}

/* Publishes the events gathered since the last flush as one batch. */
void mk_rank_flush(rank_t *rk)
{
    if (!rk->batch_open)
        return;
    rk->batch_open = false;
    const uint8_t *bytes;
    size_t len;
    if (kvr_kv_enc_n_events(rk->enc) == 0 || kvr_kv_enc_end_batch(rk->enc, &bytes, &len) != KVR_OK)
        return;
    uint32_t every = rk->m->cfg.drop_batches_every;
    if (every && (kvr_kv_pub_next_seq(rk->pub) + 1) % every == 0)
        kvr_kv_pub_drop_next(rk->pub, 1);
    int st = kvr_kv_pub_publish(rk->pub, bytes, len, NULL);
    if (st != KVR_OK) {
        rk->publish_errors++;
        kvr_log_limited(&rk->m->rl_events, KVR_LOG_WARN, "rank %u: KV event batch not sent: %s",
                        rk->idx, kvr_strerror(st));
    }
}


/* A replay request is answered as soon as it arrives, not on the next tick: a router that
 * holds live batches while it recovers a gap falls behind by every millisecond this waits.
 * ZMQ_FD is edge-triggered, so the socket is served until it has nothing readable left; past
 * a bound the rest is left for the next loop turn (event_active), so a flood of requests
 * cannot hold the engine's steps. */
static void on_replay_ready(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    rank_t *rk = arg;
    for (int i = 0; i < 16; i++) {
        kvr_kv_pub_poll_replay(rk->pub);
        if (!kvr_kv_pub_replay_readable(rk->pub))
            return;
    }
    event_active(rk->replay_ev, EV_READ, 0);
}

/* The backstop: continues answers that wait for a peer at its HWM (and re-checks the socket,
 * since a send can consume the edge ZMQ_FD would have signalled). */
void mk_ranks_replay_tick(evutil_socket_t fd, short what, void *arg)
{
    kvr_mocker_t *m = arg;
    for (uint32_t r = 0; r < m->cfg.dp_size; r++)
        if (m->ranks[r].replay_ev)
            on_replay_ready(fd, what, &m->ranks[r]);
}

/* ---- stepping ---------------------------------------------------------------------------- */

static void on_step_done(evutil_socket_t fd, short what, void *arg)
{
    rank_t *rk = arg;
    uint64_t now = mk_mono_ns();
    if (now > rk->step_due_ns)
        rk->lag_s += (double)(now - rk->step_due_ns) * 1e-9;
    kvr_engine_step_end(rk->eng, rk->on_output, rk);
    mk_rank_flush(rk);
    rk->stepping = false;
    mk_rank_kick(rk);
}

/* A step due this soon runs at once (from the loop, after pending I/O) instead of through a
 * timer: re-arming a timerfd costs more than a step of a few microseconds. The schedule
 * carries on from the due time, not from when the step ran, so early runs do not add up. */
#define RUN_NOW_NS 20000u

void mk_rank_kick(rank_t *rk)
{
    if (rk->stepping || !kvr_engine_has_work(rk->eng))
        return;
    kvr_engine_step_t s;
    if (kvr_engine_step_begin(rk->eng, &s) != KVR_OK || s.idle) {
        mk_rank_flush(rk);
        return;
    }
    rk->stepping = true;
    uint64_t ns = mk_modelled_ns(rk->m, s.duration_ms * 1e-3), now = mk_mono_ns();
    uint64_t start = rk->step_due_ns > now ? rk->step_due_ns : now;
    rk->step_due_ns = start + ns;
    if (rk->step_due_ns <= now + RUN_NOW_NS) {
        event_active(rk->timer, EV_TIMEOUT, 1);
        return;
    }
    struct timeval tv = mk_tv_of(rk->step_due_ns - now);
    event_add(rk->timer, &tv);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int mk_rank_init(kvr_mocker_t *m, uint32_t idx, void *zmq_ctx, kvr_engine_output_fn on_output,
                 char *err, size_t err_len)
{
    rank_t *rk = &m->ranks[idx];
    rk->m = m;
    rk->idx = idx;
    rk->on_output = on_output;
    int st;
    kvr_engine_config_t ec = m->cfg.engine;
    ec.seed = m->cfg.engine.seed + idx;
    rk->eng = kvr_engine_new(&ec, on_kv_event, rk, &st);
    if (!rk->eng) {
        snprintf(err, err_len, "engine of rank %u: %s", idx, kvr_strerror(st));
        return st;
    }
    rk->timer = evtimer_new(m->base, on_step_done, rk);
    if (!rk->timer)
        return KVR_ENOMEM;
    if (!m->cfg.events.enabled)
        return KVR_OK;
    kvr_kv_enc_config_t encc = {.format = m->cfg.event_format};
    if (!(rk->enc = kvr_kv_enc_new(&encc, &st)))
        return st;
    char ep[KVR_KVCFG_ADDR_BYTES + 16], rep[KVR_KVCFG_ADDR_BYTES + 16] = "";
    if ((st = kvr_kv_pub_endpoint_for_rank(m->cfg.events.endpoint, idx, ep, sizeof ep)) !=
            KVR_OK ||
        (m->cfg.events.replay_endpoint[0] &&
         (st = kvr_kv_pub_endpoint_for_rank(m->cfg.events.replay_endpoint, idx, rep,
                                            sizeof rep)) != KVR_OK)) {
        snprintf(err, err_len, "kv-events-config: no endpoint for rank %u (%s)", idx,
                 kvr_strerror(st));
        return KVR_EINVAL;
    }
    kvr_kv_pub_config_t pc = {.endpoint = ep,
                              .replay_endpoint = rep[0] ? rep : NULL,
                              .topic = m->cfg.events.topic,
                              .buffer_steps = m->cfg.events.buffer_steps,
                              .hwm = (int)(m->cfg.events.hwm > INT32_MAX ? INT32_MAX
                                                                         : m->cfg.events.hwm)};
    if (!(rk->pub = kvr_kv_pub_new(zmq_ctx, &pc, &st, err, err_len)))
        return st;
    int fd = kvr_kv_pub_replay_fd(rk->pub);
    if (fd >= 0) {
        rk->replay_ev = event_new(m->base, fd, EV_READ | EV_PERSIST, on_replay_ready, rk);
        if (!rk->replay_ev || event_add(rk->replay_ev, NULL) != 0)
            return KVR_ENOMEM;
    }
    return KVR_OK;
}

void mk_rank_free(rank_t *rk)
{
    if (rk->timer)
        event_free(rk->timer);
    if (rk->replay_ev)
        event_free(rk->replay_ev);
    kvr_engine_free(rk->eng);
    kvr_kv_pub_free(rk->pub);
    kvr_kv_enc_free(rk->enc);
    free(rk->scratch);
    free(rk->tok_scratch);
}
