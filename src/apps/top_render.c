/*
 * top_render.c: `kvrouter top`'s frame (see top.h): a header, the failure line, the latest
 * point's figures, two sparklines, the fleet table (one row per worker rank, columns dropped
 * least needed first when the terminal is narrow) and the reasons of the ranks that are not
 * `exact`. Invariants: a frame never holds more lines than o->rows, nor a line more columns
 * than o->width. Cost: O(ranks x columns) formatting.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "apps/top.h"
#include "base/grow.h"

/* "router unreachable ...", "router answered 401 ..." for the status line and --once. */
void top_problem_text(const top_t *t, char *out, size_t cap)
{
    const top_problem_t *p = &t->problem;
    const char *url = t->args.url, *why = p->why;
    if (p->status == 0)
        snprintf(out, cap, "router unreachable at %s: %s", url, why);
    else if (p->status == 401)
        snprintf(out, cap, "router at %s answered 401 to GET %s: %s%s%s%s", url, p->path,
                 t->args.key_file ? "the key of --key-file was refused"
                                  : "it needs a key (give --key-file)",
                 why[0] ? " (" : "", why, why[0] ? ")" : "");
    else if (p->status == 200)
        snprintf(out, cap, "router at %s: GET %s: %s", url, p->path, why);
    else
        snprintf(out, cap, "router at %s answered HTTP %d to GET %s%s%s", url, p->status, p->path,
                 why[0] ? ": " : "", why);
}

/* ---- the frame: lines clipped to the terminal ------------------------------------------------ */


static void out_bytes(top_out_t *o, const char *s, size_t n)
{
    if (o->nomem || kvr_grow((void **)&o->buf, &o->cap, o->len + n + 1, SIZE_MAX / 2, 1) != 0) {
        o->nomem = true;
        return;
    }
    memcpy(o->buf + o->len, s, n);
    o->len += n;
    o->buf[o->len] = '\0';
}

static void out_sgr(top_out_t *o, const char *sgr)
{
    char esc[16];
    if (o->ansi && !o->full) {
        int n = snprintf(esc, sizeof esc, "\033[%sm", sgr);
        out_bytes(o, esc, (size_t)n);
    }
}

/* Begins a line; false when the frame is full. */
static bool out_line(top_out_t *o)
{
    if (o->full || (o->rows > 0 && o->lines >= o->rows)) {
        o->full = true;
        return false;
    }
    if (o->lines > 0)
        out_bytes(o, o->ansi ? "\033[0m\033[K\r\n" : "\n", o->ansi ? 9 : 1);
    o->lines++;
    o->col = 0;
    return true;
}

/* Columns left on the line (INT32_MAX without a limit). */
static int out_room(const top_out_t *o)
{
    return o->full ? 0 : o->width > 0 ? o->width - o->col : INT32_MAX;
}

/* Visible ASCII text, cut at the line's end. */
static void out_text(top_out_t *o, const char *s)
{
    size_t n = strlen(s);
    int room = out_room(o);
    if ((size_t)room < n)
        n = (size_t)room;
    out_bytes(o, s, n);
    o->col += (int)n;
}

static void out_fmt(top_out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out_fmt(top_out_t *o, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    out_text(o, line);
}

/* One glyph of one column given as UTF-8. */
static void out_glyph(top_out_t *o, const char *utf8)
{
    if (out_room(o) > 0) {
        out_bytes(o, utf8, strlen(utf8));
        o->col++;
    }
}

/* s left- or right-aligned in w columns (cut to w, its last column then '~'). */
static void out_cell(top_out_t *o, const char *s, int w, bool left)
{
    char cell[128];
    snprintf(cell, sizeof cell, left ? "%-*.*s" : "%*.*s", w, w, s);
    if (w >= 2 && (int)strlen(s) > w && w < (int)sizeof cell)
        cell[w - 1] = '~'; /* cut: says so */
    out_text(o, cell);
}

/* Ends the frame: the rest of the last line and the screen below it cleared. */
static void out_finish(top_out_t *o)
{
    if (o->ansi)
        out_bytes(o, "\033[0m\033[K\033[J", 10);
    else if (o->lines > 0)
        out_bytes(o, "\n", 1);
}

/* ---- numbers as shown ------------------------------------------------------------------------ */

/* "-" for NAN; else with decimals that suit its size: 0.42, 4.9, 35, 12345. */
static const char *num(double v, char *buf, size_t cap)
{
    if (!isfinite(v))
        snprintf(buf, cap, "-");
    else if (v == floor(v) && fabs(v) < 1e15)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, fabs(v) >= 100 ? "%.0f" : fabs(v) >= 10 ? "%.1f" : "%.2f", v);
    return buf;
}

/* A ratio in [0, 1] as 0.42; "-" for NAN. */
static const char *ratio(double v, char *buf, size_t cap)
{
    snprintf(buf, cap, isfinite(v) ? "%.2f" : "-", v);
    return buf;
}

/* "a/b" of two numbers. */
static const char *pair(double a, double b, bool ratios, char *buf, size_t cap)
{
    char x[32], y[32];
    snprintf(buf, cap, "%s/%s", ratios ? ratio(a, x, sizeof x) : num(a, x, sizeof x),
             ratios ? ratio(b, y, sizeof y) : num(b, y, sizeof y));
    return buf;
}

static void duration(double ms, char *buf, size_t cap)
{
    if (!isfinite(ms) || ms < 0) {
        snprintf(buf, cap, "-");
        return;
    }
    unsigned long long s = (unsigned long long)(ms / 1000);
    if (s < 3600)
        snprintf(buf, cap, "%llum%02llus", s / 60, s % 60);
    else if (s < 86400)
        snprintf(buf, cap, "%lluh%02llum", s / 3600, s / 60 % 60);
    else
        snprintf(buf, cap, "%llud%02lluh", s / 86400, s / 3600 % 24);
}

static void clock_text(time_t when, char *buf, size_t cap)
{
    struct tm tm;
    if (when == 0 || localtime_r(&when, &tm) == NULL || strftime(buf, cap, "%H:%M:%S", &tm) == 0)
        snprintf(buf, cap, "-");
}

/* ---- the parts of a frame -------------------------------------------------------------------- */

/* One item, "label value unit", into items[*n]. */
#define TOP_ITEM 96
static void item(char items[][TOP_ITEM], size_t *n, const char *label, const char *value,
                 const char *unit)
{
    char *out = items[(*n)++];
    if (snprintf(out, TOP_ITEM, "%s%s%s%s", label, label[0] ? " " : "", value, unit) < 0)
        out[0] = '\0';
}

/* Items after what the current line holds, three spaces apart, an item that does not fit
 * the line's room starting the next line. */
static void out_items(top_out_t *o, char items[][TOP_ITEM], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int len = (int)strlen(items[i]) + (o->col > 0 ? 3 : 0);
        if (o->col > 0 && len > out_room(o) && !out_line(o))
            return;
        out_text(o, o->col > 0 ? "   " : "");
        out_text(o, items[i]);
    }
}

/* text on lines of its own (at most max_lines), broken at spaces, in colour sgr. */
static void out_wrap(top_out_t *o, const char *text, const char *sgr, int max_lines)
{
    int lines = 0;
    while (*text != '\0' && lines < max_lines && out_line(o)) {
        lines++;
        size_t room = (size_t)out_room(o), n = strlen(text);
        if (n > room) { /* the last space that fits, or a cut when there is none */
            size_t cut = room;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            n = cut > 0 ? cut : room;
        }
        char piece[512];
        snprintf(piece, sizeof piece, "%.*s", (int)(n < sizeof piece ? n : sizeof piece - 1), text);
        out_sgr(o, sgr);
        out_text(o, piece);
        out_sgr(o, "0");
        text += n;
        while (*text == ' ')
            text++;
    }
}

static void render_header(top_out_t *o, const top_t *t)
{
    const top_history_t *h = &t->hist;
    char items[10][TOP_ITEM], x[64];
    size_t n = 0;
    item(items, &n, "", t->args.url, "");
    item(items, &n, "mode", t->fleet.mode[0] ? t->fleet.mode : "-", "");
    item(items, &n, "policy", t->fleet.policy[0] ? t->fleet.policy : "-", "");
    item(items, &n, "version", h->version[0] ? h->version : "-", "");
    duration(h->served ? h->now_ms - h->started_ms : NAN, x, sizeof x);
    item(items, &n, "up", x, "");
    snprintf(x, sizeof x, "%zu, ranks %zu", t->fleet.n_workers, t->fleet.n_ranks);
    item(items, &n, "workers", x, "");
    char every[32];
    clock_text(t->last_ok, x, sizeof x);
    snprintf(every, sizeof every, " (every %.1f s)", t->args.interval_ms / 1000.0);
    item(items, &n, "refreshed", x, every);
    if (o->ansi)
        item(items, &n, "", "q quits", "");
    if (!out_line(o))
        return;
    out_sgr(o, "1");
    out_text(o, "kvrouter top");
    out_sgr(o, "0");
    out_items(o, items, n);
}

/* The failure line (reverse red when coloured): what went wrong and that top retries. */
static void render_problem(top_out_t *o, const top_t *t)
{
    if (!t->problem.failed)
        return;
    char text[700], full[900], at[16] = "";
    top_problem_text(t, text, sizeof text);
    if (t->last_ok != 0)
        clock_text(t->last_ok, at, sizeof at);
    snprintf(full, sizeof full, "%s; retrying every %.1f s%s%s%s", text,
             t->args.interval_ms / 1000.0, at[0] ? " (figures below as of " : "", at,
             at[0] ? ")" : "");
    out_wrap(o, full, "1;7;31", 4);
}

/* The latest point's figures, as items wrapped onto as many lines as the width needs. */
static void render_summary(top_out_t *o, const top_t *t)
{
    const top_history_t *h = &t->hist;
    if (!h->served) {
        if (t->last_ok != 0 && out_line(o))
            out_text(o, "this router serves no /v1/stats: no figures or sparklines");
        return;
    }
    top_point_t p;
    for (int i = 0; i < P_N; i++)
        p.v[i] = h->n > 0 ? h->pts[h->n - 1].v[i] : NAN;
    char items[12][TOP_ITEM], x[48];
    size_t ni = 0;
    item(items, &ni, "decisions", num(p.v[P_DECISIONS], x, sizeof x), "/s");
    item(items, &ni, "refusals", num(p.v[P_REFUSALS], x, sizeof x), "/s");
    item(items, &ni, "in flight", num(p.v[P_IN_FLIGHT], x, sizeof x), "");
    item(items, &ni, "queue", num(p.v[P_QUEUE], x, sizeof x), "");
    item(items, &ni, "hit pred/rep", pair(p.v[P_HIT_PRED], p.v[P_HIT_REP], true, x, sizeof x), "");
    item(items, &ni, "TTFT p50/p99", pair(p.v[P_TTFT50], p.v[P_TTFT99], false, x, sizeof x), " ms");
    item(items, &ni, "ITL p50/p99", pair(p.v[P_ITL50], p.v[P_ITL99], false, x, sizeof x), " ms");
    item(items, &ni, "KV events", num(p.v[P_KV_EVENTS], x, sizeof x), "/s");
    item(items, &ni, "gaps", num(p.v[P_GAPS], x, sizeof x), "");
    item(items, &ni, "errors", num(p.v[P_ERRORS], x, sizeof x), "/s");
    if (isfinite(p.v[P_PEERS])) {
        item(items, &ni, "replica peers", num(p.v[P_PEERS], x, sizeof x), "");
        item(items, &ni, "sync lag p50/p99", pair(p.v[P_LAG50], p.v[P_LAG99], false, x, sizeof x),
             " ms");
    }
    if (out_line(o))
        out_items(o, items, ni);
}

/* The replicas line, once /v1/routers has answered. */
static void render_replicas(top_out_t *o, const top_t *t)
{
    const top_replicas_t *r = &t->reps;
    char lag[32];
    if (r->asked != ROUTERS_YES || !out_line(o))
        return;
    out_fmt(o, "replicas  this router %s  NATS %s  %zu peer%s  largest sync lag %s ms",
            r->self[0] ? r->self : "-", r->nats[0] ? r->nats : "-", r->peers,
            r->peers == 1 ? "" : "s", num(r->lag_max_ms, lag, sizeof lag));
}

/* label, a sparkline of one figure over the points held, and its latest and largest values. */
static void render_spark(top_out_t *o, const top_t *t, const char *label, int at)
{
    static const char *const BARS[8] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                        "\u2585", "\u2586", "\u2587", "\u2588"};
    const top_history_t *h = &t->hist;
    double vmax = NAN, last = NAN;
    for (size_t i = 0; i < h->n; i++) {
        double v = h->pts[i].v[at];
        if (isfinite(v) && !(v <= vmax))
            vmax = v;
        last = v;
    }
    char a[32], b[32], tail[80];
    snprintf(tail, sizeof tail, "  now %s  max %s", num(last, a, sizeof a), num(vmax, b, sizeof b));
    if (!out_line(o))
        return;
    out_fmt(o, "%-14s ", label);
    int room = out_room(o) - (int)strlen(tail);
    size_t n = h->n, first = room > 0 && (size_t)room < n ? n - (size_t)room : 0;
    for (size_t i = first; i < n && room > 0; i++) {
        double v = h->pts[i].v[at];
        if (!isfinite(v))
            out_text(o, " ");
        else
            out_glyph(o, BARS[vmax > 0 ? (int)lround(v / vmax * 7) : 0]);
    }
    out_text(o, tail);
}

/* ---- the fleet table ----------------------------------------------------------------------- */

enum {
    COL_WORKER,
    COL_DP,
    COL_STATE,
    COL_ROLE,
    COL_MODEL,
    COL_ACTIVE,
    COL_PREFILL,
    COL_DECODE,
    COL_INDEXED,
    COL_HIT,
    COL_STEP,
    N_COLS
};

/* The columns; when the width is short, those with the largest `drop` go first (0: never). */
static const struct {
    const char *head;
    int drop;
    bool left;
} COLS[N_COLS] = {
    [COL_WORKER] = {"worker", 0, true},        [COL_DP] = {"dp", 4, false},
    [COL_STATE] = {"state", 0, true},          [COL_ROLE] = {"role", 9, true},
    [COL_MODEL] = {"model", 10, true},         [COL_ACTIVE] = {"active req", 2, false},
    [COL_PREFILL] = {"prefill tok", 6, false}, [COL_DECODE] = {"decode blk/cap (%)", 3, false},
    [COL_INDEXED] = {"indexed blk", 5, false}, [COL_HIT] = {"hit pred/rep", 7, false},
    [COL_STEP] = {"step ms", 8, false},
};

#define TOP_MODEL_MIN 8 /* the model column shrinks to this before columns are dropped */

/* The text of one cell. */
static void rank_cell(const top_rank_t *r, int col, char *out, size_t cap)
{
    char a[32], b[32];
    switch (col) {
    case COL_WORKER:
        snprintf(out, cap, "%s", r->worker);
        break;
    case COL_DP:
        num(r->dp_rank, out, cap);
        break;
    case COL_STATE:
        snprintf(out, cap, "%s", r->state[0] ? r->state : "-");
        break;
    case COL_ROLE:
        snprintf(out, cap, "%s", r->role[0] ? r->role : "-");
        break;
    case COL_MODEL:
        snprintf(out, cap, "%s", r->model[0] ? r->model : "-");
        break;
    case COL_ACTIVE:
        num(r->active, out, cap);
        break;
    case COL_PREFILL:
        num(r->prefill_tokens, out, cap);
        break;
    case COL_DECODE:
        if (isfinite(r->capacity) && r->capacity > 0 && isfinite(r->blocks))
            snprintf(out, cap, "%s/%s (%.*f%%)", num(r->blocks, a, sizeof a),
                     num(r->capacity, b, sizeof b), r->blocks / r->capacity < 0.1 ? 1 : 0,
                     100 * r->blocks / r->capacity);
        else
            snprintf(out, cap, "%s/-", num(r->blocks, a, sizeof a));
        break;
    case COL_INDEXED:
        num(r->indexed, out, cap);
        break;
    case COL_HIT:
        if (isfinite(r->prompt_tokens) && r->prompt_tokens > 0)
            pair(r->predicted / r->prompt_tokens, r->reported / r->prompt_tokens, true, out, cap);
        else
            snprintf(out, cap, "-");
        break;
    default:
        num(r->step_ms, out, cap);
        break;
    }
}

/* The colour of a state word: a help only, the word is always shown. */
static const char *state_sgr(const char *s)
{
    if (strcmp(s, "exact") == 0)
        return "32";
    if (strcmp(s, "unreachable") == 0 || strcmp(s, "fenced") == 0 || strcmp(s, "error") == 0)
        return "1;31";
    if (strcmp(s, "degraded") == 0 || strcmp(s, "drifting") == 0 || strcmp(s, "recovering") == 0)
        return "33";
    return "36"; /* approximate, no_events: nothing wrong, nothing exact either */
}

/* Column widths for the ranks and the terminal's width: 0 for a column left out. */
static void table_widths(const top_fleet_t *f, int width, int w[N_COLS])
{
    char cell[128];
    for (int c = 0; c < N_COLS; c++)
        w[c] = (int)strlen(COLS[c].head);
    for (size_t i = 0; i < f->n_ranks; i++)
        for (int c = 0; c < N_COLS; c++) {
            rank_cell(&f->ranks[i], c, cell, sizeof cell);
            if ((int)strlen(cell) > w[c])
                w[c] = (int)strlen(cell);
        }
    for (;;) {
        int total = -2;
        for (int c = 0; c < N_COLS; c++)
            total += w[c] > 0 ? w[c] + 2 : 0;
        if (width <= 0 || total <= width)
            return;
        if (w[COL_MODEL] > TOP_MODEL_MIN) {
            int cut = total - width;
            w[COL_MODEL] = w[COL_MODEL] - cut > TOP_MODEL_MIN ? w[COL_MODEL] - cut : TOP_MODEL_MIN;
            continue;
        }
        int worst = -1;
        for (int c = 0; c < N_COLS; c++)
            if (w[c] > 0 && COLS[c].drop > 0 && (worst < 0 || COLS[c].drop > COLS[worst].drop))
                worst = c;
        if (worst < 0)
            return; /* the line is cut at its end */
        w[worst] = 0;
    }
}

static void render_row(top_out_t *o, const top_rank_t *r, const int w[N_COLS])
{
    char cell[128];
    for (int c = 0, first = 1; c < N_COLS; c++) {
        if (w[c] == 0)
            continue;
        out_text(o, first ? "" : "  ");
        first = 0;
        rank_cell(r, c, cell, sizeof cell);
        if (c == COL_STATE)
            out_sgr(o, state_sgr(cell));
        out_cell(o, cell, w[c], COLS[c].left);
        if (c == COL_STATE)
            out_sgr(o, "0");
    }
}

/* Lines the frame has left after `used` (rows 0: no limit). */
static size_t lines_left(const top_out_t *o)
{
    return o->rows <= 0 ? SIZE_MAX : o->lines >= o->rows ? 0 : (size_t)(o->rows - o->lines);
}

static void render_table(top_out_t *o, const top_t *t)
{
    const top_fleet_t *f = &t->fleet;
    if (t->last_ok == 0 && f->n_ranks == 0)
        return; /* nothing read yet: no table */
    int w[N_COLS];
    table_widths(f, o->width, w);
    if (!out_line(o) || !out_line(o))
        return;
    out_sgr(o, "1;4");
    for (int c = 0, first = 1; c < N_COLS; c++) {
        if (w[c] == 0)
            continue;
        out_text(o, first ? "" : "  ");
        first = 0;
        out_cell(o, COLS[c].head, w[c], COLS[c].left);
    }
    out_sgr(o, "0");
    size_t room = lines_left(o);
    size_t shown = f->n_ranks <= room ? f->n_ranks : room > 0 ? room - 1 : 0;
    for (size_t i = 0; i < shown && out_line(o); i++)
        render_row(o, &f->ranks[i], w);
    if (shown < f->n_ranks && out_line(o))
        out_fmt(o, "... %zu more ranks (a taller terminal shows them)", f->n_ranks - shown);
    if (f->n_ranks == 0 && t->last_ok != 0 && out_line(o))
        out_text(o, "(no workers registered)");
}

/* Whether rank b follows rank a of the same worker in the same state for the same reason. */
static bool same_note(const top_rank_t *a, const top_rank_t *b)
{
    return strcmp(a->worker, b->worker) == 0 && b->dp_rank == a->dp_rank + 1 &&
           strcmp(a->state, b->state) == 0 && strcmp(a->why, b->why) == 0;
}

/* Why each rank that is not exact is in its state (a run of ranks of one worker alike on one
 * line), while there is room. */
static void render_notes(top_out_t *o, const top_t *t)
{
    const top_fleet_t *f = &t->fleet;
    bool first = true;
    for (size_t i = 0, j; i < f->n_ranks && lines_left(o) > (first ? 1u : 0u); i = j) {
        const top_rank_t *r = &f->ranks[i];
        for (j = i + 1; j < f->n_ranks && same_note(&f->ranks[j - 1], &f->ranks[j]); j++)
            ;
        if (r->why[0] == '\0')
            continue;
        if ((first && !out_line(o)) || !out_line(o))
            return;
        first = false;
        char a[32], b[32];
        if (j - i == 1)
            out_fmt(o, "worker %s rank %s %s: %s", r->worker, num(r->dp_rank, a, sizeof a),
                    r->state, r->why);
        else
            out_fmt(o, "worker %s ranks %s-%s %s: %s", r->worker, num(r->dp_rank, a, sizeof a),
                    num(f->ranks[j - 1].dp_rank, b, sizeof b), r->state, r->why);
    }
}

void top_render(top_out_t *o, const top_t *t)
{
    if (o->ansi)
        out_bytes(o, "\033[H", 3);
    render_header(o, t);
    render_problem(o, t);
    render_summary(o, t);
    render_replicas(o, t);
    if (t->hist.served) {
        render_spark(o, t, "decisions/s", P_DECISIONS);
        render_spark(o, t, "TTFT p99 ms", P_TTFT99);
    }
    render_table(o, t);
    render_notes(o, t);
    out_finish(o);
}
