/*
 * test_endpoint.c: what a worker registration may name (core/endpoint.c): engine addresses
 * accepted (host names, IPv4, [IPv6], ports at the edges), the addresses a hostile or careless
 * registration would use to make the router bind a port or touch a file refused with the
 * field and the reason named, the ipc:// and host allow lists, and the router refusing such a
 * registration whole (nothing registered).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "core/endpoint.h"
#include "kvrouter/router.h"
#include "kvrouter.h"

static const kvr_endpoint_policy_t OPEN = {0};

static void expect_zmq(const char *addr, const kvr_endpoint_policy_t *p, int want,
                       const char *msg_part)
{
    char err[256] = "";
    int rc = kvr_endpoint_check_zmq("events", addr, p, err, sizeof err);
    if (rc != want || (msg_part != NULL && strstr(err, msg_part) == NULL))
        fail_msg("%s: rc %d (want %d), err '%s' (want '%s')", addr, rc, want, err,
                 msg_part ? msg_part : "");
    if (rc != KVR_OK && strncmp(err, "events: ", 8) != 0)
        fail_msg("%s: error does not name the field: '%s'", addr, err);
}

static void expect_url(const char *url, const kvr_endpoint_policy_t *p, int want,
                       const char *msg_part)
{
    char err[256] = "";
    int rc = kvr_endpoint_check_url(url, p, err, sizeof err);
    if (rc != want || (msg_part != NULL && strstr(err, msg_part) == NULL))
        fail_msg("%s: rc %d (want %d), err '%s' (want '%s')", url, rc, want, err,
                 msg_part ? msg_part : "");
}

static void test_engine_addresses_accepted(void **state)
{
    (void)state;
    expect_zmq("tcp://127.0.0.1:5557", &OPEN, KVR_OK, NULL);
    expect_zmq("tcp://engine-0.pool.svc.cluster.local:1", &OPEN, KVR_OK, NULL);
    expect_zmq("tcp://[::1]:65535", &OPEN, KVR_OK, NULL);
    expect_zmq("tcp://[fe80::1:2]:5557", &OPEN, KVR_OK, NULL);
}

static void test_binding_and_file_addresses_refused(void **state)
{
    (void)state;
    expect_zmq("tcp://*:5557", &OPEN, KVR_EINVAL, "wildcard");
    expect_zmq("tcp://10.0.0.1*:5557", &OPEN, KVR_EINVAL, "wildcard");
    /* bind-only hosts: the unspecified address in its spellings, an interface's name */
    expect_zmq("tcp://0.0.0.0:5557", &OPEN, KVR_EINVAL, "unspecified address");
    expect_zmq("tcp://[::]:5557", &OPEN, KVR_EINVAL, "unspecified address");
    expect_zmq("tcp://[0:0::0]:5557", &OPEN, KVR_EINVAL, "unspecified address");
    expect_zmq("tcp://lo:5557", &OPEN, KVR_EINVAL, "network interface");
    expect_url("http://0.0.0.0:8000", &OPEN, KVR_EINVAL, "unspecified address");
    expect_url("http://lo:8000", &OPEN, KVR_EINVAL, "network interface");
    expect_zmq("ipc:///tmp/kv", &OPEN, KVR_EINVAL, "allowed_ipc_dirs");
    expect_zmq("inproc://kv", &OPEN, KVR_EINVAL, "only tcp://");
    expect_zmq("pgm://eth0;239.192.1.1:5555", &OPEN, KVR_EINVAL, "only tcp://");
    expect_zmq("tcp://127.0.0.1:5557;10.0.0.1:1", &OPEN, KVR_EINVAL, "source address");
    expect_zmq("tcp://127.0.0.1", &OPEN, KVR_EINVAL, "port is required");
    expect_zmq("tcp://127.0.0.1:0", &OPEN, KVR_EINVAL, "not in [1, 65535]");
    expect_zmq("tcp://127.0.0.1:65536", &OPEN, KVR_EINVAL, "not in [1, 65535]");
    expect_zmq("tcp://127.0.0.1:55x7", &OPEN, KVR_EINVAL, "not in [1, 65535]");
    expect_zmq("tcp://:5557", &OPEN, KVR_EINVAL, "not a host");
    expect_zmq("tcp://a b:5557", &OPEN, KVR_EINVAL, "not a host");
    expect_zmq("tcp://[::1:5557", &OPEN, KVR_EINVAL, "not a host");
    expect_zmq("tcp://[::1]x:5557", &OPEN, KVR_EINVAL, "after the IPv6");
    expect_zmq("", &OPEN, KVR_EINVAL, "only tcp://");
}

static void test_ipc_allow_list(void **state)
{
    (void)state;
    kvr_endpoint_policy_t p = {.ipc_dirs = "/run/vllm,/var/run/sglang"};
    expect_zmq("ipc:///run/vllm/kv-events", &p, KVR_OK, NULL);
    expect_zmq("ipc:///var/run/sglang/a/b", &p, KVR_OK, NULL);
    expect_zmq("ipc:///run/vllm", &p, KVR_EINVAL, "not under");        /* the dir itself */
    expect_zmq("ipc:///run/vllmX/kv", &p, KVR_EINVAL, "not under");    /* a sibling prefix */
    expect_zmq("ipc:///etc/passwd", &p, KVR_EINVAL, "not under");
    expect_zmq("ipc:///run/vllm/../../etc/shadow", &p, KVR_EINVAL, "normalised");
    expect_zmq("ipc:///run/vllm/./kv", &p, KVR_EINVAL, "normalised");
    expect_zmq("ipc:///run/vllm//kv", &p, KVR_EINVAL, "normalised");
    expect_zmq("ipc://run/vllm/kv", &p, KVR_EINVAL, "normalised");
    expect_zmq("ipc:///run/vllm/*", &p, KVR_EINVAL, "normalised");   /* found by fuzz_endpoint */
    expect_zmq("ipc:///run/vllm/a;b", &p, KVR_EINVAL, "normalised");
    char err[128];
    assert_int_equal(kvr_endpoint_check_ipc_dirs("/run/vllm,/tmp/x", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_endpoint_check_ipc_dirs("", err, sizeof err), KVR_OK);
    assert_int_equal(kvr_endpoint_check_ipc_dirs("/run/../etc", err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "allowed_ipc_dirs"));
    assert_int_equal(kvr_endpoint_check_ipc_dirs("relative", err, sizeof err), KVR_EINVAL);
    assert_int_equal(kvr_endpoint_check_ipc_dirs("/ok,", err, sizeof err), KVR_EINVAL);
}

static void test_urls(void **state)
{
    (void)state;
    expect_url("http://127.0.0.1:8001", &OPEN, KVR_OK, NULL);
    expect_url("http://engine-3", &OPEN, KVR_OK, NULL);
    expect_url("HTTP://[::1]:8001/vllm/", &OPEN, KVR_OK, NULL);
    expect_url("https://engine:443", &OPEN, KVR_EINVAL, "https is not spoken");
    expect_url("ftp://engine", &OPEN, KVR_EINVAL, "must start with http://");
    expect_url("http://user:pw@engine:80", &OPEN, KVR_EINVAL, "credentials");
    expect_url("http://engine:80/a?b", &OPEN, KVR_EINVAL, "'?'");
    expect_url("http://engine:80/a b", &OPEN, KVR_EINVAL, "spaces");
    expect_url("http://engine:0", &OPEN, KVR_EINVAL, "not in [1, 65535]");
    expect_url("http://*:80", &OPEN, KVR_EINVAL, "wildcard");
    expect_url("http://", &OPEN, KVR_EINVAL, "not a host");
}

/* The parsed parts: host without brackets, Host header with them, port 80 by default, base
 * path without trailing slashes. */
static void test_url_parts(void **state)
{
    (void)state;
    static const struct {
        const char *url, *host, *hdr, *base;
        unsigned port;
    } cases[] = {
        {"http://[::1]:8000", "::1", "[::1]:8000", "", 8000},
        {"http://[fe80::1]/v1/", "fe80::1", "[fe80::1]:80", "/v1", 80},
        {"http://gpu1:8000/base//", "gpu1", "gpu1:8000", "/base", 8000},
        {"http://10.0.0.5", "10.0.0.5", "10.0.0.5:80", "", 80},
        {"HTTP://h:1/", "h", "h:1", "", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kvr_url_t u;
        char err[200] = "";
        assert_int_equal(kvr_endpoint_parse_url(cases[i].url, NULL, &u, err, sizeof err), KVR_OK);
        assert_string_equal(u.host, cases[i].host);
        assert_string_equal(u.host_hdr, cases[i].hdr);
        assert_string_equal(u.base_path, cases[i].base);
        assert_int_equal(u.port, cases[i].port);
    }
    char longhost[300] = "http://";
    memset(longhost + 7, 'a', 270);
    longhost[277] = '\0';
    kvr_url_t u;
    char err[200] = "";
    assert_int_equal(kvr_endpoint_parse_url(longhost, NULL, &u, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "url: host longer than"));
}

static void test_host_allow_list(void **state)
{
    assert_true(kvr_endpoint_host_listed("a.example, 10.0.0.5 ,B.example", "10.0.0.5"));
    assert_true(kvr_endpoint_host_listed("a.example,B.example", "b.EXAMPLE"));
    assert_false(kvr_endpoint_host_listed("a.example,B.example", "example"));
    assert_false(kvr_endpoint_host_listed("", "a.example"));
    (void)state;
    kvr_endpoint_policy_t p = {.hosts = "10.0.0.5, engine-1.local ,[::1]"};
    expect_url("http://10.0.0.5:8001", &p, KVR_OK, NULL);
    expect_url("http://ENGINE-1.local:8001/v", &p, KVR_OK, NULL);
    expect_url("http://[::1]:8001", &p, KVR_OK, NULL);
    expect_url("http://10.0.0.50:8001", &p, KVR_EINVAL, "not in allowed_worker_hosts");
    expect_url("http://evil.example:8001", &p, KVR_EINVAL, "not in allowed_worker_hosts");
    expect_zmq("tcp://10.0.0.5:5557", &p, KVR_OK, NULL);
    expect_zmq("tcp://10.0.0.6:5557", &p, KVR_EINVAL, "not in allowed_worker_hosts");
}

static void test_router_refuses_whole_registration(void **state)
{
    (void)state;
    kvr_router_config_t cfg;
    char err[256];
    kvr_config_defaults(&cfg);
    assert_int_equal(kvr_config_set(&cfg, "allowed_worker_hosts", "127.0.0.1", err, sizeof err),
                     KVR_OK);
    int st;
    kvr_index_config_t ic = {.sync = KVR_SYNC_NONE};
    kvr_index_t *ix = kvr_index_new(&ic, &st);
    assert_non_null(ix);
    kvr_router_t *r = kvr_router_new(&cfg, ix, &st, err, sizeof err);
    assert_non_null(r);
    kvr_worker_spec_t w = {.worker_id = 7, .dp_size = 1};
    snprintf(w.url, sizeof w.url, "http://127.0.0.1:8001");
    snprintf(w.events, sizeof w.events, "ipc:///tmp/victim");
    assert_int_equal(kvr_router_add_worker(r, &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "worker 7 events:"));
    assert_null(kvr_router_worker(r, 7));
    snprintf(w.events, sizeof w.events, "tcp://127.0.0.1:5557");
    snprintf(w.url, sizeof w.url, "http://10.9.9.9:8001");
    assert_int_equal(kvr_router_add_worker(r, &w, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "worker 7 url: host '10.9.9.9'"));
    assert_null(kvr_router_worker(r, 7));
    snprintf(w.url, sizeof w.url, "http://127.0.0.1:8001");
    assert_int_equal(kvr_router_add_worker(r, &w, err, sizeof err), KVR_OK);
    assert_non_null(kvr_router_worker(r, 7));
    kvr_router_free(r);
    kvr_index_free(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_engine_addresses_accepted),
        cmocka_unit_test(test_binding_and_file_addresses_refused),
        cmocka_unit_test(test_ipc_allow_list),
        cmocka_unit_test(test_urls),
        cmocka_unit_test(test_url_parts),
        cmocka_unit_test(test_host_allow_list),
        cmocka_unit_test(test_router_refuses_whole_registration),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
