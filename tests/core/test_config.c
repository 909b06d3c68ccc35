/*
 * test_config.c: the router configuration: defaults match the reference, every way of setting a
 * value (flag, environment, file) reaches the same field, and bad values are refused with the
 * field named and nothing changed (S23).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter/config.h"
#include "kvrouter.h"

static void test_defaults_match_reference(void **s)
{
    (void)s;
    kvr_router_config_t c;
    kvr_config_defaults(&c);
    assert_int_equal(c.block_size, 16);
    assert_true(c.overlap_score_credit == 1.0);
    assert_true(c.prefill_load_scale == 1.0);
    assert_true(c.host_cache_hit_weight == 0.75);
    assert_true(c.disk_cache_hit_weight == 0.25);
    assert_true(c.router_temperature == 0.0);
    assert_true(c.use_kv_events);
    assert_true(c.router_track_active_blocks);
    assert_false(c.router_track_output_blocks);
    assert_true(c.router_assume_kv_reuse);
    assert_true(c.router_track_prefill_tokens);
    assert_true(c.router_ttl_secs == 120.0);
    assert_int_equal(c.router_max_tree_size, 1048576);
    assert_true(c.router_prune_target_ratio == 0.8);
    assert_false(c.router_queue_threshold.set);
    assert_int_equal(c.router_queue_policy, KVR_QUEUE_ORDER_FCFS);
    assert_int_equal(c.router_mode, KVR_MODE_KV);
    assert_int_equal(c.http_port, 8080);
    assert_string_equal(c.bind, "127.0.0.1");
    char err[256];
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
}

static void test_every_name_form_reaches_the_field(void **s)
{
    (void)s;
    kvr_router_config_t c;
    kvr_config_defaults(&c);
    char err[256];
    assert_int_equal(kvr_config_set(&c, "router_temperature", "0.5", err, sizeof err), KVR_OK);
    assert_true(c.router_temperature == 0.5);
    assert_int_equal(kvr_config_set(&c, "--router-temperature", "0.25", err, sizeof err), KVR_OK);
    assert_true(c.router_temperature == 0.25);
    assert_int_equal(kvr_config_set(&c, "KVR_ROUTER_TEMPERATURE", "2", err, sizeof err), KVR_OK);
    assert_true(c.router_temperature == 2.0);
    assert_int_equal(kvr_config_set(&c, "router-mode", "round-robin", err, sizeof err), KVR_OK);
    assert_int_equal(c.router_mode, KVR_MODE_ROUND_ROBIN);
    assert_int_equal(kvr_config_set(&c, "router_queue_threshold", "1.5", err, sizeof err), KVR_OK);
    assert_true(c.router_queue_threshold.set && c.router_queue_threshold.v == 1.5);
    assert_int_equal(kvr_config_set(&c, "router_queue_threshold", "unset", err, sizeof err), KVR_OK);
    assert_false(c.router_queue_threshold.set);
    assert_int_equal(kvr_config_set(&c, "use_kv_events", "off", err, sizeof err), KVR_OK);
    assert_false(c.use_kv_events);
    assert_int_equal(kvr_config_set(&c, "bind", "0.0.0.0", err, sizeof err), KVR_OK);
    assert_string_equal(c.bind, "0.0.0.0");
    assert_true(kvr_config_has("--block-size"));
    assert_false(kvr_config_has("--no-such-thing"));
}

/* A bad value is refused, names the field, and leaves the old value. */
static void refuse(const char *name, const char *value, const char *want_in_err)
{
    kvr_router_config_t c, before;
    kvr_config_defaults(&c);
    before = c;
    char err[256] = "";
    int rc = kvr_config_set(&c, name, value, err, sizeof err);
    if (rc == KVR_OK)
        fail_msg("%s = '%s' was accepted", name, value);
    if (strstr(err, want_in_err) == NULL)
        fail_msg("%s = '%s': error '%s' does not mention '%s'", name, value, err, want_in_err);
    assert_memory_equal(&c, &before, sizeof c);
}

static void test_bad_values_named_and_refused(void **s)
{
    (void)s;
    refuse("block_size", "0", "block_size");
    refuse("block_size", "-16", "block_size");
    refuse("block_size", "16x", "block_size");
    refuse("block_size", "4294967296", "block_size");
    refuse("router_temperature", "nan", "router_temperature: must be a finite number");
    refuse("router_temperature", "inf", "router_temperature");
    refuse("router_temperature", "-0.1", "router_temperature");
    refuse("overlap_score_credit", "NaN", "overlap_score_credit");
    refuse("host_cache_hit_weight", "1.5", "host_cache_hit_weight");
    refuse("router_prune_target_ratio", "0", "router_prune_target_ratio");
    refuse("router_ttl_secs", "0", "router_ttl_secs");
    refuse("router_mode", "fastest", "router_mode: must be one of kv, round-robin");
    refuse("use_kv_events", "maybe", "use_kv_events: must be true or false");
    refuse("http_port", "70000", "http_port");
    refuse("http_port", "-1", "http_port");
    refuse("active_decode_blocks_threshold", "2", "active_decode_blocks_threshold");
    refuse("router_queue_threshold", "-1", "router_queue_threshold");
    refuse("no_such_field", "1", "unknown setting 'no_such_field'");
    /* a typo gets the nearest name, spelt as it was typed; a name far from all gets none */
    refuse("--block-sise", "16", "unknown setting '--block-sise' (did you mean '--block-size'?)");
    refuse("blok_size", "16", "(did you mean 'block_size'?)");
    refuse("--router-max-reqests", "1", "(did you mean '--router-max-requests'?)");
    refuse("--zzzzzz", "1", "unknown setting '--zzzzzz'");
    {
        kvr_router_config_t c;
        kvr_config_defaults(&c);
        char err[256] = "";
        assert_int_equal(kvr_config_set(&c, "--zzzzzz", "1", err, sizeof err), KVR_ENOTFOUND);
        assert_null(strstr(err, "did you mean"));
    }
    char longbind[100];
    memset(longbind, 'a', sizeof longbind - 1);
    longbind[sizeof longbind - 1] = '\0';
    refuse("bind", longbind, "bind: longer than");
}

static void test_cross_field_rules(void **s)
{
    (void)s;
    kvr_router_config_t c;
    kvr_config_defaults(&c);
    char err[256];
    assert_int_equal(kvr_config_set(&c, "router_track_active_blocks", "false", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&c, "router_track_output_blocks", "true", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "router_track_output_blocks"));
    /* an approximate-mode setting never blocks a smaller index budget in another mode, and
     * its default follows the budget in approximate mode; a larger value given is refused */
    kvr_config_defaults(&c);
    assert_int_equal(kvr_config_set(&c, "index_max_pairs", "2048", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&c, "router_mode", "approx", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&c, "router_max_tree_size", "4096", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "router_max_tree_size: 4096 exceeds index_max_pairs 2048"));
    assert_int_equal(kvr_config_set(&c, "router_mode", "kv", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
    /* the dynamo cost's weights under another policy: refused, naming both (a value that
     * changes nothing is accepted) */
    static const char *const foreign[][2] = {{"prefill_load_scale", "2"},
                                            {"decode_active_request_weight", "0.5"},
                                            {"overlap_score_weight", "2.5"}};
    for (size_t i = 0; i < 3; i++) {
        kvr_config_defaults(&c); /* locality */
        assert_int_equal(kvr_config_set(&c, foreign[i][0], foreign[i][1], err, sizeof err),
                         KVR_OK);
        kvr_config_resolve(&c, NULL, 0);
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_EINVAL);
        assert_non_null(strstr(err, foreign[i][0]));
        assert_non_null(strstr(err, "router_selection_policy locality"));
        assert_int_equal(kvr_config_set(&c, "router_selection_policy", "dynamo", err, sizeof err),
                         KVR_OK);
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
        assert_int_equal(kvr_config_set(&c, "router_mode", "round-robin", err, sizeof err),
                         KVR_OK); /* no cost at all there: nothing to refuse */
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
    }
    kvr_config_defaults(&c);
    assert_int_equal(kvr_config_set(&c, "overlap_score_weight", "1", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_config_set(&c, "prefill_load_scale", "1", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, NULL, 0);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK); /* the reference's default */
    kvr_config_defaults(&c);
    assert_int_equal(kvr_config_set(&c, "overlap_score_weight", "0", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, NULL, 0);
    assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK); /* no cache awareness */
    /* NATS: sync and discovery need a url; the namespace goes into subjects */
    static const char *const needs_url[][2] = {{"router_replica_sync", "true"},
                                               {"discovery", "nats"}};
    for (size_t i = 0; i < 2; i++) {
        kvr_config_defaults(&c);
        assert_int_equal(kvr_config_set(&c, needs_url[i][0], needs_url[i][1], err, sizeof err),
                         KVR_OK);
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_EINVAL);
        assert_non_null(strstr(err, needs_url[i][0]));
        assert_non_null(strstr(err, "nats_url"));
        assert_int_equal(kvr_config_set(&c, "nats_url", "nats://127.0.0.1:4222", err, sizeof err),
                         KVR_OK);
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_OK);
    }
    static const char *const bad_ns[] = {"a.b", "a*", "a b", "", ">"};
    for (size_t i = 0; i < sizeof bad_ns / sizeof bad_ns[0]; i++) {
        kvr_config_defaults(&c);
        assert_int_equal(kvr_config_set(&c, "namespace", bad_ns[i], err, sizeof err), KVR_OK);
        assert_int_equal(kvr_config_validate(&c, err, sizeof err), KVR_EINVAL);
        assert_non_null(strstr(err, "namespace"));
    }
    assert_int_equal(kvr_config_set(&c, "discovery", "zookeeper", err, sizeof err), KVR_EINVAL);
    assert_int_equal(kvr_config_set(&c, "nats_presence_ttl_ms", "10", err, sizeof err), KVR_EINVAL);
}

/* The reference's derived settings: the deprecated weight, use_kv_events false, credit 0. */
static void test_derived_settings(void **s)
{
    (void)s;
    kvr_router_config_t c;
    char err[256], note[512];
    kvr_config_defaults(&c);
    kvr_config_resolve(&c, note, sizeof note);
    assert_string_equal(note, "");
    assert_true(kvr_config_uses_index(&c));
    assert_int_equal(kvr_config_set(&c, "overlap_score_weight", "2.5", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, note, sizeof note);
    assert_true(c.prefill_load_scale == 2.5 && c.overlap_score_credit == 1.0);
    assert_non_null(strstr(note, "overlap_score_weight 2.5 (deprecated)"));
    assert_int_equal(kvr_config_set(&c, "overlap_score_weight", "0", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, note, sizeof note);
    assert_true(c.prefill_load_scale == 0 && c.overlap_score_credit == 0);
    assert_false(kvr_config_uses_index(&c));
    assert_non_null(strstr(note, "no prefix index"));
    kvr_config_defaults(&c);
    assert_int_equal(kvr_config_set(&c, "use_kv_events", "false", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, note, sizeof note);
    assert_int_equal(c.router_mode, KVR_MODE_APPROX);
    assert_true(kvr_config_uses_index(&c));
    kvr_config_resolve(&c, note, sizeof note); /* idempotent */
    assert_int_equal(c.router_mode, KVR_MODE_APPROX);
    assert_int_equal(kvr_config_set(&c, "router_mode", "round-robin", err, sizeof err), KVR_OK);
    kvr_config_resolve(&c, NULL, 0);
    assert_int_equal(c.router_mode, KVR_MODE_ROUND_ROBIN);
    assert_false(kvr_config_uses_index(&c));
}

static void test_environment(void **s)
{
    (void)s;
    kvr_router_config_t c;
    kvr_config_defaults(&c);
    char err[256];
    char *good[] = {"PATH=/usr/bin", "KVR_BLOCK_SIZE=64", "KVR_ROUTER_QUEUE_POLICY=wspt",
                    "KVR_TEST_SCALE=asan", NULL};
    assert_int_equal(kvr_config_from_env(&c, good, err, sizeof err), KVR_OK);
    assert_int_equal(c.block_size, 64);
    assert_int_equal(c.router_queue_policy, KVR_QUEUE_ORDER_WSPT);
    char *typo[] = {"KVR_BLOCK_SIZ=64", NULL};
    assert_int_equal(kvr_config_from_env(&c, typo, err, sizeof err), KVR_ENOTFOUND);
    assert_non_null(strstr(err, "KVR_BLOCK_SIZ"));
    char *bad[] = {"KVR_ROUTER_TEMPERATURE=nan", NULL};
    assert_int_equal(kvr_config_from_env(&c, bad, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "router_temperature"));
}

static void test_config_file(void **s)
{
    (void)s;
    kvr_router_config_t c;
    kvr_config_defaults(&c);
    char err[256];
    const char *text = "# kvrouter.conf\n\nblock_size = 32\n  router-temperature=0.7  # hot\n"
                       "bind = \"0.0.0.0\"\r\nrouter_queue_threshold = 2\n";
    assert_int_equal(kvr_config_from_text(&c, text, strlen(text), err, sizeof err), KVR_OK);
    assert_int_equal(c.block_size, 32);
    assert_true(c.router_temperature == 0.7);
    assert_string_equal(c.bind, "0.0.0.0");
    assert_true(c.router_queue_threshold.set);
    const char *bad = "block_size = 32\nrouter_temperature = -1\n";
    assert_int_equal(kvr_config_from_text(&c, bad, strlen(bad), err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "line 2: router_temperature"));
    const char *noeq = "block_size 32\n";
    assert_int_equal(kvr_config_from_text(&c, noeq, strlen(noeq), err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "line 1: expected 'name = value'"));
}

static void test_help_lists_every_field(void **s)
{
    (void)s;
    size_t need = kvr_config_help(NULL, 0, true);
    char *buf = malloc(need + 1);
    assert_non_null(buf);
    assert_int_equal(kvr_config_help(buf, need + 1, true), need);
    assert_non_null(strstr(buf, "--router-temperature X"));
    assert_non_null(strstr(buf, "--block-size N"));
    assert_non_null(strstr(buf, "[0.75]"));
    assert_null(strstr(buf, "[]"));      /* an empty default is not shown */
    assert_null(strstr(buf, "[unset]"));
    /* every setting listed once, every line within 80 columns, no setting spelt snake_case */
    const char *names[256];
    size_t n_fields = kvr_config_count();
    assert_true(n_fields > 50 && n_fields < 256);
    for (size_t i = 0; i < n_fields; i++)
        names[i] = kvr_config_name(i);
    assert_null(kvr_config_name(n_fields));
    for (size_t i = 0; i < n_fields; i++) {
        char flag[100];
        int fl = snprintf(flag, sizeof flag, "\n  --%s ", names[i]);
        for (int k = 0; k < fl; k++)
            flag[k] = flag[k] == '_' ? '-' : flag[k];
        const char *at = strstr(buf, flag);
        if (at == NULL || strstr(at + 1, flag) != NULL)
            fail_msg("%s: listed %s", names[i], at == NULL ? "never" : "twice");
        char snake[100];
        snprintf(snake, sizeof snake, " %s ", names[i]);
        if (strchr(names[i], '_') != NULL && strstr(buf, snake) != NULL)
            fail_msg("%s spelt as a setting name, not as its flag", names[i]);
    }
    for (const char *l = buf; *l != '\0';) {
        size_t len = strcspn(l, "\n");
        if (len > 80)
            fail_msg("a line of %zu columns: %.*s", len, (int)len, l);
        l += len + (l[len] == '\n');
    }
    char spelt[200];
    assert_int_equal(kvr_config_spell_flags("router_replica_sync: needs nats_url (or `peers`)",
                                            spelt, sizeof spelt),
                     strlen("--router-replica-sync: needs --nats-url (or `peers`)"));
    assert_string_equal(spelt, "--router-replica-sync: needs --nats-url (or `peers`)");
    kvr_config_spell_flags("a plain_word, (block_size) and max_num_batched_tokens=", spelt,
                           sizeof spelt);
    assert_string_equal(spelt, "a plain_word, (--block-size) and max_num_batched_tokens=");
    size_t common = kvr_config_help(NULL, 0, false);
    assert_true(common < need); /* --help shows the common groups and names the others */
    free(buf);
}

/* The reference's spellings (kvrouter/config.h, kvr_config_ref_*): the table is consistent,
 * its names and the generic router-/no-router-/DYN_ROUTER_ rules resolve to our settings, a
 * name neither ours nor the reference's is none, and DYN_* variables are applied, noted, or
 * refused naming why. */
static void collect(void *arg, const char *line)
{
    char *out = arg;
    size_t n = strlen(out);
    snprintf(out + n, 2048 - n, "%s\n", line);
}

static void test_reference_names(void **state)
{
    (void)state;
    char msg[200] = "", buf[96];
    assert_int_equal(kvr_config_ref_verify(msg, sizeof msg), KVR_OK);
    kvr_config_ref_t r = kvr_config_ref_flag("--router-kv-overlap-score-credit", buf, sizeof buf);
    assert_int_equal(r.kind, KVR_REF_SETTING);
    assert_string_equal(r.setting, "overlap_score_credit");
    assert_null(r.value);
    r = kvr_config_ref_flag("--no-router-kv-events", buf, sizeof buf);
    assert_int_equal(r.kind, KVR_REF_SETTING);
    assert_string_equal(r.setting, "use_kv_events");
    assert_string_equal(r.value, "false");
    r = kvr_config_ref_flag("--router-prefill-load-scale", buf, sizeof buf); /* generic rule */
    assert_int_equal(r.kind, KVR_REF_SETTING);
    assert_string_equal(r.setting, "prefill_load_scale");
    r = kvr_config_ref_flag("--no-router-track-active-blocks", buf, sizeof buf);
    assert_int_equal(r.kind, KVR_REF_SETTING);
    assert_string_equal(r.setting, "router_track_active_blocks");
    assert_string_equal(r.value, "false");
    assert_int_equal(kvr_config_ref_flag("--no-router-temperature", buf, sizeof buf).kind,
                     KVR_REF_NONE); /* not a boolean */
    assert_int_equal(kvr_config_ref_flag("--router-temperature", buf, sizeof buf).kind,
                     KVR_REF_NONE); /* ours already */
    assert_int_equal(kvr_config_ref_flag("--router-no-such-thing", buf, sizeof buf).kind,
                     KVR_REF_NONE);
    r = kvr_config_ref_flag("--router-durable-kv-events", buf, sizeof buf);
    assert_int_equal(r.kind, KVR_REF_REFUSED);
    assert_non_null(strstr(r.why, "JetStream"));
    assert_int_equal(kvr_config_ref_flag("--router-event-threads", buf, sizeof buf).kind,
                     KVR_REF_IGNORED);
    r = kvr_config_ref_env("DYN_ROUTER_QUEUE_POLICY", buf, sizeof buf);
    assert_int_equal(r.kind, KVR_REF_SETTING);
    assert_string_equal(r.setting, "router_queue_policy");
    assert_int_equal(kvr_config_ref_env("DYN_SOMETHING", buf, sizeof buf).kind, KVR_REF_NONE);

    kvr_router_config_t c;
    kvr_config_defaults(&c);
    char notes[2048] = "", err[300] = "";
    char *env[] = {"DYN_KV_CACHE_BLOCK_SIZE=64", "DYN_ROUTER_USE_KV_EVENTS=false",
                   "DYN_ROUTER_SELECTION_POLICY=default", "DYN_WHATEVER=1", "PATH=/bin", NULL};
    assert_int_equal(kvr_config_from_ref_env(&c, env, collect, notes, err, sizeof err), KVR_OK);
    assert_int_equal(c.block_size, 64);
    assert_false(c.use_kv_events);
    assert_non_null(strstr(notes, "reference name DYN_KV_CACHE_BLOCK_SIZE read as block_size"));
    assert_non_null(strstr(notes, "reads as locality"));
    assert_non_null(strstr(notes, "!environment DYN_WHATEVER: not read"));
    assert_null(strstr(notes, "PATH"));
    char *bad[] = {"DYN_KV_CACHE_BLOCK_SIZE=0", NULL};
    assert_int_equal(kvr_config_from_ref_env(&c, bad, NULL, NULL, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "DYN_KV_CACHE_BLOCK_SIZE (read as block_size)"));
    char *refused[] = {"DYN_ROUTER_RESET_STATES=true", NULL};
    assert_int_equal(kvr_config_from_ref_env(&c, refused, NULL, NULL, err, sizeof err),
                     KVR_EINVAL);
    assert_non_null(strstr(err, "DYN_ROUTER_RESET_STATES"));
    assert_int_equal(c.block_size, 64); /* unchanged by the refusals */
    assert_string_equal(kvr_config_policy_name(&c), "locality");
    assert_string_equal(kvr_config_mode_name(&c), "kv");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_match_reference),
        cmocka_unit_test(test_every_name_form_reaches_the_field),
        cmocka_unit_test(test_bad_values_named_and_refused),
        cmocka_unit_test(test_cross_field_rules),
        cmocka_unit_test(test_derived_settings),
        cmocka_unit_test(test_environment),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_help_lists_every_field),
        cmocka_unit_test(test_reference_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
