#!/usr/bin/python3
"""jinja_cases.py: small templates exercising every construct of the supported Jinja subset
(filters, tests, methods, loop variables, scoping, whitespace control, errors), as corpus rows
with a "template" field (rendered by template_oracle.py and tmpl_driver alike, with the same
fixed messages, tools and kwargs). Usage: jinja_cases.py [--first-id N] > rows.jsonl
"""
import json
import sys

MESSAGES = [
    {"role": "system", "content": "Be brief. ünï 中文"},
    {"role": "user", "content": "  Hi {{x}}  \n"},
    {"role": "assistant", "content": "<think>r</think>\n\nok", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"a": 1, "b": [True, None, 2.5]}}}]},
    {"role": "tool", "content": "42"},
    {"role": "user", "content": "bye"},
]
TOOLS = [{"type": "function", "function": {"name": "f", "description": "d\"q\" é",
                                            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]
KWARGS = {"enable_thinking": False, "num": 7, "flt": 0.1, "neg": -3, "big": 1e20, "small": 1.5e-7,
          "s": "Hello World", "lst": [3, 1, 2], "d": {"b": 1, "a": [1, 2], "c": {"x": None}},
          "empty": "", "none": None, "bos_token": "<s>", "eos_token": "</s>", "words": " a  b\tc\n", "uni": "ÀÉ ß"}

CASES = [
    # output and literals
    "{{ 'a' }}{{ \"b\" }}{{ 1 }}{{ 1.5 }}{{ true }}{{ none }}{{ [1, 'x', none] }}{{ {'k': 'v'} }}",
    "{{ 'a' 'b' }}|{{ 'esc\\n\\t\\x41\\u00e9\\'q' }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }}",
    "{{ num }} {{ flt }} {{ neg }} {{ big }} {{ small }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 10 / 4 }} {{ 2 ** 8 }}",
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 1 + true }} {{ 3 * 'ab' }} {{ 'x' * 0 }}",
    "{{ undefined_var }}|{{ undefined_var is defined }}|{{ none is none }}|{{ d.missing }}|{{ d['c'].x }}",
    "{{ lst }} {{ d }} {{ lst + [4] }} {{ s ~ num ~ none ~ undefined_var }}",
    # comparisons, logic, inline if
    "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 in lst }} {{ 'x' not in s }} {{ 'b' in d }}",
    "{{ 1 and 'x' }}|{{ 0 or '' or 'z' }}|{{ not none }}|{{ 'y' if num > 3 else 'n' }}|{{ 'y' if false }}|",
    # indexing and slicing
    "{{ s[0] }}{{ s[-1] }}{{ s[1:4] }}{{ s[::-1] }}{{ s[::2] }}{{ lst[1:] }}{{ lst[:-1] }}{{ lst[5] }}{{ uni[1] }}{{ uni[::-1] }}",
    "{{ messages[0].role }} {{ messages[-1]['content'] }} {{ messages[1:3]|length }} {{ messages[::-1][0].content }}",
    # filters
    "{{ words|trim }}|{{ s|length }}|{{ uni|length }}|{{ d|length }}|{{ lst|count }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ 'hello'|capitalize }}",
    "{{ undefined_var|default('dflt') }}|{{ empty|default('e', true) }}|{{ empty|d('x') }}|{{ lst|join(', ') }}|{{ lst|join }}",
    "{{ s|replace('o', '0') }}|{{ s|replace('l', 'L', 1) }}|{{ lst|first }}|{{ lst|last }}|{{ s|first }}|{{ lst|reverse|list }}|{{ s|reverse }}",
    "{{ d|items|list }}|{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}|{{ d|list }}|{{ s|list }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|list|length }}|{{ messages|rejectattr('role', 'eq', 'user')|map(attribute='role')|join(',') }}",
    "{{ messages|map(attribute='role')|list }}|{{ messages|selectattr('tool_calls')|list|length }}|{{ messages|selectattr('tool_calls', 'defined')|list|length }}",
    "{{ lst|map('string')|join('-') }}|{{ '12'|int + 1 }}|{{ 'x'|int }}|{{ 3.9|int }}|{{ '2.5'|float }}|{{ neg|abs }}|{{ lst|sort }}|{{ lst|sort(reverse=true) }}|{{ [1, 2, 1]|unique|list }}",
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ tools|tojson }}|{{ uni|tojson }}|{{ uni|tojson(ensure_ascii=true) }}",
    "{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(sort_keys=true) }}|{{ [1.0, 1e-7, none, true, 'é\\u2028'] | tojson }}|{{ {}|tojson }}|{{ []|tojson(indent=4) }}",
    "{{ messages[2].tool_calls[0].function.arguments|tojson }}|{{ messages|tojson(indent=1) }}",
    "{{ num|string ~ 'x' }}|{{ none|string }}|{{ lst|string }}|{{ (1, 'a')|string }}",
    # generators, views, ranges (Python objects, not lists)
    "{% if messages|selectattr('role', 'eq', 'nobody') %}T{% else %}F{% endif %}|{{ none|selectattr('x')|list }}|{{ none|map(attribute='x')|list }}|{{ ''|reject|list }}",
    "{% set g = lst|map('string') %}{{ g|join }}|{{ g|join }}|{% set h = lst|select %}{{ h|first }}{{ h|first }}{{ h|list }}{{ h|first is defined }}",
    "{{ range(3)|length }}{{ range(5)[1] }}{{ range(10)[2:5]|list }}{{ d.items()|length }}{{ d.keys()|list }}{{ d.items()[0] is defined }}{{ (lst|select)[0] is defined }}",
    "{{ lst|reverse|list }}{{ (lst|select|reverse)[0] }}{{ lst|reverse is sequence }}{{ [1] == (1,) }}{{ (1, 2) + (3,) }}{{ range(2) is sequence }}",
    "{% for k, v in d.items() %}{{ k }}{% endfor %}{% for x in lst|unique %}{{ x }}{% endfor %}{% for x in d|items %}{{ x[0] }}{% endfor %}{{ d|items is iterable }}",
    "{{ lst|map('string')|tojson }}",
    "{{ messages|selectattr('role')|length }}",
    "{{ (lst|select)|last }}",
    "{{ [1] + (2,) }}",
    # tests
    "{{ s is string }}{{ num is number }}{{ num is integer }}{{ flt is float }}{{ d is mapping }}{{ lst is sequence }}{{ s is iterable }}{{ true is boolean }}",
    "{{ false is false }}{{ 0 is false }}{{ true is true }}{{ num is odd }}{{ num is even }}{{ 9 is divisibleby 3 }}{{ 'ab' is lower }}{{ 'AB' is upper }}",
    "{{ none is not none }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 2 is in lst }}{{ undefined_var is undefined }}{{ enable_thinking is defined and enable_thinking is false }}",
    # methods
    "{{ s.startswith('He') }}{{ s.endswith('x') }}{{ s.startswith(('x', 'H')) }}|{{ words.strip() }}|{{ words.lstrip() }}|{{ words.rstrip() }}|{{ 'xxaxx'.strip('x') }}|",
    "{{ words.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ s.upper() }}{{ s.lower() }}{{ s.replace('l', '') }}{{ s.find('W') }}{{ uni.find('ß') }}",
    "{{ d.items()|list }}|{{ d.keys()|list }}|{{ d.values()|list }}|{{ d.get('a') }}|{{ d.get('zz', 'dflt') }}|{{ d.get('zz') }}",
    "{{ messages[2].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[2].content.split('</think>')[0].rstrip('\\n').split('<think>')[-1] }}",
    # loops
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }} {% endfor %}",
    "{% for m in messages %}{{ loop.previtem.role if loop.previtem is defined }}>{{ loop.nextitem.role if loop.nextitem is defined }};{% endfor %}",
    "{% for m in messages if m.role != 'tool' %}{{ m.role }}{{ loop.index }}/{{ loop.length }} {% else %}none{% endfor %}|{% for x in [] %}x{% else %}empty{% endfor %}",
    "{% for m in messages %}{% if m.role == 'tool' %}{% break %}{% endif %}{{ m.role }} {% endfor %}|{% for x in lst %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}",
    "{% for a in lst %}{% for b in lst %}{{ a * b }}{% if loop.last %};{% endif %}{% endfor %}{{ loop.index }}{% endfor %}",
    "{% for k in d %}{{ k }}{% endfor %}|{% for c in 'héllo' %}{{ c }}.{% endfor %}|{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
    "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}|{% for (k, v) in d.items() %}{{ k }}{% endfor %}",
    # scoping, set, namespace
    "{% set x = 1 %}{% for i in lst %}{% set x = i %}{{ x }}{% endfor %}{{ x }}|{% if true %}{% set y = 5 %}{% endif %}{{ y }}",
    "{% for i in [1, 2] %}{{ z }}{% set z = i %}{{ z }}{% endfor %}[{{ z }}]",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.n }} {{ ns.s }} {{ ns.missing }}",
    "{% set t = 1, 2 %}{{ t }}|{% set l = [messages[0], 'x'] %}{{ l|length }}|{% set add_generation_prompt = 'over' %}{{ add_generation_prompt }}",
    # whitespace control
    "a\n  {% if true %}\n    b\n  {% endif %}\nc\n",
    "a  {%- if true -%}  b  {%- endif -%}  c|{{- ' d ' -}}|  {{ 'e' }}  ",
    "x\n{# comment #}\ny\n  {# indented comment #}\nz {#- stripped -#} w",
    "  {%+ if true %}keep{% endif +%}\nnext",
    "{% if true %}\r\nwindows\r\n{% endif %}\r\nend\n\n",
    "line\n{%- for i in lst %}\n  {{ i }}\n{%- endfor %}\n",
    "\u00a0\u00a0{%- if true %}nbsp stripped{% endif -%}\u3000\u3000x",
    # globals
    "{{ strftime_now('%Y-%m-%d %H:%M %A %b') }}|{{ strftime_now('%d %B %Y') }}",
    "{% if messages|length > 3 %}{{ raise_exception('too many: ' ~ messages|length) }}{% endif %}",
    "{{ bos_token }}{{ eos_token }}{{ tools[0].function.name }}{{ tools is none }}{{ documents is none }}",
    # macros
    "{% macro m(a, b='d', c=none) %}[{{ a }}|{{ b }}|{{ c }}|{{ num }}]{% endmacro %}{{ m(1) }}{{ m(1, 2, 3) }}{{ m(b=5, a=0) }}{{ m() }}",
    "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n }}*{{ fact(n - 1) }}{% endif %}{% endmacro %}{{ fact(5) }}|{{ fact(3)|length }}",
    "{% set top = 'T' %}{% macro show() %}{{ top }}{{ m2 is defined }}{{ loop is defined }}{% set top = 'inner' %}{{ top }}{% endmacro %}{% for m2 in [1] %}{{ show() }}{% endfor %}{{ top }}",
    "{%- macro ts(spec) -%}{%- if spec.type == 'object' -%}{{- '{' }}{%- for k, v in spec.properties.items() -%}{{ k }}: {{ ts(v) }}{%- if not loop.last %}, {% endif -%}{%- endfor -%}{{- '}' }}{%- else -%}{{ spec.type }}{%- endif -%}{%- endmacro -%}{{ ts(tools[0].function.parameters) }}",
    "{% macro early() %}{{ later() }}{% endmacro %}{% macro later() %}L{% endmacro %}{{ early() }}{{ early() ~ '!' }}{{ later is callable }}",
    "{% macro w() %}\n  {%- for m in messages %}\n    {{ m.role }}\n  {%- endfor %}\n{% endmacro %}[{{ w() }}]",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}",
    "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(z=1) }}",
    # errors on both sides (runtime)
    "{{ undefined_var.attr }}",
    "{{ 'a' + 1 }}",
    "{{ none + 'x' }}",
    "{{ undefined_var + 'x' }}",
    "{{ 1 / 0 }}",
    "{{ lst < 'a' }}",
    "{{ 5|length }}",
    "{{ 1 in 5 }}",
    "{% set x.y = 1 %}",
    "{{ d|tojson(indent=2)|tojson }}{{ messages[0]|tojson }}",
    "{{ undefined_var|tojson }}",
]

# constructs refused at load: Jinja accepts them, the subset does not; both sides must fail
# only where Jinja also fails, so these are checked by the unit tests, not here.

def main():
    first = 100000
    if len(sys.argv) > 2 and sys.argv[1] == "--first-id":
        first = int(sys.argv[2])
    for i, t in enumerate(CASES):
        for agp in (False, True):
            print(json.dumps({"id": first + 2 * i + agp, "model": "case%d" % i, "template": t,
                              "messages": json.dumps(MESSAGES), "tools": json.dumps(TOOLS),
                              "kwargs": json.dumps(KWARGS), "add_generation_prompt": agp},
                             ensure_ascii=False))


if __name__ == "__main__":
    main()
