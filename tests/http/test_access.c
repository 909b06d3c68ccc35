/*
 * test_access.c: who may call what (http/access.h): the class of each path the live view
 * adds, and the credentials each class takes: a bearer token everywhere, HTTP Basic (the key as
 * the password, as a browser sends it for /ui) on read calls only; malformed Basic headers are
 * refused, never read past, never taken for another class.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "http/access.h"

static kvr_access_t keyed(void)
{
    kvr_access_t a;
    memset(&a, 0, sizeof a);
    snprintf(a.api_key, sizeof a.api_key, "sk-client");
    snprintf(a.admin_key, sizeof a.admin_key, "sk-admin");
    return a;
}

static int verdict(const kvr_access_t *a, kvr_access_class_t cls, const char *auth)
{
    char msg[200];
    return kvr_access_check(a, cls, false, auth, msg, sizeof msg);
}

static void test_the_live_view_is_read_class(void **state)
{
    (void)state;
    assert_int_equal(kvr_access_class("/ui", true, false, false), KVR_ACCESS_READ);
    assert_int_equal(kvr_access_class("/v1/stats", true, false, false), KVR_ACCESS_READ);
    assert_int_equal(kvr_access_class("/v1/workers", true, false, false), KVR_ACCESS_READ);
    /* only GET: anything else on those paths is a client call (answered 404 by the host) */
    assert_int_equal(kvr_access_class("/v1/stats", false, true, false), KVR_ACCESS_CLIENT);
}

static void test_basic_credentials_on_read_calls(void **state)
{
    (void)state;
    kvr_access_t a = keyed();
    /* "operator:sk-client", "x:sk-admin", ":sk-client" (an empty user name) */
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Basic b3BlcmF0b3I6c2stY2xpZW50"), 0);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "basic eDpzay1hZG1pbg=="), 0);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Basic OnNrLWNsaWVudA=="), 0);
    /* the bearer token still works */
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Bearer sk-client"), 0);
    /* wrong password "operator:sk-clien", no colon "sk-client", none at all */
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Basic b3BlcmF0b3I6c2stY2xpZW4="), 401);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Basic c2stY2xpZW50"), 401);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, NULL), 401);
}

static void test_basic_credentials_elsewhere_refused(void **state)
{
    (void)state;
    kvr_access_t a = keyed();
    /* a client call (the OpenAI API) and an admin call take bearer tokens only */
    assert_int_equal(verdict(&a, KVR_ACCESS_CLIENT, "Basic b3BlcmF0b3I6c2stY2xpZW50"), 401);
    assert_int_equal(verdict(&a, KVR_ACCESS_ADMIN, "Basic eDpzay1hZG1pbg=="), 401);
    assert_int_equal(verdict(&a, KVR_ACCESS_ADMIN, "Bearer sk-admin"), 0);
}

static void test_malformed_basic_refused(void **state)
{
    (void)state;
    kvr_access_t a = keyed();
    static const char *const bad[] = {
        "Basic ",                        /* empty */
        "Basic b3BlcmF0b3I6c2stY2xpZW50=", /* length not a multiple of 4 */
        "Basic b3Bl!!!!",                /* not base64 */
        "Basic ====",                    /* padding only */
        "Basic AA==",                    /* one NUL byte, no colon */
        "Basic OgBzay1jbGllbnQ=",        /* ":\0sk-client": a NUL inside the password */
        "Basicb3BlcmF0b3I6c2stY2xpZW50", /* no space after the scheme */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(verdict(&a, KVR_ACCESS_READ, bad[i]), 401);
    /* a header far longer than any key: refused without reading past a bound */
    char big[8192] = "Basic ";
    memset(big + 6, 'A', sizeof big - 7);
    big[sizeof big - 1] = '\0';
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, big), 401);
}

static void test_no_keys_no_credentials_needed(void **state)
{
    (void)state;
    kvr_access_t a;
    memset(&a, 0, sizeof a);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, NULL), 0);
    assert_int_equal(verdict(&a, KVR_ACCESS_READ, "Basic !!!!"), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_live_view_is_read_class),
        cmocka_unit_test(test_basic_credentials_on_read_calls),
        cmocka_unit_test(test_basic_credentials_elsewhere_refused),
        cmocka_unit_test(test_malformed_basic_refused),
        cmocka_unit_test(test_no_keys_no_credentials_needed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
