/*
 * api_metrics.c: GET /metrics for the HTTP API (Prometheus text, wire/prom.h). The router
 * API's own families (the routing histograms and counters, the scheduler's queue, the load
 * tracker, the ingest thread's per-rank figures, the workers' health, prediction drift) are its
 * service's metrics callback, so that the host's exposition (kvr_http_host_exposition: the
 * host's families, then every service's) is the whole text, for /metrics and for the live
 * page's sampler alike. Threads: the HTTP thread. Cost: O(ranks) per scrape.
 */
#include <stdio.h>
#include <string.h>

#include "api/api_int.h"

static void metrics_router(kvr_api_t *s, kvr_prom_t *p)
{
    kvr_router_stats_t rs;
    kvr_router_stats(s->r, &rs);
    const kvr_prom_by_t results[] = {{"ok", (double)rs.routed},
                                     {"busy", (double)rs.rejected_busy},
                                     {"no_worker", (double)rs.rejected_noworker},
                                     {"unknown_model", (double)rs.rejected_nomodel},
                                     {"invalid", (double)rs.rejected_invalid},
                                     {"duplicate_id", (double)rs.rejected_duplicate},
                                     {"full", (double)rs.rejected_full},
                                     {"too_long", (double)rs.rejected_too_big}};
    kvr_prom_by_label(p, "kvr_routes_total", "counter", "Routing decisions by result.", "result",
                      results, KVR_PROM_N(results));
    kvr_prom_counter(
        p, "kvr_routes_with_overlap_total",
        "Routing decisions whose chosen worker held part of the prompt (stuck at 0 while "
        "events flow means the hashes do not match the engines').",
        (double)s->routes_with_overlap);
    kvr_prom_counter(p, "kvr_queries_total", "POST /v1/query calls.", (double)rs.queries);
    kvr_prom_counter(p, "kvr_inflight_credited_total",
                     "Bookings credited with prompt blocks that requests in flight on their "
                     "worker were computing, before its KV events reported them "
                     "(router_inflight_credit_weight).",
                     (double)rs.inflight_credited);
    kvr_prom_counter(p, "kvr_inflight_credited_blocks_total", "The blocks of those credits.",
                     (double)rs.inflight_credited_blocks);
    const kvr_prom_by_t inf[] = {{"confirmed", (double)rs.inflight_confirmed},
                                 {"expired", (double)rs.inflight_expired}};
    kvr_prom_by_label(p, "kvr_inflight_settled_total", "counter",
                      "Credited bookings settled: their worker's KV events reported every "
                      "credited block (confirmed), or the booking ended or 30 s passed first "
                      "(expired: the credit was wrong, or the events are late or lost).",
                      "outcome", inf, KVR_PROM_N(inf));
    kvr_prom_gauge(p, "kvr_inflight_watched", "Credited bookings not settled yet.",
                   (double)rs.inflight_watched);
    kvr_prom_family(p, "kvr_router_overhead_seconds", "histogram",
                    "Time of a routing decision by stage, seconds.");
    kvr_prom_label_t st[4] = {
        {"stage", "hashing"}, {"stage", "lookup"}, {"stage", "selection"}, {"stage", "total"}};
    kvr_prom_hist(p, "kvr_router_overhead_seconds", &st[0], 1, &s->h_hash);
    kvr_prom_hist(p, "kvr_router_overhead_seconds", &st[1], 1, &s->h_lookup);
    kvr_prom_hist(p, "kvr_router_overhead_seconds", &st[2], 1, &s->h_select);
    kvr_prom_hist(p, "kvr_router_overhead_seconds", &st[3], 1, &s->h_total);
    kvr_session_stats_t ses;
    kvr_router_session_stats(s->r, &ses);
    kvr_prom_gauge(p, "kvr_sessions", "Sticky sessions bound to a worker rank.", (double)ses.live);
    const kvr_prom_by_t sr[] = {
        {"hit", (double)ses.hits}, {"rebind", (double)ses.rebinds}, {"new", (double)ses.binds}};
    kvr_prom_by_label(p, "kvr_session_requests_total", "counter",
                      "Booked requests of sticky sessions: went to the bound rank (hit), went "
                      "elsewhere because it was gone or busy (rebind), or bound a new session.",
                      "outcome", sr, KVR_PROM_N(sr));
    const kvr_prom_by_t se[] = {{"closed", (double)ses.closed},
                                {"expired", (double)ses.expired},
                                {"evicted", (double)ses.evicted}};
    kvr_prom_by_label(p, "kvr_sessions_ended_total", "counter",
                      "Sticky sessions ended: closed by the client, expired (session_ttl_secs), "
                      "evicted (session_max).",
                      "cause", se, KVR_PROM_N(se));
    kvr_load_stats_t ls;
    kvr_load_stats(kvr_router_load(s->r), &ls);
    kvr_prom_gauge(p, "kvr_requests_in_flight", "Requests the load tracker holds.",
                   (double)ls.live_requests);
    kvr_prom_gauge(p, "kvr_requests_in_flight_peers",
                   "Of those, other replicas' bookings (replica sync), in their own budget.",
                   (double)ls.peer_requests);
    kvr_prom_gauge(p, "kvr_requests_in_flight_peer_blocks",
                   "Prompt blocks those peers' bookings hold (router_sync_max_peer_blocks).",
                   (double)ls.peer_blocks);
    kvr_prom_counter(p, "kvr_requests_refused_full_total",
                     "Requests refused: router_max_requests in flight.", (double)ls.full);
    kvr_prom_counter(p, "kvr_sync_peer_budget_full_total",
                     "Peers' bookings refused: router_sync_max_peer_requests in flight.",
                     (double)ls.peer_full);
    kvr_prom_counter(p, "kvr_requests_expired_total",
                     "In-flight requests freed by expiry (lost frees).", (double)ls.expired);
    kvr_prom_counter(p, "kvr_requests_unknown_total",
                     "first_token / output_block / free calls for unknown request ids.",
                     (double)(ls.unknown_frees + ls.unknown_marks));
    kvr_sched_stats_t ss;
    kvr_sched_stats(s->sched, &ss);
    if (ss.queue_on) {
        const kvr_queue_stats_t qs = ss.queue;
        kvr_prom_gauge(p, "kvr_queue_pending", "Requests waiting for a worker.",
                       (double)qs.pending);
        kvr_prom_gauge(p, "kvr_queue_pending_isl_tokens", "Prompt tokens waiting.",
                       (double)qs.pending_isl_tokens);
        kvr_prom_counter(p, "kvr_queue_rejected_total",
                         "Requests refused because the queue was full.", (double)qs.rejected);
        kvr_prom_counter(p, "kvr_queue_expired_total",
                         "Requests that waited past the queue timeout.", (double)qs.expired);
        kvr_prom_counter(p, "kvr_queue_cancelled_total", "Queued requests whose client went away.",
                         (double)qs.cancelled);
        const kvr_prom_by_t by[] = {{"event", (double)ss.dispatched[KVR_SCHED_BY_EVENT]},
                                    {"tick", (double)ss.dispatched[KVR_SCHED_BY_TICK]}};
        kvr_prom_by_label(p, "kvr_queue_dispatched_total", "counter",
                          "Queued requests let go, by what let them: a load change the router "
                          "was told of (event) or the 100 ms tick (a change nothing reported).",
                          "trigger", by, KVR_PROM_N(by));
    }
}

static void metrics_ingest(kvr_api_t *s, kvr_prom_t *p)
{
    kvr_ingest_stats_t g;
    kvr_ingest_stats(s->g, &g);
    kvr_prom_counter(p, "kvr_kv_batches_total", "KV-event batches handed to the decoder.",
                     (double)g.zmq.batches);
    kvr_prom_counter(p, "kvr_kv_events_applied_total", "Events applied to the index.",
                     (double)g.events_applied);
    const kvr_prom_by_t drops[] = {{"rejected_by_index", (double)g.events_rejected},
                                   {"block_size_mismatch", (double)g.block_size_mismatch},
                                   {"decode_error", (double)g.decode.event_errors},
                                   {"unknown_tag", (double)g.decode.events_ignored},
                                   {"remote_locality", (double)g.decode.events_remote},
                                   {"short_token_ids", (double)g.decode.convert_short_tokens}};
    kvr_prom_by_label(p, "kvr_kv_events_dropped_total", "counter", "Events not applied, by cause.",
                      "cause", drops, KVR_PROM_N(drops));
    kvr_prom_counter(
        p, "kvr_kv_batch_decode_errors_total",
        "Batches that could not be framed (treated as gaps; the rank's state is dropped "
        "if a replayed copy is no better).",
        (double)g.zmq.undecodable);
    kvr_prom_counter(p, "kvr_kv_gaps_total", "Sequence gaps seen.", (double)g.zmq.gaps);
    kvr_prom_counter(p, "kvr_kv_gaps_lost_total", "Gaps the replay could not fill (state dropped).",
                     (double)g.zmq.gaps_lost);
    kvr_prom_counter(p, "kvr_kv_replayed_batches_total", "Batches recovered from replay sockets.",
                     (double)g.zmq.replayed);
    kvr_prom_counter(p, "kvr_kv_replay_timeouts_total", "Replay requests that got no answer.",
                     (double)g.zmq.replay_timeouts);
    kvr_prom_counter(
        p, "kvr_kv_resumes_total",
        "Ranks whose saved state (state_file) was reloaded and confirmed by their engine.",
        (double)g.zmq.resumes);
    kvr_prom_counter(p, "kvr_kv_resumes_failed_total",
                     "Ranks whose reloaded state was dropped: their engine restarted or its replay "
                     "buffer no longer held the saved cursor.",
                     (double)g.zmq.resumes_failed);
    kvr_prom_gauge(p, "kvr_kv_replays_in_progress", "Ranks waiting for a replay answer.",
                   (double)g.zmq.replays_in_progress);
    kvr_prom_gauge(p, "kvr_kv_replay_held_batches",
                   "Live batches held until their rank's replay ends.", (double)g.zmq.held_batches);
    kvr_prom_counter(p, "kvr_kv_replay_hold_overflows_total",
                     "Replays given up because the hold was full.", (double)g.zmq.hold_overflows);
    kvr_prom_counter(
        p, "kvr_kv_publisher_restarts_total",
        "Publisher restarts seen (numbers that went back, or a replayed last batch with "
        "other bytes).",
        (double)g.zmq.restarts);
    kvr_prom_counter(p, "kvr_kv_disconnects_total",
                     "Events connections lost (the rank shows unreachable until one is back).",
                     (double)g.zmq.disconnects);
    kvr_prom_counter(p, "kvr_kv_batches_rank_out_of_range_total",
                     "Batches naming a dp_rank their worker does not have, refused whole.",
                     (double)g.rank_out_of_range);
    kvr_prom_counter(p, "kvr_kv_duplicate_batches_total", "Batches dropped as already applied.",
                     (double)g.zmq.duplicates);
    kvr_prom_counter(p, "kvr_kv_bad_messages_total", "Messages without 3 frames or an 8-byte seq.",
                     (double)g.zmq.bad_frames);
    kvr_prom_counter(p, "kvr_kv_state_resets_total", "Rank states dropped.", (double)g.resets);
    kvr_prom_gauge(p, "kvr_index_pairs", "(worker, block) pairs in the prefix index.",
                   (double)g.index.pairs);
    kvr_prom_gauge(p, "kvr_index_max_pairs", "The index budget.", (double)g.index.max_pairs);
    kvr_prom_gauge(p, "kvr_index_nodes", "Distinct prefixes in the index.", (double)g.index.nodes);
    kvr_prom_gauge(p, "kvr_index_bytes", "Memory of the index.", (double)g.index.bytes);
    kvr_prom_counter(p, "kvr_index_evicted_pairs_total", "Pairs evicted to stay within the budget.",
                     (double)g.index.evicted_pairs);
    const kvr_prom_by_t errs[] = {{"parent_not_found", (double)g.index.err_parent_not_found},
                                  {"invalid_sequence", (double)g.index.err_invalid_sequence},
                                  {"block_not_found", (double)g.index.err_block_not_found},
                                  {"capacity", (double)g.index.err_capacity},
                                  {"duplicate_store", (double)g.index.warn_duplicate_store},
                                  {"hash_rebound", (double)g.index.warn_ext_rebound}};
    kvr_prom_by_label(p, "kvr_index_errors_total", "counter",
                      "Index mutations refused or skipped.", "kind", errs, KVR_PROM_N(errs));
}

static void metrics_workers(kvr_api_t *s, kvr_prom_t *p)
{
    static const char *const fams[][2] = {
        {"kvr_worker_index_blocks", "Blocks the index holds for the rank."},
        {"kvr_worker_active_requests", "Requests in flight on the rank."},
        {"kvr_worker_active_prefill_tokens", "Prompt tokens not yet past the first token."},
        {"kvr_worker_active_blocks", "KV blocks the rank's requests hold (deduplicated)."},
        {"kvr_worker_fenced", "1 when the worker failed its health checks."},
        {"kvr_worker_index_state", "1 for the rank's current index state."},
        {"kvr_worker_block_size_mismatches_total", "Events refused for their block size."},
        {"kvr_worker_eagle_mismatches_total",
         "Stored events windowed otherwise than the worker's eagle setting (requests will not "
         "match them)."},
    };
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(s->r, ids, 4096);
    for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
        kvr_prom_family(p, fams[f][0], f >= 6 ? "counter" : "gauge", fams[f][1]);
        for (size_t i = 0; i < n && i < 4096; i++) {
            const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
            for (uint32_t d = 0; sp != NULL && d < sp->dp_size; d++) {
                kvr_worker_t wk = {sp->worker_id, sp->dp_start + d};
                char wid[24], rk[12];
                snprintf(wid, sizeof wid, "%llu", (unsigned long long)wk.worker_id);
                snprintf(rk, sizeof rk, "%u", wk.dp_rank);
                kvr_rank_status_t st = {0};
                (void)kvr_router_rank_status(s->r, wk, &st);
                kvr_load_snapshot_t ls;
                kvr_load_snapshot(kvr_router_load(s->r), wk, &ls);
                kvr_prom_label_t l[5] = {{"worker_id", wid},
                                         {"dp_rank", rk},
                                         {"model", sp->model},
                                         {"role", kvr_worker_role_name(sp->role)},
                                         {"state", kvr_fleet_index_state(s->fleet, sp, &st)}};
                double v[] = {(double)st.index_blocks,
                              ls.active_requests,
                              (double)ls.active_prefill_tokens,
                              (double)ls.active_blocks,
                              kvr_router_fenced(s->r, wk.worker_id) ? 1 : 0,
                              1,
                              (double)st.block_size_mismatches,
                              (double)st.eagle_mismatches};
                kvr_prom_sample(p, fams[f][0], l, f == 5 ? 5 : 4, v[f]); /* state: one */
            }
        }
    }
    kvr_prom_family(p, "kvr_worker_kv_capacity_blocks", "gauge",
                    "The worker's KV-cache size in its blocks (0: unknown), given or learnt "
                    "from its /metrics.");
    for (size_t i = 0; i < n && i < 4096; i++) {
        const kvr_worker_spec_t *sp = kvr_router_worker(s->r, ids[i]);
        char wid[24];
        snprintf(wid, sizeof wid, "%llu", (unsigned long long)ids[i]);
        kvr_prom_label_t l[] = {{"worker_id", wid}};
        kvr_prom_sample(p, "kvr_worker_kv_capacity_blocks", l, 1,
                        sp ? (double)sp->total_kv_blocks : 0);
    }
    uint64_t f[3];
    kvr_fleet_capacity_fetches(s->fleet, f);
    const kvr_prom_by_t fetches[] = {
        {"learnt", (double)f[0]}, {"not_exposed", (double)f[1]}, {"failed", (double)f[2]}};
    kvr_prom_by_label(p, "kvr_worker_capacity_fetches_total", "counter",
                      "Reads of a worker's KV-cache size from its /metrics, by result.", "result",
                      fetches, KVR_PROM_N(fetches));
}

void api_metrics(void *arg, kvr_prom_t *p)
{
    kvr_api_t *s = arg;
    kvr_fleet_sync(s->fleet);
    metrics_router(s, p);
    if (s->g != NULL)
        metrics_ingest(s, p);
    metrics_workers(s, p);
    kvr_fleet_drift_metrics(s->fleet, p);
}

void api_h_metrics(kvr_api_t *s, struct evhttp_request *req)
{
    kvr_prom_reset(&s->prom);
    kvr_http_host_exposition(s->host, &s->prom);
    kvr_reply_body(s->rep, req, 200, "text/plain; version=0.0.4", s->prom.buf ? s->prom.buf : "",
                   s->prom.len);
}
