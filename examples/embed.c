/*
 * embed.c: kvrouter's routing core inside another program, as a gateway would embed it, with
 * nothing but the public headers (<kvrouter/router.h>, which includes <kvrouter.h>) and
 * libkvrouter. It builds a router over three workers, tells the prefix index that worker 2
 * holds the first four blocks of a prompt (what a KV event from its engine would say), routes
 * that prompt, and reports the request's first token and end. Exits 0 when the router picked
 * worker 2 with the four blocks cached.
 *
 * Build against an installed library:
 *   cc embed.c $(pkg-config --cflags --libs --static kvrouter) -o embed
 * Threads: one. In a server, the thread that owns the router calls every kvr_router_* function;
 * a thread of its own may write the index while lookups run (KVR_SYNC_RCU, see <kvrouter.h>).
 */
#include <stdio.h>
#include <string.h>

#include <kvrouter/router.h>

#define BLOCK 16
#define N_TOKENS (4 * BLOCK + 5)

static int fail(const char *what, int st, const char *err)
{
    fprintf(stderr, "embed: %s: %s %s\n", what, kvr_strerror(st), err ? err : "");
    return 1;
}

int main(void)
{
    char err[256] = "";
    int st;
    kvr_router_config_t cfg;
    kvr_config_defaults(&cfg); /* every default, as `kvrouter serve --help` lists them */
    if ((st = kvr_config_set(&cfg, "block_size", "16", err, sizeof err)) != KVR_OK)
        return fail("config", st, err);

    kvr_index_config_t ic = {.max_pairs = 1 << 20, .max_workers = 64, .sync = KVR_SYNC_NONE};
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    if (ix == NULL)
        return fail("index", st, NULL);
    kvr_router_t *r = kvr_router_new(&cfg, ix, &st, err, sizeof err);
    if (r == NULL)
        return fail("router", st, err);
    for (uint64_t id = 1; id <= 3; id++) {
        kvr_worker_spec_t w = {.worker_id = id, .dp_size = 1};
        if ((st = kvr_router_add_worker(r, &w, err, sizeof err)) != KVR_OK)
            return fail("add worker", st, err);
    }

    uint32_t prompt[N_TOKENS];
    for (size_t i = 0; i < N_TOKENS; i++)
        prompt[i] = (uint32_t)(1000 + 7 * i);

    /* Worker 2's engine stored the prompt's four complete blocks: the index learns it. */
    uint64_t lbh[4];
    if (kvr_hash_blocks(prompt, N_TOKENS, BLOCK, NULL, lbh, 4) != 4)
        return fail("hash", KVR_EINVAL, NULL);
    kvr_block_t blocks[4];
    for (size_t i = 0; i < 4; i++)
        blocks[i] = (kvr_block_t){.ext = 0xE000 + i, .lbh = lbh[i]}; /* ext: the engine's id */
    kvr_event_t ev = {.kind = KVR_EV_STORED, .worker = {.worker_id = 2, .dp_rank = 0},
                      .tier = KVR_TIER_DEVICE, .blocks = blocks, .n_blocks = 4};
    if ((st = kvr_index_apply(ix, &ev)) != KVR_OK)
        return fail("apply", st, NULL);

    /* Route the prompt and book it on the chosen worker. */
    uint64_t now_ms = 1000;
    kvr_route_req_t q = {.tokens = prompt, .n_tokens = N_TOKENS, .update_state = true};
    kvr_route_res_t res;
    if ((st = kvr_router_route(r, &q, now_ms, &res)) != KVR_OK)
        return fail("route", st, res.error_field);
    printf("request %s -> worker %llu rank %u, %u of 4 blocks cached (%llu tokens)\n",
           res.request_id, (unsigned long long)res.worker.worker_id, res.worker.dp_rank,
           res.device_blocks, (unsigned long long)res.cached_tokens);

    /* The worker streams: its first token ends the prefill load, the end frees the booking. */
    size_t idl = strlen(res.request_id);
    if ((st = kvr_router_first_token(r, res.request_id, idl, now_ms + 40)) != KVR_OK ||
        (st = kvr_router_free_request(r, res.request_id, idl, now_ms + 900)) != KVR_OK)
        return fail("lifecycle", st, NULL);

    int ok = res.worker.worker_id == 2 && res.device_blocks == 4;
    kvr_router_free(r);
    kvr_index_free(ix);
    if (!ok)
        fprintf(stderr, "embed: expected worker 2 with 4 cached blocks\n");
    return ok ? 0 : 1;
}
