/*
 * cmd_top.c: `kvrouter top --url URL [--key-file F] [--interval-ms N] [--once]`, the operator's
 * live view of one router in a terminal (a jump host's ssh session; no browser, no curses):
 * the command line, the terminal and the loops; a refresh is top_model.c's, a frame
 * top_render.c's (top.h).
 *
 * Live mode: the alternate screen, the cursor hidden, stdin non-canonical without echo; the
 * loop waits in poll() on stdin with the time left to the next refresh: `q` or Ctrl-C (SIGINT)
 * quits, SIGTERM and SIGHUP too, SIGWINCH redraws at the new size (TIOCGWINSZ), SIGTSTP
 * (Ctrl-Z) gives the terminal back before stopping and takes it again on resume. Every way
 * out goes through term_leave(), which restores what term_enter() changed. --once: one frame
 * in plain text (no escapes; fitted to the terminal only when stdout is one), exit 1 with the
 * failure on stderr when the router cannot be read.
 *
 * Invariants: a frame is drawn for the terminal's size minus its last column (no pending
 * wrap, no scroll). Ownership: everything is owned by the top_t of kvr_cmd_top's frame and
 * freed before it returns. Threads: the caller's only; signal handlers only set flags.
 * Cost: a refresh and a frame per interval, one write() a frame.
 */
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "base/clock.h"
#include "base/secret.h"
#include "http/http.h"
#include "apps/top.h"
#include "kvrouter.h"

static const char *const PROG = "kvrouter top";

/* ---- the command line --------------------------------------------------------------------- */


static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter top --url URL [--key-file F] [--interval-ms N] [--once]\n\n"
            "A router's live view in the terminal: its figures of the last second, sparklines\n"
            "of the last minute and one row per worker rank (state, load, KV blocks, hit\n"
            "ratios). Keys: q or Ctrl-C quits.\n\n"
            "  --url URL          the router (its client or admin listener), http://host:port\n"
            "  --key-file F       a file holding the router's API key, sent as\n"
            "                     Authorization: Bearer (keep it chmod 600)\n"
            "  --interval-ms N    time between refreshes, 100..3600000 [1000]\n"
            "  --once             print one frame as plain text and exit (1 when the router\n"
            "                     cannot be read)\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    top_args_t *a = arg;
    if (kvr_cli_is(c, "--url"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->url);
    if (kvr_cli_is(c, "--key-file"))
        return kvr_cli_str(c, kvr_cli_value(c), &a->key_file);
    if (kvr_cli_is(c, "--interval-ms"))
        return kvr_cli_u32(c, kvr_cli_value(c), 100, 3600000, &a->interval_ms);
    if (kvr_cli_is(c, "--once")) {
        if (c->eq != NULL)
            return kvr_cli_bad(c, c->eq, "takes no value");
        a->once = true;
        return 0;
    }
    return -1;
}

/* All of buf on fd (a terminal may take it in pieces). */
static bool write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t k = write(fd, buf, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        buf += k;
        n -= (size_t)k;
    }
    return true;
}

/* ---- the terminal ---------------------------------------------------------------------------- */

static volatile sig_atomic_t g_stop, g_resized, g_suspend;

static void on_signal(int sig)
{
    if (sig == SIGWINCH)
        g_resized = 1;
    else if (sig == SIGTSTP)
        g_suspend = 1;
    else
        g_stop = 1;
}

typedef struct top_term {
    bool entered; /* the alternate screen is up */
    bool raw;     /* stdin's modes are changed (saved holds them) */
    struct termios saved;
    int rows, cols;
} top_term_t;

static void term_size(top_term_t *tt)
{
    struct winsize ws;
    tt->rows = 24;
    tt->cols = 80;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
        tt->rows = ws.ws_row;
        tt->cols = ws.ws_col;
    }
}

/* The alternate screen, no cursor, stdin without line editing or echo (signals kept: Ctrl-C
 * is SIGINT). */
static void term_enter(top_term_t *tt)
{
    if (isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &tt->saved) == 0) {
        struct termios raw = tt->saved;
        raw.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
        raw.c_cc[VMIN] = 0;
        raw.c_cc[VTIME] = 0;
        tt->raw = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    }
    static const char enter[] = "\033[?1049h\033[?25l\033[2J";
    write_all(STDOUT_FILENO, enter, sizeof enter - 1);
    tt->entered = true;
    term_size(tt);
}

/* Everything term_enter changed, back as it was; safe to call twice. */
static void term_leave(top_term_t *tt)
{
    static const char leave[] = "\033[0m\033[?25h\033[?1049l";
    if (tt->entered)
        write_all(STDOUT_FILENO, leave, sizeof leave - 1);
    if (tt->raw)
        tcsetattr(STDIN_FILENO, TCSANOW, &tt->saved);
    tt->entered = tt->raw = false;
}

static void signals_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll() returns at once */
    sigemptyset(&sa.sa_mask);
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH, SIGTSTP};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
        sigaction(sigs[i], &sa, NULL);
}

/* Ctrl-Z: the terminal given back, stopped until SIGCONT, then taken again. */
static void suspend(top_term_t *tt)
{
    term_leave(tt);
    signal(SIGTSTP, SIG_DFL);
    raise(SIGTSTP);
    signals_install();
    term_enter(tt);
}

/* ---- the loops ------------------------------------------------------------------------------- */

static void draw(const top_t *t, const top_term_t *tt)
{
    top_out_t o = {.ansi = true, .width = tt->cols - 1, .rows = tt->rows};
    top_render(&o, t);
    if (!o.nomem)
        write_all(STDOUT_FILENO, o.buf, o.len);
    free(o.buf);
}

/* Reads the keys waiting on stdin: true when one of them quits (q, Q, or Ctrl-C if it came
 * as a byte). *eof set when stdin has ended: hung up (hup, poll's POLLHUP) with nothing to
 * read, or failing. With VMIN 0 a read of nothing is not an end by itself (the input may
 * have been flushed since poll, as Ctrl-C does). */
static bool keys_quit(bool hup, bool *eof)
{
    char keys[64];
    ssize_t n = read(STDIN_FILENO, keys, sizeof keys);
    if ((n == 0 && hup) || (n < 0 && errno != EINTR && errno != EAGAIN))
        *eof = true;
    for (ssize_t i = 0; i < n; i++)
        if (keys[i] == 'q' || keys[i] == 'Q' || keys[i] == 3)
            return true;
    return false;
}

static int run_live(top_t *t)
{
    if (!isatty(STDOUT_FILENO)) {
        fprintf(stderr, "%s: standard output is not a terminal (--once prints plain text)\n", PROG);
        return 2;
    }
    top_term_t tt;
    memset(&tt, 0, sizeof tt);
    signals_install();
    term_enter(&tt);
    draw(t, &tt); /* the header at once, before the first answer */
    bool stdin_open = tt.raw;
    uint64_t next = 0;
    while (!g_stop) {
        uint64_t now = kvr_now_ms();
        if (now >= next) {
            top_refresh(t);
            next = kvr_now_ms() + t->args.interval_ms;
            draw(t, &tt);
            continue;
        }
        struct pollfd p = {stdin_open ? STDIN_FILENO : -1, POLLIN, 0};
        int rc = poll(&p, 1, (int)(next - now));
        if (rc > 0 && (p.revents & (POLLIN | POLLHUP))) {
            bool eof = false;
            if (keys_quit((p.revents & POLLHUP) != 0, &eof))
                break;
            stdin_open = !eof;
        } else if (rc > 0) {
            stdin_open = false; /* POLLERR, POLLNVAL: no keys from it, and no busy loop */
        }
        if (g_suspend) {
            g_suspend = 0;
            suspend(&tt);
            g_resized = 1;
        }
        if (g_resized) {
            g_resized = 0;
            term_size(&tt);
            write_all(STDOUT_FILENO, "\033[2J", 4);
            draw(t, &tt);
        }
    }
    term_leave(&tt);
    return 0;
}

static int run_once(top_t *t)
{
    if (!top_refresh(t)) {
        char text[700];
        top_problem_text(t, text, sizeof text);
        fprintf(stderr, "%s: %s\n", PROG, text);
        return 1;
    }
    top_term_t tt;
    term_size(&tt);
    top_out_t o = {.ansi = false, .width = isatty(STDOUT_FILENO) ? tt.cols - 1 : 0};
    top_render(&o, t);
    bool ok = !o.nomem && write_all(STDOUT_FILENO, o.buf, o.len);
    free(o.buf);
    if (!ok)
        fprintf(stderr, "%s: cannot write the frame: %s\n", PROG,
                o.nomem ? "out of memory" : strerror(errno));
    return ok ? 0 : 1;
}

/* The link from the arguments: the URL parsed, the key read. 0, or 2 with the message. */
static int link_setup(top_link_t *l, const top_args_t *a, const kvr_cli_t *c)
{
    char why[300];
    if (kvr_http_target_parse(a->url, &l->target, why, sizeof why) != KVR_OK)
        return kvr_cli_fail(c, "--url %s: %s", a->url, why);
    l->timeout_ms = a->interval_ms < 1000   ? 1000
                    : a->interval_ms > 5000 ? 5000
                                            : (int)a->interval_ms;
    if (a->key_file == NULL)
        return 0;
    char key[KVR_SECRET_MAX];
    if (kvr_secret_read("--key-file", a->key_file, key, why, sizeof why) != KVR_OK)
        return kvr_cli_fail(c, "%s", why);
    snprintf(l->target.bearer, sizeof l->target.bearer, "%s", key);
    memset(key, 0, sizeof key);
    return 0;
}

int kvr_cmd_top(int argc, char **argv)
{
    top_t t;
    memset(&t, 0, sizeof t);
    t.args.interval_ms = 1000;
    kvr_cli_t c;
    kvr_cli_init(&c, PROG, argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &t.args, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (t.args.url == NULL)
        return kvr_cli_fail(&c, "--url is required (see --help)");
    rc = link_setup(&t.link, &t.args, &c);
    if (rc == 0)
        rc = t.args.once ? run_once(&t) : run_live(&t);
    memset(t.link.target.bearer, 0, sizeof t.link.target.bearer);
    top_model_free(&t);
    return rc;
}
