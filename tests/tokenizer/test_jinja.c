/*
 * test_jinja.c: the chat-template interpreter (src/tokenizer/tmpl.h) in small: constructs
 * outside the subset refused at load with their name and line; whitespace control (trim_blocks,
 * lstrip_blocks, - and + modifiers); loop variables, loop controls and Jinja's scoping; the
 * bounds (nesting, output, memory, steps) as errors, never a crash or a truncation; choosing
 * the named template; raise_exception's message. Expected texts are Jinja 3.1's renderings
 * (checked with tests/oracle/template_oracle.py); the byte-for-byte comparison on the real
 * templates is tests/oracle/tmpl_check.py.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvrouter/status.h"
#include "tokenizer/tmpl.h"

static const char MSGS[] = "[{\"role\":\"system\",\"content\":\"S\"},"
                           "{\"role\":\"user\",\"content\":\"U1\"},"
                           "{\"role\":\"assistant\",\"content\":\"A1\"},"
                           "{\"role\":\"user\",\"content\":\"U2\"}]";

/* Renders src with MSGS; returns the status, *out the text (caller frees) or the error. */
static int render_lim(const char *src, const struct kvr_tmpl_limits *lim, char **out, char *err,
                      size_t errlen)
{
    struct kvr_tmpl *t = NULL;
    int rc = kvr_tmpl_load(src, strlen(src), lim, &t, err, errlen);
    *out = NULL;
    if (rc)
        return rc;
    struct kvr_tmpl_input in = {.messages = MSGS,
                                .messages_len = strlen(MSGS),
                                .kwargs = "{\"x\": 3}",
                                .kwargs_len = 8,
                                .add_generation_prompt = true,
                                .now_s = 1753000000};
    size_t len;
    rc = kvr_tmpl_render(t, &in, out, &len, err, errlen);
    if (!rc)
        assert_int_equal(strlen(*out), len);
    kvr_tmpl_free(t);
    return rc;
}

static void expect(const char *src, const char *want)
{
    char *out, err[512] = "";
    int rc = render_lim(src, NULL, &out, err, sizeof err);
    if (rc)
        fail_msg("%s: %s", src, err);
    if (strcmp(out, want) != 0)
        fail_msg("template %s\n  got  [%s]\n  want [%s]", src, out, want);
    free(out);
}

static void refused(const char *src, const char *what)
{
    char *out, err[512] = "";
    int rc = render_lim(src, NULL, &out, err, sizeof err);
    free(out);
    assert_int_equal(rc, KVR_EPARSE);
    if (!strstr(err, what))
        fail_msg("template %s: error [%s] does not name [%s]", src, err, what);
}

static void test_refused_at_load(void **state)
{
    (void)state;
    refused("a\nb\n{{ x|wordcount }}", "template line 3: filter \"wordcount\" is not supported");
    refused("{% macro m() %}\n{{ caller() }}{% endmacro %}",
            "line 2: \"caller\" in a macro is not supported");
    refused("{% macro m(a=1, b) %}{% endmacro %}", "non-default parameter");
    refused("\n{% include 'x' %}", "line 2: statement \"include\" is not supported");
    refused("{% extends 'x' %}", "statement \"extends\"");
    refused("{% call m() %}{% endcall %}", "statement \"call\"");
    refused("{% filter upper %}x{% endfilter %}", "statement \"filter\"");
    refused("{% raw %}{{ x }}{% endraw %}", "statement \"raw\"");
    refused("{% set x %}block{% endset %}", "block set");
    refused("{% for m in messages recursive %}{% endfor %}", "recursive loops");
    refused("{{ 'a'.format(1) }}", "method \"format\" is not supported");
    refused("{{ lipsum(2) }}", "function \"lipsum\" is not supported");
    refused("{% for m in messages %}{{ loop.cycle('a', 'b') }}{% endfor %}",
            "method \"cycle\" is not supported");
    refused("{{ x is escaped }}", "test \"escaped\" is not supported");
    refused("{{ x|e }}", "filter \"e\" is not supported");
    refused("{% break %}", "'break' outside a loop");
    refused("{% if x %}", "unexpected end of template: expected 'endif'");
    refused("{{ x ", "expected '}}'");
    refused("{{ 'abc }}", "unterminated string");
    refused("{# open", "unterminated comment");
    refused("{{ f(*args) }}", "not supported");
    refused("{% generation %}x{% endgeneration %}", "statement \"generation\"");
}

static void test_whitespace(void **state)
{
    (void)state;
    expect("a\n  {% if true %}\n  x\n  {% endif %}\nb\n", "a\n  x\nb");
    expect("a {%+ if true %}x{% endif +%}\nb", "a x\nb");
    expect("{# c #}\n  {# d #}\nx", "x");
    expect("{{ 'x' }}\n", "x");
    expect("{{ 'x' }}\n\n", "x\n");
    expect("a  {%- if true -%}  b  {%- endif -%}  c", "abc");
    expect("a  {{- 'b' -}}  c", "abc");
    expect("x\r\n{% if true %}\r\ny\r\n{% endif %}", "x\ny\n");
    expect("{{ 'a' }} {% if true %}b{% endif %}", "a b");
}

static void test_loops_and_scope(void **state)
{
    (void)state;
    expect("{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
           "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}",
           "10TrueFalse443;21FalseFalse432;32FalseFalse421;43FalseTrue410;");
    expect("{% for x in [1,2,3] if x > 1 %}{{loop.index}}/{{loop.length}}{% else %}E{% endfor %}",
           "1/22/2");
    expect("{% for x in [] %}{% else %}E{% endfor %}", "E");
    expect("{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}"
           "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
           "13");
    expect("{% for i in [1,2] %}{{ x }}{% set x = i %}{% endfor %}[{{ x }}]", "33[3]");
    expect("{% set y = 5 %}{% for i in [1,2] %}{{ y }}{% set y = i %}{{ y }}{% endfor %}[{{ y }}]",
           "5152[5]");
    expect("{% if true %}{% set z = 3 %}{% endif %}{{ z }}", "3");
    expect("{% set ns = namespace(a=1) %}{% for i in [1,2] %}{% set ns.a = ns.a + i %}"
           "{% endfor %}{{ ns.a }}",
           "4");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    /* a namespace set into itself prints as Python's repr prints a cycle (Jinja2's output) */
    expect("{% set ns = namespace(n=0, s='') %}{% for i in [1] %}{% set ns.n = ns %}{% endfor %}"
           "{{ ns.n }}|{{ ns }}",
           "<Namespace {'n': <Namespace {...}>, 's': ''}>|"
           "<Namespace {'n': <Namespace {...}>, 's': ''}>");
    expect("{{ messages[::-1][0].content }}{{ messages|length - 1 }}{{ -1|abs }}", "U231");
}

static void test_values(void **state)
{
    (void)state;
    expect("{{ [1,'a',none,true,1.5,{'k':'v'}] }} {{ 1e20 }} {{ 1.0 }} {{ 0.1+0.2 }}",
           "[1, 'a', None, True, 1.5, {'k': 'v'}] 1e+20 1.0 0.30000000000000004");
    expect("{{ 7 % -3 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ true + 1 }}",
           "-2 -4 3.5 1024 2");
    expect("{{ {'b':1,'a':2}|tojson }} {{ 'é'|tojson }} {{ 'é'|tojson(ensure_ascii=true) }}",
           "{\"b\": 1, \"a\": 2} \"é\" \"\\u00e9\"");
    expect("{{ 'héllo'[1] }}{{ 'abc'[::-1] }}{{ ' a  b '.split() }}", "écba['a', 'b']");
    expect("{{ strftime_now('%Y') | length }}", "4");
}

static void test_raise_and_errors(void **state)
{
    (void)state;
    char *out, err[512];
    assert_int_equal(render_lim("{{ raise_exception('no ' ~ x) }}", NULL, &out, err, sizeof err),
                     KVR_EINVAL);
    assert_string_equal(err, "raise_exception: no 3");
    assert_int_equal(render_lim("{{ nope.attr }}", NULL, &out, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "template line 1"));
    assert_int_equal(render_lim("\n\n{{ 'a' + 1 }}", NULL, &out, err, sizeof err), KVR_EINVAL);
    assert_non_null(strstr(err, "template line 3"));
}

static void test_bounds(void **state)
{
    (void)state;
    char *out, err[512];
    /* deep nesting: statements and expressions, refused at load */
    size_t n = 400;
    char *src = malloc(n * 30 + 64), *p = src;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "{%% if true %%}");
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "{%% endif %%}");
    assert_int_equal(render_lim(src, NULL, &out, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "nesting deeper"));
    p = src;
    p += sprintf(p, "{{ ");
    for (size_t i = 0; i < n; i++)
        *p++ = '(';
    *p++ = '1';
    for (size_t i = 0; i < n; i++)
        *p++ = ')';
    strcpy(p, " }}");
    assert_int_equal(render_lim(src, NULL, &out, err, sizeof err), KVR_EPARSE);
    p = src;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "-");
    *p = 0;
    char *neg = malloc(strlen(src) + 16);
    sprintf(neg, "{{ %s1 }}", src);
    assert_int_equal(render_lim(neg, NULL, &out, err, sizeof err), KVR_EPARSE);
    free(neg);
    free(src);
    /* work independent of an operand's value: an exponent of 10**17 or a repeat count of 10**17
     * on an empty string answers at once, as Python does (a fuzzer found the loop it used to be) */
    expect("{{ 1 ** 100000000000000000 }} {{ (-1) ** 999999999999999999 }} "
           "{{ 0 ** 100000000000000000 }} {{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 3 ** 0 }}|"
           "{{ '' * 100000000000000000 }}|",
           "1 -1 0 4611686018427387904 -9223372036854775808 1||");
    expect("{{ range(922337203685477580 * 10, 922337203685477580 * 10 + 7, 5)|list }}"
           "{{ range(-922337203685477580 * 10, -922337203685477580 * 10 - 8, -5)|list }}",
           "[9223372036854775800, 9223372036854775805][-9223372036854775800, "
           "-9223372036854775805]");
    assert_int_equal(render_lim("{{ 2 ** 64 }}", NULL, &out, err, sizeof err), KVR_ERANGE);
    assert_int_equal(render_lim("{{ 3 ** 100000000000000000 }}", NULL, &out, err, sizeof err),
                     KVR_ERANGE);
    /* huge output: refused at the bound, not truncated */
    struct kvr_tmpl_limits lim = {.max_output = 1000};
    assert_int_equal(render_lim("{% for i in range(100) %}{{ '0123456789abcdef' }}{% endfor %}",
                                &lim, &out, err, sizeof err),
                     KVR_ETOOBIG);
    assert_null(out);
    assert_int_equal(render_lim("{{ 'ab' * 100000 }}", &lim, &out, err, sizeof err), KVR_ETOOBIG);
    /* steps: nested loops */
    lim = (struct kvr_tmpl_limits){.max_steps = 100000};
    assert_int_equal(render_lim("{% for i in range(1000) %}{% for j in range(1000) %}"
                                "{% endfor %}{% endfor %}",
                                &lim, &out, err, sizeof err),
                     KVR_ETOOBIG);
    assert_non_null(strstr(err, "steps"));
    /* memory: a string doubling through a namespace */
    lim = (struct kvr_tmpl_limits){.max_memory = 1 << 20, .max_output = 1 << 30};
    assert_int_equal(render_lim("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                                &lim, &out, err, sizeof err),
                     KVR_ETOOBIG);
    assert_int_equal(render_lim("{{ range(1000000)|length }}", NULL, &out, err, sizeof err),
                     KVR_ETOOBIG);
}

static void test_config(void **state)
{
    (void)state;
    static const char cfg[] = "{\"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<B>\"}, "
                              "\"eos_token\": \"<E>\","
                              " \"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ "
                              "bos_token }}{{ eos_token }}\"},"
                              " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"},"
                              " {\"name\": \"rag\", \"template\": \"{% unknown %}\"}]}";
    struct kvr_tmpl *t;
    char err[256], *out;
    size_t len;
    assert_int_equal(kvr_tmpl_load_config(cfg, strlen(cfg), NULL, &t, err, sizeof err), KVR_OK);
    struct kvr_tmpl_input in = {.messages = "[]", .messages_len = 2};
    assert_int_equal(kvr_tmpl_render(t, &in, &out, &len, err, sizeof err), KVR_OK);
    assert_string_equal(out, "D<B><E>");
    free(out);
    in.tools = "[{}, {}]";
    in.tools_len = 8;
    assert_int_equal(kvr_tmpl_render(t, &in, &out, &len, err, sizeof err), KVR_OK);
    assert_string_equal(out, "T2");
    free(out);
    in.kwargs = "{\"messages\": 1}";
    in.kwargs_len = strlen(in.kwargs);
    assert_int_equal(kvr_tmpl_render(t, &in, &out, &len, err, sizeof err), KVR_EINVAL);
    in.kwargs = NULL;
    in.messages = "[{";
    in.messages_len = 2;
    assert_int_equal(kvr_tmpl_render(t, &in, &out, &len, err, sizeof err), KVR_EPARSE);
    kvr_tmpl_free(t);
    static const char none[] = "{\"eos_token\": \"</s>\"}";
    assert_int_equal(kvr_tmpl_load_config(none, strlen(none), NULL, &t, err, sizeof err),
                     KVR_ENOTFOUND);
    static const char bad[] = "{\"chat_template\": \"{{ x|wordcount }}\"}";
    assert_int_equal(kvr_tmpl_load_config(bad, strlen(bad), NULL, &t, err, sizeof err), KVR_EPARSE);
    assert_non_null(strstr(err, "wordcount"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_at_load),  cmocka_unit_test(test_whitespace),
        cmocka_unit_test(test_loops_and_scope),  cmocka_unit_test(test_values),
        cmocka_unit_test(test_raise_and_errors), cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
