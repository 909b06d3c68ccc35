/*
 * fleet_drift.c: the fleet's side of the index checking itself (fleet.h,
 * kvr_fleet_report_cached): the front end reports each answer's engine-reported cached tokens
 * against its prediction; fleet/drift.c judges; this file acts on a change (a rate-limited
 * log naming the rank, its agreement and which way it misses; per prediction_drift_action a
 * resync through the ingest thread, at most once a window since drift.c says STILL only after
 * a full fresh window, or approximate routing of the rank (core/overlay.h) until its events
 * agree again) and renders the kvr_prediction_* metrics. The prediction judged is always the
 * one the rank's events make, also while it is routed approximately.
 * Why resync is the default action: the engine's replay buffer is the engine's own record of
 * what it stored and evicted, in order, so it repairs both ways a rank drifts (blocks the index
 * never heard of, and blocks it still lists after the engine evicted them) without routing on
 * guesses; a rank without a replay socket has its state dropped instead (what it lists is known
 * to be wrong) and learns again from its next events. A rank whose events are wrong at the
 * source is flagged again a window after each resync; approximate suits it better.
 * Threads: the HTTP thread (a resync waits for the ingest thread to take the command: one
 * wake-up, not the replay). Cost: O(ranks) per report (drift.c's search).
 */
#include <stdio.h>
#include <string.h>

#include "base/log.h"
#include "fleet/fleet_int.h"

enum { RESYNC_ASKED = 0, RESYNC_DROPPED, RESYNC_BUSY, RESYNC_FAILED };

int fleet_drift_init(kvr_fleet_t *f)
{
    f->rl_drift = (kvr_ratelimit_t)KVR_RATELIMIT_INIT(10000, 8);
    if (f->g == NULL || f->cfg.prediction_drift_window == 0 ||
        f->cfg.router_mode != KVR_MODE_KV || !f->cfg.use_kv_events)
        return KVR_OK;
    kvr_drift_config_t dc = {.window = f->cfg.prediction_drift_window,
                             .min_accuracy = f->cfg.prediction_drift_min_accuracy};
    f->drift = kvr_drift_new(&dc);
    return f->drift != NULL ? KVR_OK : KVR_ENOMEM;
}

void fleet_drift_free(kvr_fleet_t *f)
{
    kvr_drift_free(f->drift);
    f->drift = NULL;
}

const kvr_drift_t *kvr_fleet_drift(const kvr_fleet_t *f) { return f->drift; }

/* Rebuilds w from its engine's replay buffer; what happened, for the log. */
static const char *resync(kvr_fleet_t *f, kvr_worker_t w)
{
    int rc = kvr_ingest_resync(f->g, w);
    kvr_drift_restart(f->drift, w); /* samples before it judged the old state */
    switch (rc) {
    case KVR_OK:
        f->resyncs[RESYNC_ASKED]++;
        return "its state is rebuilt from its engine's replay buffer";
    case KVR_EINVAL:
        f->resyncs[RESYNC_DROPPED]++;
        return "it has no replay socket: its state is dropped and learnt again from its next "
               "events";
    case KVR_EBUSY:
        f->resyncs[RESYNC_BUSY]++;
        return "a replay of it is already in progress";
    default:
        f->resyncs[RESYNC_FAILED]++;
        return "the resync could not be asked (its state was dropped)";
    }
}

/* Routes w approximately (or by its events again); what happened, for the log. */
static const char *approximate(kvr_fleet_t *f, kvr_worker_t w, bool on)
{
    int rc = kvr_router_set_rank_approximate(f->r, w, on);
    if (rc != KVR_OK)
        return on ? "it could not be routed approximately (out of memory)" : "";
    f->approximations += on ? 1 : 0;
    return on ? "it is routed on the router's own decisions until its events agree again"
              : "; routed by its events again";
}

/* What prediction_drift_action does about a rank found (still) drifting. */
static const char *act(kvr_fleet_t *f, kvr_worker_t w, kvr_drift_change_t ch)
{
    switch (f->cfg.prediction_drift_action) {
    case KVR_DRIFT_RESYNC:
        return resync(f, w);
    case KVR_DRIFT_APPROXIMATE:
        return ch == KVR_DRIFT_FLAGGED ? approximate(f, w, true)
                                       : "it is still routed on the router's own decisions";
    default:
        return "flagged only (prediction_drift_action flag)";
    }
}

static void on_change(kvr_fleet_t *f, kvr_worker_t w, kvr_drift_change_t ch)
{
    kvr_drift_view_t v;
    (void)kvr_drift_view(f->drift, w, &v);
    if (ch == KVR_DRIFT_RECOVERED) {
        const char *back = kvr_router_rank_approximate(f->r, w) ? approximate(f, w, false) : "";
        kvr_log_limited(&f->rl_drift, KVR_LOG_INFO,
                        "worker %llu rank %u: predictions agree again (%u of the last %u "
                        "answers)%s",
                        (unsigned long long)w.worker_id, w.dp_rank, v.window_agreeing,
                        v.window_samples, back);
        return;
    }
    uint32_t agreeing = v.window_agreeing, samples = v.window_samples;
    double mean = v.mean_error;
    const char *what = act(f, w, ch);
    kvr_log_limited(&f->rl_drift, KVR_LOG_WARN,
                    "worker %llu rank %u: predictions %s: %u of the last %u answers agree with "
                    "the cached tokens its engine reported (prediction_drift_min_accuracy "
                    "%.2f), mean error %+.0f tokens (%s); %s",
                    (unsigned long long)w.worker_id, w.dp_rank,
                    ch == KVR_DRIFT_FLAGGED ? "drifting" : "still drifting", agreeing, samples,
                    f->cfg.prediction_drift_min_accuracy, mean,
                    mean >= 0 ? "the index misses blocks the engine holds: KV events lost or "
                                "wrong?"
                              : "the index lists blocks the engine does not hold: removals "
                                "lost or events wrong?",
                    what);
}

void kvr_fleet_report_cached(kvr_fleet_t *f, const kvr_fleet_cached_report_t *r)
{
    if (f->drift == NULL)
        return;
    const kvr_worker_spec_t *sp = kvr_router_worker(f->r, r->w.worker_id);
    if (sp == NULL || sp->events[0] == '\0')
        return; /* gone, or not learnt from events: nothing here to check */
    if (!r->asked) {
        f->cached_not_asked++; /* the client did not ask: the engine is not to blame */
        return;
    }
    if (!r->has_report) {
        f->cached_unreported++;
        return;
    }
    f->cached_reported++;
    kvr_drift_sample_t s = {.w = r->w,
                            .prompt_tokens = r->prompt_tokens,
                            .predicted = r->predicted,
                            .reported = r->reported,
                            .block_size = sp->block_size ? sp->block_size : f->cfg.block_size,
                            .now_ms = kvr_now_ms()};
    kvr_drift_change_t ch = kvr_drift_observe(f->drift, &s);
    if (ch != KVR_DRIFT_SAME)
        on_change(f, r->w, ch);
}

void kvr_fleet_drift_metrics(const kvr_fleet_t *f, kvr_prom_t *p)
{
    if (f->drift == NULL)
        return;
    kvr_prom_family(p, "kvr_prediction_error_tokens", "histogram",
                    "|engine-reported - predicted| cached prompt tokens of each answer compared.");
    kvr_prom_hist(p, "kvr_prediction_error_tokens", NULL, 0, kvr_drift_error_hist(f->drift));
    const kvr_prom_by_t rep[] = {{"reported", (double)f->cached_reported},
                                 {"unreported", (double)f->cached_unreported},
                                 {"not_asked", (double)f->cached_not_asked}};
    kvr_prom_by_label(p, "kvr_prediction_answers_total", "counter",
                      "Answers of ranks with KV events, by whether their engine reported "
                      "usage.prompt_tokens_details.cached_tokens (vLLM: "
                      "--enable-prompt-tokens-details); not_asked: streams whose client did not "
                      "set stream_options.include_usage (no usage to carry).",
                      "report", rep, KVR_PROM_N(rep));
    const kvr_drift_tokens_t tk = kvr_drift_tokens(f->drift);
    const kvr_prom_by_t tok[] = {{"prompt", (double)tk.prompt},
                                 {"predicted_cached", (double)tk.predicted_cached},
                                 {"reported_cached", (double)tk.reported_cached}};
    kvr_prom_by_label(p, "kvr_prediction_tokens_total", "counter",
                      "Over the answers whose engine reported cached tokens: their prompt "
                      "tokens, the tokens the router predicted cached on the chosen rank, and "
                      "those the engine reported cached (predicted_cached / prompt is the hit "
                      "ratio as predicted, reported_cached / prompt as reported).",
                      "kind", tok, KVR_PROM_N(tok));
    const kvr_prom_by_t rs[] = {{"asked", (double)f->resyncs[RESYNC_ASKED]},
                                {"dropped", (double)f->resyncs[RESYNC_DROPPED]},
                                {"busy", (double)f->resyncs[RESYNC_BUSY]},
                                {"failed", (double)f->resyncs[RESYNC_FAILED]}};
    kvr_prom_by_label(p, "kvr_prediction_resyncs_total", "counter",
                      "Drifting ranks rebuilt: replay asked, state dropped (no replay socket), "
                      "a replay already running, could not be asked.",
                      "result", rs, KVR_PROM_N(rs));
    kvr_prom_counter(p, "kvr_prediction_approximations_total",
                     "Drifting ranks switched to routing on the router's own decisions "
                     "(prediction_drift_action approximate).",
                     (double)f->approximations);
    static const char *const fams[][3] = {
        {"kvr_prediction_accuracy", "gauge",
         "Share of the rank's last prediction_drift_window answers whose predicted cached "
         "tokens agree with its engine's report (1 before any)."},
        {"kvr_prediction_drifting", "gauge", "1 while the rank's predictions are drifting."},
        {"kvr_prediction_compared_total", "counter", "Answers of the rank compared."},
        {"kvr_prediction_drift_flags_total", "counter", "Times the rank was found drifting."},
        {"kvr_prediction_approximate", "gauge",
         "1 while the rank is routed on the router's own decisions, not its events."},
    };
    uint64_t ids[4096];
    size_t n = kvr_router_worker_ids(f->r, ids, 4096);
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
        kvr_prom_family(p, fams[k][0], fams[k][1], fams[k][2]);
        for (size_t i = 0; i < n && i < 4096; i++) {
            const kvr_worker_spec_t *sp = kvr_router_worker(f->r, ids[i]);
            for (uint32_t d = 0; sp != NULL && sp->events[0] != '\0' && d < sp->dp_size; d++) {
                kvr_worker_t w = {sp->worker_id, sp->dp_start + d};
                kvr_drift_view_t v;
                (void)kvr_drift_view(f->drift, w, &v);
                char wid[24], rk[12];
                snprintf(wid, sizeof wid, "%llu", (unsigned long long)w.worker_id);
                snprintf(rk, sizeof rk, "%u", w.dp_rank);
                kvr_prom_label_t l[] = {{"worker_id", wid}, {"dp_rank", rk}};
                double vals[] = {v.accuracy, v.drifting ? 1 : 0, (double)v.compared,
                                 (double)v.flagged,
                                 kvr_router_rank_approximate(f->r, w) ? 1 : 0};
                kvr_prom_sample(p, fams[k][0], l, 2, vals[k]);
            }
        }
    }
}
