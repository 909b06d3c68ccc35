/*
 * cmd_register.c: `kvrouter register --nats-url URL --worker SPEC`, the discovery sidecar of an
 * engine that knows nothing of NATS (a vLLM or SGLang server): it keeps the worker's entry in
 * <namespace>_workers (refreshed every third of --nats-presence-ttl-ms) until SIGTERM or
 * SIGINT, then deletes it, so every router with --discovery nats adds the worker at once and
 * removes it when it stops. Killed without cleanup, its entry stops being refreshed and the
 * routers remove the worker after the TTL.
 * Prints "registered worker ID in BUCKET" on stdout once the entry is asked for.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>

#include "apps/apps.h"
#include "apps/cli.h"
#include "kvrouter/router.h"
#include "cluster/cluster.h"
#include "base/log.h"
#include "nats/nats_link.h"

typedef struct register_args {
    kvr_cli_nats_t nats;
    kvr_worker_spec_t worker;
    bool have_worker;
} register_args_t;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvrouter register --nats-url URL --worker SPEC [options]\n\n"
            "Keeps an engine's entry in the NATS bucket <namespace>_workers until stopped, so\n"
            "routers started with --discovery nats route to it (and stop when it goes).\n\n"
            "  --worker SPEC                 id=7,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:"
            "5557,\n"
            "                                replay=tcp://10.0.0.5:5558,dp_size=1,model=NAME,"
            "block_size=16\n"
            "                                (as `serve --worker`; id required)\n"
            "  --nats-url URL                the NATS server (required)\n"
            "  --namespace NS                the fleet's namespace [kvrouter]\n"
            "  --nats-presence-ttl-ms MS     routers drop an entry not refreshed this long [3000]\n"
            KVR_CLI_NATS_AUTH_USAGE
            "  --log-level L                 debug | info | warn | error [info]\n");
}

static int parse_option(kvr_cli_t *c, void *arg)
{
    register_args_t *a = arg;
    int rc = kvr_cli_nats_option(c, &a->nats);
    if (rc != -1)
        return rc;
    if (kvr_cli_is(c, "--worker")) {
        const char *v = kvr_cli_value(c);
        char err[300];
        if (v == NULL || kvr_worker_spec_parse(v, &a->worker, err, sizeof err) != KVR_OK)
            return kvr_cli_bad(c, v, v == NULL ? "a value is required" : err);
        a->have_worker = true;
        return 0;
    }
    if (kvr_cli_is(c, "--log-level")) {
        int level;
        rc = kvr_cli_log_level(c, kvr_cli_value(c), &level);
        if (rc == 0)
            kvr_log_set_level((kvr_log_level_t)level);
        return rc;
    }
    return -1;
}

int kvr_cmd_register(int argc, char **argv)
{
    register_args_t a;
    memset(&a, 0, sizeof a);
    kvr_cli_nats_defaults(&a.nats);
    kvr_cli_t c;
    kvr_cli_init(&c, "kvrouter register", argc, argv);
    int rc = kvr_cli_parse(&c, parse_option, &a, usage);
    if (rc != 0)
        return rc == 1 ? 0 : rc;
    if (a.nats.url[0] == '\0')
        return kvr_cli_fail(&c, "--nats-url is required");
    if (!a.have_worker)
        return kvr_cli_fail(&c, "--worker is required");
    char err[300] = "";
    if (kvr_worker_spec_validate(&a.worker, err, sizeof err) != KVR_OK)
        return kvr_cli_fail(&c, "--worker: %s", err);
    /* blocked before nats.c starts its threads (they inherit the mask): the signals are
     * taken by sigwait below, on this thread */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    int st, sig = 0;
    kvr_nats_config_t nc = {.url = a.nats.url, .name = "kvrouter register",
                            .auth = kvr_cli_nats_auth(&a.nats)};
    kvr_nats_t *n = kvr_nats_new(&nc, &st, err, sizeof err);
    if (n == NULL) {
        fprintf(stderr, "kvrouter register: %s\n", err[0] ? err : kvr_strerror(st));
        return 1;
    }
    st = kvr_discovery_register(n, a.nats.ns, a.nats.ttl_ms, &a.worker);
    if (st != KVR_OK) {
        fprintf(stderr, "kvrouter register: %s\n", kvr_strerror(st));
        kvr_nats_free(n);
        return 1;
    }
    printf("registered worker %llu in %s_workers\n", (unsigned long long)a.worker.worker_id,
           a.nats.ns);
    fflush(stdout);
    kvr_log(KVR_LOG_INFO, "register: worker %llu kept in %s_workers every %llu ms until stopped",
            (unsigned long long)a.worker.worker_id, a.nats.ns,
            (unsigned long long)(a.nats.ttl_ms / 3));
    sigwait(&stop, &sig);
    kvr_log(KVR_LOG_INFO, "register: stopping; deleting the entry of worker %llu",
            (unsigned long long)a.worker.worker_id);
    kvr_nats_free(n); /* deletes the entry (up to 2 s), then closes */
    return 0;
}
