#!/usr/bin/python3
"""Generate cases.json: golden outputs of the real jinja2 for tests/test_template.c.

Run from the repository root with Debian's jinja2 (apt-get install -y python3-jinja2):

    /usr/bin/python3 tests/data/template-cases/gen.py

The environment is configured the way Hugging Face transformers renders chat templates:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension and a `generation` block tag (transformers' AssistantTracker renders its body),
a tojson filter = json.dumps(x, ensure_ascii=False, indent, separators, sort_keys),
raise_exception(msg) and strftime_now(fmt) globals. Debian ships jinja2 3.1.2; the
sandbox of 3.1.5+ (what transformers users run) also treats list.pop/list.clear as unsafe,
so that rule is applied here too.

Each case: {"name", "template", "context"} plus either "expected" (the rendered text) or
"error" (the exception text) and "error_line" (the template line jinja2 reports, or null).
Chat cases ("chat": true) render a template file the way apply_chat_template does:
render(messages=..., tools=..., documents=None, add_generation_prompt=..., **special
tokens, **kwargs).
"""
import json
import os
import sys
import traceback
from collections import abc
from datetime import datetime

import jinja2
import jinja2.sandbox
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.dirname(HERE)

# jinja2 >= 3.1.5: pop and clear on mutable sequences are unsafe in the immutable sandbox
_spec = list(jinja2.sandbox._mutable_spec)
for i, (typ, names) in enumerate(_spec):
    if typ is abc.MutableSequence:
        _spec[i] = (typ, frozenset(set(names) | {"pop", "clear"}))
jinja2.sandbox._mutable_spec = tuple(_spec)


class GenerationTag(Extension):
    """{% generation %}...{% endgeneration %}: a call block rendering its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render_body")
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def error_line(exc):
    if isinstance(exc, SyntaxError) and not isinstance(exc, jinja2.TemplateSyntaxError):
        return None  # a line of jinja2's generated Python code, not of the template
    if getattr(exc, "lineno", None):
        return exc.lineno
    line = None
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename == "<template>":
            line = fr.lineno
    return line


def render(template, context):
    env = make_env()
    try:
        t = env.from_string(template)
        return {"expected": t.render(**context)}
    except Exception as e:  # noqa: BLE001 - any template failure is a golden error
        return {"error": f"{type(e).__name__}: {e}", "error_line": error_line(e)}


# ---------------------------------------------------------------------------------------------
# Language cases: (name, template, context)

CASES = []


def case(name, template, context=None):
    CASES.append((name, template, context or {}))


# --- literals and printing
case("int", "{{ 42 }} {{ -7 }} {{ 0 }} {{ 1_000 }} {{ 0x1f }} {{ 0o17 }} {{ 0b101 }}")
case("float_repr", "{{ 1.0 }} {{ 1.5 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 1e16 }} {{ 1e15 }} "
     "{{ 1e-5 }} {{ 0.0001 }} {{ -0.0 }} {{ 2.5e-10 }} {{ 123456789.125 }} {{ 1e22 }} {{ 3.0e0 }}")
case("float_ctx", "{{ x }} {{ y }} {{ z }} {{ w }}", {"x": 1.0, "y": 2.5, "z": 1e100, "w": -3.25e-7})
case("bool_none", "{{ true }} {{ True }} {{ false }} {{ False }} {{ none }} {{ None }}")
case("strings", "{{ 'a' }}{{ \"b\" }}{{ 'it''s' }}{{ 'x' \"y\" }}")
case("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f' }}|{{ '\\x41\\u00e9\\U0001F600\\101' }}|{{ '\\q' }}")
case("string_unicode", "{{ 'héllo wörld ✓ 日本' }} {{ s }}", {"s": "naïve café — ok 🎉"})
case("list_repr", "{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}] }}")
case("list_repr_quotes", "{{ ['a\\'b', 'a\"b', 'a\\'b\"c', '\\n\\t\\x01\\x7f', 'é\\u200b\\u00a0'] }}")
case("tuple_repr", "{{ (1, 2) }} {{ (1,) }} {{ () }} {{ ((1, 'a'), [none]) }}")
case("dict_repr", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }} {{ {} }} {{ {1: 'x', 2.5: true} }}")
case("dict_ctx_repr", "{{ d }}", {"d": {"z": 1, "a": [True, None, 1.5, "s"]}})
case("print_tuple", "{{ 1, 2 }}")
case("concat_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ [1] ~ u }}")
case("markup_concat", "{{ ('<a>'|safe) + '<b>' }}|{{ '<b>' + ('<a>'|safe) }}|{{ ('<a>'|safe) ~ '<b>' }}")

# --- arithmetic
case("arith_int", "{{ 1 + 2 }} {{ 7 - 10 }} {{ 6 * 7 }} {{ 7 / 2 }} {{ 8 / 2 }} {{ 7 // 2 }} "
     "{{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}")
case("arith_float", "{{ 1 + 1.0 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 10 // 3.0 }} {{ 2 ** 0.5 }} "
     "{{ 0.5 * 4 }} {{ 1.5 - 0.5 }} {{ -7.5 // 2 }} {{ 7 % 2.5 }}")
case("arith_pow_assoc", "{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ (-2) ** 2 }}")
case("arith_bool", "{{ true + 1 }} {{ true * 3 }} {{ -true }} {{ false - 1 }}")
case("arith_unary", "{{ -(3) }} {{ +4 }} {{ - -5 }} {{ -1.5 }} {{ -x }}", {"x": 2})
case("arith_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 * 3 ~ 4 }} {{ 'a' ~ 1 + 2 }} "
     "{{ 10 - 2 - 3 }} {{ 100 / 10 / 5 }}")
case("str_mul", "{{ 'ab' * 3 }}|{{ 3 * 'x' }}|{{ [1, 2] * 2 }}|{{ 'a' * 0 }}|{{ 'a' * -1 }}")
case("str_add", "{{ 'a' + 'b' }} {{ [1] + [2, 3] }} {{ (1,) + (2,) }}")
case("percent_format", "{{ '%s-%d' % ('a', 3) }}|{{ '%05.1f' % 3.14159 }}|{{ '%x %X %o' % (255, 255, 8) }}|"
     "{{ '%-5s|%5s' % ('ab', 'cd') }}|{{ '%(a)s=%(b)r' % {'a': 1, 'b': 'q'} }}|{{ '%%' % () }}|"
     "{{ '%s' % [1, 2] }}|{{ '%r' % 'x' }}|{{ '%+d % d' % (5, 5) }}|{{ '%.2e' % 12345.678 }}|"
     "{{ '%g %g' % (0.0001, 123456789.0) }}|{{ '%#x %#o' % (255, 8) }}|{{ '%c%c' % (65, 'b') }}|"
     "{{ '%5.2s|' % 'abc' }}|{{ '%d' % 3.9 }}|{{ '%s' % none }}")
case("div_zero", "{{ 1 / 0 }}")
case("mod_zero", "{{ 1 % 0 }}")
case("floordiv_zero", "{{ 1 // 0 }}")
case("add_str_int", "{{ 'a' + 1 }}")
case("add_int_str", "{{ 1 + 'a' }}")
case("add_list_tuple", "{{ [1] + (2,) }}")
case("sub_str", "{{ 'a' - 'b' }}")
case("neg_str", "{{ -'a' }}")

# --- comparisons and logic
case("compare", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 1 == 1.0 }} {{ 1 == true }} {{ 'a' < 'b' }} "
     "{{ 'B' < 'a' }} {{ [1, 2] < [1, 3] }} {{ [1, 2] < [1, 2, 0] }} {{ (1, 2) == (1, 2) }} "
     "{{ [1] == (1,) }} {{ none == none }} {{ 1 != 2 }} {{ 'é' > 'z' }}")
case("compare_chain", "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 1 == 1 == 1.0 }} {{ 3 > 2 > 2 }}")
case("compare_dict", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ {'a': 1} == {'a': 1.0} }} "
     "{{ {'a': 1} != {'a': 2} }}")
case("compare_type_error", "{{ 1 < 'a' }}")
case("compare_none_error", "{{ none < 1 }}")
case("in_ops", "{{ 'a' in 'cat' }} {{ '' in 'x' }} {{ 'x' not in ['a'] }} {{ 1 in [1.0] }} "
     "{{ 'k' in {'k': 1} }} {{ 'v' in {'k': 'v'} }} {{ 2 in (1, 2) }} {{ [1] in [[1]] }} "
     "{{ 'a' in u }}")
case("in_str_int_error", "{{ 1 in 'abc' }}")
case("in_none_error", "{{ 'a' in none }}")
case("logic_values", "{{ 0 or 'x' }}|{{ '' and 'x' }}|{{ none or [] }}|{{ 'a' and 'b' }}|"
     "{{ not 0 }}|{{ not 'a' }}|{{ u or 'dflt' }}|{{ u and 1 }}|{{ 1 and u }}|{{ [] or {} }}")
case("logic_precedence", "{{ not 1 == 2 }} {{ not (1 == 1) and true }} {{ true or false and false }} "
     "{{ not none is none }} {{ 1 if not false else 2 }}")
case("truthiness", "{% for v in [0, 1, 0.0, 0.1, '', 'a', [], [0], {}, {'a': 0}, none, true, false] %}"
     "{{ 'T' if v else 'F' }}{% endfor %}")
case("ternary", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] "
     "{{ 'a' if 0 else 'b' if 1 else 'c' }} {{ ('a' if false) is defined }}")
case("ternary_nested_parens", "{{ (1 if x else 2) + 10 }}", {"x": False})

# --- undefined
case("undef_print", "[{{ u }}][{{ u|string }}][{{ u|trim }}][{{ u|upper }}][{{ u|length }}][{{ u|list }}]")
case("undef_tests", "{{ u is defined }} {{ u is undefined }} {{ u is none }} {{ u == none }} "
     "{{ u is string }} {{ u is iterable }} {{ u is sequence }} {{ u is mapping }} {{ u is callable }}")
case("undef_iter", "{% for x in u %}x{% else %}empty{% endfor %}")
case("undef_default", "{{ u|default('d') }} {{ u|d('e') }} {{ ''|default('f') }} {{ ''|default('g', true) }} "
     "{{ 0|default(5, boolean=true) }} {{ none|default('n') }} {{ u|default }}|")
case("undef_in_if", "{% if u %}yes{% else %}no{% endif %}{% if not u %}!{% endif %}")
case("undef_attr_error", "line1\n{{ u.x }}")
case("undef_item_error", "{{ u['x'] }}")
case("undef_add_error", "{{ u + 1 }}")
case("undef_call_error", "{{ u() }}")
case("undef_missing_key_print", "[{{ d.missing }}][{{ d['missing'] }}][{{ l[10] }}][{{ none.x }}]",
     {"d": {"a": 1}, "l": [1]})
case("undef_missing_key_chain_error", "{{ d.missing.deeper }}", {"d": {"a": 1}})
case("undef_list_index_chain_error", "{{ l[5].x }}", {"l": [1]})
case("undef_compare_error", "{{ u < 1 }}")
case("undef_eq", "{{ u == u2 }} {{ u != 1 }} {{ u == '' }}")
case("undef_tojson_error", "{{ u|tojson }}")

# --- attribute and item access
case("getattr_dict", "{{ d.a }} {{ d['a'] }} {{ d.b.c }} {{ d['b']['c'] }} {{ d.l[1] }} {{ d.l.0 }}",
     {"d": {"a": 1, "b": {"c": "x"}, "l": [5, 6]}})
case("getattr_method_vs_key", "{{ d.items is defined }} [{{ d['items'] }}] {{ d.get('items') }} {{ d.keys()|list }}",
     {"d": {"items": "ITEMS", "x": 1}})
case("getitem_key_then_method", "{{ d['get'] }} {{ d.get is callable }} {{ d.get('get') }}", {"d": {"get": 5}})
case("getitem_method_fallback", "{{ d['values']()|list }}", {"d": {"a": 1}})
case("list_index", "{{ l[0] }} {{ l[-1] }} {{ l[-3] }} [{{ l[3] }}] [{{ l[-4] }}] {{ l[true] }}",
     {"l": [1, 2, 3]})
case("str_index", "{{ s[0] }} {{ s[-1] }} {{ s[1] }} [{{ s[10] }}]", {"s": "héllo"})
case("slices", "{{ l[1:] }} {{ l[:2] }} {{ l[::2] }} {{ l[::-1] }} {{ l[-2:] }} {{ l[1:-1] }} "
     "{{ l[5:1:-1] }} {{ l[:100] }} {{ l[3:1] }} {{ l[::-2] }} {{ l[-100:2] }}", {"l": [1, 2, 3, 4, 5]})
case("str_slices", "{{ s[::-1] }}|{{ s[1:3] }}|{{ s[:-1] }}|{{ s[::2] }}|{{ 'abc'[1:] }}|{{ 'abc'[::-1] }}",
     {"s": "héllo✓"})
case("slice_bad_index", "[{{ [1,2]['a':] }}]")
case("slice_step_zero", "{{ [1, 2][::0] }}")
case("tuple_index", "{{ (1, 2, 3)[1] }} {{ (1, 2, 3)[1:] }}")
case("getattr_on_int", "[{{ x.foo }}]", {"x": 5})
case("namespace_item", "{% set ns = namespace(a=1) %}{{ ns['a'] }}{{ ns.a }}[{{ ns.b }}]")

# --- string methods
case("split", "{{ s.split() }} {{ s.split(' ') }} {{ s.split('b') }} {{ s.split(none, 1) }} "
     "{{ s.split('b', 1) }} {{ 'a,b,,c'.split(',') }} {{ ''.split() }} {{ ''.split(',') }} "
     "{{ '  '.split() }} {{ s.split(maxsplit=1) }}", {"s": "  a b\tc \n d  "})
case("rsplit", "{{ 'a b c'.rsplit(' ', 1) }} {{ '  a b c  '.rsplit(None, 1) }} {{ 'a,b,c'.rsplit(',') }}")
case("split_unicode_ws", "{{ 'a\u3000b\u00a0c\u2028d'.split() }}")
case("split_empty_sep_error", "{{ 'abc'.split('') }}")
case("strip", "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ '\\n\\nx\\n'.strip('\\n') }}]"
     "[{{ 'xxaxx'.strip('x') }}][{{ 'abcba'.lstrip('ab') }}][{{ 'abcba'.rstrip('ab') }}][{{ '\u3000x\u00a0'.strip() }}]",
     {"s": " \t a b \n "})
case("startswith", "{{ s.startswith('<tool') }} {{ s.endswith('>') }} {{ s.startswith(('x', '<t')) }} "
     "{{ s.endswith('nse>') }} {{ s.startswith('') }} {{ s.startswith('tool', 1) }}",
     {"s": "<tool_response>"})
case("find", "{{ s.find('l') }} {{ s.rfind('l') }} {{ s.find('z') }} {{ s.index('o') }} {{ s.count('l') }} "
     "{{ s.find('l', 4) }} {{ 'aaa'.count('a') }} {{ 'aaa'.count('') }} {{ 'é✓é'.find('é', 1) }}",
     {"s": "hello world"})
case("index_error", "{{ 'abc'.index('z') }}")
case("replace_method", "{{ s.replace('l', 'L') }} {{ s.replace('l', 'L', 1) }} {{ 'ab'.replace('', '-') }} "
     "{{ s.replace('xyz', 'q') }}", {"s": "hello"})
case("case_methods", "{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.capitalize() }} {{ s.swapcase() }} "
     "{{ \"they're bill's\".title() }} {{ 'ǆemal'.title() }} {{ 'straße'.upper() }} {{ 'ΣΑΣ'.lower() }} "
     "{{ 'İ'.lower()|length }}", {"s": "hELLo wORLD-x_y 3rd"})
case("join_method", "{{ ', '.join(['a', 'b']) }} {{ ''.join('abc') }} {{ '-'.join(d) }}", {"d": {"x": 1, "y": 2}})
case("join_method_error", "{{ ', '.join([1, 2]) }}")
case("pad_methods", "[{{ 'ab'.center(7) }}][{{ 'ab'.center(7, '*') }}][{{ 'abc'.center(6) }}][{{ 'a'.ljust(3) }}]"
     "[{{ 'a'.rjust(3, '0') }}][{{ '42'.zfill(5) }}][{{ '-42'.zfill(5) }}][{{ 'abc'.center(2) }}]")
case("partition", "{{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'abc'.partition('x') }}")
case("splitlines", "{{ 'a\\nb\\r\\nc\\rd\\n'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ ''.splitlines() }}")
case("is_methods", "{{ '123'.isdigit() }} {{ '12a'.isdigit() }} {{ 'abc'.isalpha() }} {{ ' \\t'.isspace() }} "
     "{{ ''.isspace() }} {{ 'abc'.islower() }} {{ 'ABC1'.isupper() }} {{ 'a1'.isalnum() }} {{ 'Ab Cd'.istitle() }} "
     "{{ '١٢'.isdigit() }}")
case("remove_affix", "{{ 'prefix-x'.removeprefix('prefix-') }} {{ 'x.txt'.removesuffix('.txt') }} {{ 'ab'.removeprefix('z') }}")
case("format_method", "{{ '{} and {}'.format('a', 1) }}|{{ '{1}{0}'.format('a', 'b') }}|{{ '{x}!'.format(x=3) }}|"
     "{{ '{:>5}|{:<5}|{:^5}'.format('a', 'b', 'c') }}|{{ '{:.2f}'.format(3.14159) }}|{{ '{:05d}'.format(42) }}|"
     "{{ '{!r}'.format('q') }}|{{ '{{}}{}'.format(1) }}|{{ '{:,}'.format(1234567) }}|{{ '{0[a]}'.format({'a': 9}) }}|"
     "{{ '{:x}'.format(255) }}|{{ '{:e}'.format(12345.6789) }}|{{ '{}'.format(1.0) }}|{{ '{:.3}'.format(2.0) }}|"
     "{{ '{:+d}'.format(5) }}|{{ '{:*^9}'.format('mid') }}|{{ '{:%}'.format(0.25) }}")
case("format_nested_spec", "{{ '{:{}}'.format('a', 5) }}|{{ '{:{}{}}'.format(3, '>', 6) }}|{{ '{0:{1}}'.format('b', 4) }}")
case("format_nested_too_deep", "{{ '{:{:{}}}'.format('a', 5, 1) }}")
case("format_auto_then_manual", "{{ '{}{0}'.format(1) }}")
case("empty_repeat_huge", "[{{ '' * 100000000000 }}{{ () * 10 ** 15 }}{{ [] * 1000000000000 }}]")
case("dict_methods", "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys() }} {{ d.values() }} "
     "{{ d.items() }} {{ d.items()|list }} {{ d.keys()|length }} {{ d.copy() }}", {"d": {"a": 1, "b": [2]}})
case("list_methods", "{{ l.index(2) }} {{ l.count(1) }} {{ l.copy() }}", {"l": [1, 2, 1]})
case("list_append_unsafe", "{% set l = [1] %}{{ l.append(2) }}")
case("list_pop_unsafe", "{% set l = [1] %}{{ l.pop() }}")
case("dict_update_unsafe", "{% set d = {} %}{{ d.update({'a': 1}) }}")
case("unsafe_attr_print", "[{{ l.append }}]", {"l": [1]})
case("str_method_on_non_str_error", "{{ x.startswith('a') }}", {"x": 5})

# --- filters
case("f_tojson", "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ [] |tojson(indent=2) }}|{{ {}|tojson(indent=2) }}|"
     "{{ d|tojson(sort_keys=true) }}|{{ d|tojson(separators=(',', ':')) }}|{{ d|tojson(indent=1, separators=(', ', ': ')) }}",
     {"d": {"z": 1, "a": [1, 2.5, None, True, False, {"k": "v"}], "s": "é\"\\\n</tag>\u2028\x01\x7f", "e": {}, "f": []}})
case("f_tojson_unicode", "{{ s|tojson }} {{ s|tojson(ensure_ascii=true) }}", {"s": "日本 🎉 é"})
case("f_tojson_floats", "{{ [1.0, 0.1, 1e16, 1e-7, -0.0, 3.0e20, 12.5]|tojson }}")
case("f_tojson_nested", "{{ d|tojson(indent=4) }}",
     {"d": {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
         "a": {"type": "string", "enum": ["x", "y"]}, "b": {"type": "array", "items": {}}}, "required": ["a"]}}}})
case("f_tojson_indent_str", "{{ [1, [2]]|tojson(indent='\\t') }}|{{ [1]|tojson(indent=0) }}")
case("f_tojson_tuple_keys", "{{ {1: 'a', true: 'b', none: 'c', 2.5: 'd'}|tojson }}")
case("f_tojson_markup", "{{ ('<x>'|safe)|tojson }} {{ (1, 2)|tojson }}")
case("f_tojson_generator_error", "{{ [1]|select|tojson }}")
case("f_trim", "[{{ '  a b  '|trim }}][{{ 'xxaxx'|trim('x') }}][{{ 5|trim }}][{{ '\\n\\t a\\n'|trim }}]")
case("f_length", "{{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|length }} {{ ''|count }} {{ (1,)|length }}")
case("f_length_int_error", "{{ 5|length }}")
case("f_length_generator_error", "{{ [1]|select|length }}")
case("f_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} "
     "[{{ []|first }}][{{ []|last }}] {{ {'a': 1, 'b': 2}|first }} {{ {'a': 1, 'b': 2}|last }}")
case("f_join", "{{ [1, 2, 3]|join }} {{ [1, 2, 3]|join(', ') }} {{ ['a', none, u]|join('-') }} "
     "{{ users|join(', ', attribute='name') }} {{ 'abc'|join('.') }}",
     {"users": [{"name": "a"}, {"name": "b"}]})
case("f_case", "{{ 'hello WORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hello world'|capitalize }} "
     "{{ 'hELLO wORLD foo-bar (x)y [z]'|title }} {{ \"it's a-b\"|title }} {{ 5|upper }}")
case("f_replace", "{{ 'hello'|replace('l', 'L') }} {{ 'hello'|replace('l', 'L', 1) }} {{ 1231|replace(1, 9) }}")
case("f_string", "{{ 5|string }} {{ none|string }} {{ [1]|string }} {{ (1|string) ~ 'x' }}")
case("f_int", "{{ '42'|int }} {{ '42.7'|int }} {{ 3.99|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(base=16) }} "
     "{{ ' 12 '|int }} {{ '1_000'|int }} {{ true|int }} {{ none|int }} {{ '-5'|int }} {{ '1e3'|int }} {{ '+3'|int }}")
case("f_float", "{{ '4.5'|float }} {{ 3|float }} {{ 'x'|float }} {{ 'x'|float(1.5) }} {{ ' 1e3 '|float }} "
     "{{ 'inf'|float }} {{ '-nan'|float }} {{ none|float }} {{ '1_0.5'|float }}")
case("f_list", "{{ 'abc'|list }} {{ {'a': 1, 'b': 2}|list }} {{ (1, 2)|list }} {{ u|list }} {{ range(3)|list }}")
case("f_items", "{% for k, v in d|items %}{{ k }}={{ v }};{% endfor %}|{{ d|items|list }}|{{ u|items|list }}",
     {"d": {"b": 1, "a": 2}})
case("f_items_error", "{{ [1]|items|list }}")
case("f_map", "{{ users|map(attribute='name')|list }} {{ users|map(attribute='age', default=0)|list }} "
     "{{ ['a', 'b']|map('upper')|list }} {{ [1.5, 2.5]|map('int')|join(',') }} {{ [' a ']|map('trim')|list }} "
     "{{ users|map(attribute='name')|join('/') }} {{ [[1, 2]]|map(attribute='1')|list }}",
     {"users": [{"name": "x", "age": 3}, {"name": "y"}]})
case("f_select", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} "
     "{{ [0, 1, '', 'a', none]|select|list }} {{ [1, 5, 10]|select('gt', 3)|list }} "
     "{{ [1, 5, 10]|select('>', 3)|list }} {{ ['a', 'b']|select('in', 'abc')|list }} "
     "{{ [1, 2, 3]|select('divisibleby', 3)|list }} {{ [1, 'a', none]|select('string')|list }}")
case("f_selectattr", "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} "
     "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ msgs|selectattr('tool')|list|length }} "
     "{{ msgs|selectattr('x', 'defined')|list }} {{ msgs|selectattr('role', 'in', ['system'])|list }}",
     {"msgs": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1", "tool": True},
               {"role": "user", "content": "u2"}]})
case("f_select_generator_truthy", "{% if [1]|select('even') %}truthy{% endif %}|{{ ([]|select)|list }}")
case("f_select_generator_once", "{% set g = [1, 2]|select %}{{ g|list }}{{ g|list }}")
case("f_select_unknown_test", "{{ [1]|select('nope')|list }}")
case("f_unique", "{{ [1, 2, 1, 3, 2]|unique|list }} {{ ['a', 'A', 'b']|unique|list }} "
     "{{ ['a', 'A', 'b']|unique(case_sensitive=true)|list }} {{ users|unique(attribute='n')|list }}",
     {"users": [{"n": 1}, {"n": 1, "x": 2}, {"n": 2}]})
case("f_sort", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a', 'C']|sort(case_sensitive=true) }} "
     "{{ [3, 1, 2]|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='n')|list }} "
     "{{ users|sort(attribute='n,age')|map(attribute='age')|list }} {{ [1.5, 1, true, 0]|sort }} {{ [[2, 1], [1, 2]]|sort }}",
     {"users": [{"n": "b", "age": 3}, {"n": "a", "age": 5}, {"n": "b", "age": 1}]})
case("f_sort_stable", "{{ items|sort(attribute='k')|map(attribute='i')|list }}",
     {"items": [{"k": 1, "i": 0}, {"k": 0, "i": 1}, {"k": 1, "i": 2}, {"k": 0, "i": 3}]})
case("f_sort_mixed_error", "{{ [1, 'a']|sort }}")
case("f_dictsort", "{{ d|dictsort }} {{ d|dictsort(by='value') }} {{ d|dictsort(reverse=true) }} {{ d|dictsort(true) }}",
     {"d": {"b": 2, "A": 3, "a": 1}})
case("f_reverse", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }} {{ (1, 2)|reverse|list }} {{ 'héllo'|reverse }}")
case("f_round", "{{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 42.55|round(1, 'floor') }} "
     "{{ 42.51|round(1, 'ceil') }} {{ 42|round }} {{ 42|round(1, 'floor') }} {{ -2.5|round }} {{ 1234.5|round(-2) }} "
     "{{ 0.125|round(2) }} {{ 1.0|round }} {{ 1e20|round(2) }}")
case("f_abs", "{{ -5|abs }} {{ (-5)|abs }} {{ -2.5|abs }} {{ 3|abs }} {{ true|abs }}")
case("f_abs_neg_filter_binding", "{{ -3|abs }} {{ -(3|abs) }}")
case("f_wordcount", "{{ 'hello world  foo-bar_baz 3.14'|wordcount }} {{ ''|wordcount }} {{ 'héllo wörld'|wordcount }}")
case("f_indent", "[{{ 'a\\nb\\n\\nc'|indent }}][{{ 'a\\nb'|indent(2, true) }}][{{ 'a\\n\\nb'|indent(2, blank=true) }}]"
     "[{{ 'a\\nb\\n'|indent('> ') }}][{{ 'x'|indent(first=true) }}][{{ ''|indent }}]")
case("f_center", "[{{ 'ab'|center(6) }}][{{ 'abc'|center(8) }}][{{ 'abc'|center }}]")
case("f_truncate", "{{ 'hello world foo bar'|truncate(11) }}|{{ 'hello world foo bar'|truncate(11, true) }}|"
     "{{ 'hello world foo bar'|truncate(11, false, '>>', 0) }}|{{ 'short'|truncate(3) }}|{{ 'abcdefghijklmnop'|truncate(10, leeway=0) }}")
case("f_escape", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ ('<b>'|safe)|e }} {{ '<b>'|forceescape }} {{ 5|e }}")
case("f_safe", "{{ '<b>'|safe }} {{ ('<b>'|safe) is escaped }} {{ '<b>' is escaped }}")
case("f_sum", "{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ users|sum(attribute='a') }} {{ [1, 2]|sum(start=10) }} {{ []|sum }}",
     {"users": [{"a": 1}, {"a": 4}]})
case("f_min_max", "{{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A', 'c']|min }} {{ ['b', 'A', 'c']|max(case_sensitive=true) }} "
     "{{ users|max(attribute='a') }} [{{ []|max }}]", {"users": [{"a": 1}, {"a": 4}]})
case("f_batch_slice", "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }} "
     "{{ [1, 2, 3, 4, 5]|slice(2)|list }} {{ [1, 2, 3, 4, 5]|slice(3, 0)|list }}")
case("f_format", "{{ '%s-%s'|format('a', 'b') }} {{ '%(x)s'|format(x=1) }} {{ '%d%%'|format(50) }}")
case("f_attr", "{{ d|attr('a') }} [{{ d|attr('zz') }}] {{ (d|attr('items'))()|list }}", {"d": {"a": 1}})
case("f_capitalize", "{{ 'hELLO World'|capitalize }} {{ ''|capitalize }}")
case("f_chain", "{{ '  Hello World  '|trim|lower|replace('world', 'there')|title }}")
case("gen_lazy_errors", "{% set g = 5|select('odd') %}{% set h = none|map('upper') %}{% set i = 5|items %}"
     "{{ g is sequence }}{{ h|list }}{{ 5|batch(2) is iterable }}ok")
case("gen_lazy_error_on_use", "{% set g = 5|select('odd') %}\n{{ g|list }}")
case("undef_int_float_error", "{{ u|int }}")
case("slice_runtime_errors", "{{ x[::-1] }}", {"x": 5})
case("slice_runtime_dict", "{{ d[1:] }}", {"d": {"a": 1}})
case("slice_runtime_bad_bound", "{{ l['a':] }}", {"l": [1]})
case("truncate_non_string", "{{ [1, 2]|truncate(8, true)|sort }}")
case("truncate_int_error", "{{ 5|truncate }}")
case("percent_list_arg", "{{ 'pad' % [1, 2] }}|{{ 'x' % {'a': 1} }}")
case("f_args_kwargs_error", "{{ 'x'|trim(chars='x', other=1) }}")
case("f_unknown_compile", "a\n{{ x|nope }}")
case("f_unknown_in_if_false", "{% if false %}{{ x|nope }}{% endif %}ok")
case("f_unknown_in_if_true", "{% if true %}\n{{ x|nope }}{% endif %}ok")
case("f_unknown_in_condexpr", "{{ x|nope if false else 'fine' }}")
case("f_unknown_in_for_in_if", "{% if false %}{% for a in b %}{{ a|nope }}{% endfor %}{% endif %}")
case("t_unknown_compile", "{{ x is nope }}")
case("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}|{% filter trim|replace('a', 'b') %}  aaa  {% endfilter %}")

# --- tests
case("tests_types", "{% for v in [1, 1.5, 'a', [1], {'a': 1}, none, true, (1,)] %}"
     "{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is mapping }}{{ v is iterable }}"
     "{{ v is sequence }}{{ v is none }}{{ v is boolean }}{{ v is true }}{{ v is false }}{{ v is callable }};{% endfor %}")
case("tests_misc", "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} "
     "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'aB' is lower }} {{ 2 is in [1, 2] }} {{ 1 is eq 1 }} "
     "{{ 1 is ne 1 }} {{ 1 is lt 2 }} {{ 1 is le 1 }} {{ 2 is gt 1 }} {{ 2 is ge 3 }} {{ 1 is equalto 1 }} "
     "{{ 2 is greaterthan 1 }} {{ 1 is lessthan 1 }} {{ none is sameas none }} {{ 1 is sameas 1 }} "
     "{{ x is sameas x }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ 'zz' is filter }} {{ 3.0 is odd }}",
     {"x": [1]})
case("tests_callable", "{% macro m() %}{% endmacro %}{{ m is callable }} {{ range is callable }} {{ 'a'.upper is callable }} "
     "{{ 'a' is callable }} {{ namespace is callable }}")
case("tests_not", "{{ 1 is not string }} {{ 'a' is not string }} {{ not 'a' is string }} {{ u is not defined }}")
case("tests_odd_str_error", "{{ 'a' is odd }}")
case("tests_escaped", "{{ 'a' is escaped }} {{ ('a'|e) is escaped }}")

# --- statements: for
case("for_basic", "{% for x in [1, 2, 3] %}{{ x }}{% endfor %}|{% for c in 'ab' %}{{ c }};{% endfor %}|"
     "{% for k in {'a': 1, 'b': 2} %}{{ k }}{% endfor %}|{% for x in (1, 2) %}{{ x }}{% endfor %}")
case("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
     "{{ loop.first }}{{ loop.last }}{{ loop.length }}[{{ loop.previtem }}][{{ loop.nextitem }}]{{ loop.depth }}{{ loop.depth0 }};{% endfor %}")
case("for_loop_cycle_changed", "{% for x in [1, 1, 2, 3, 3] %}{{ loop.cycle('a', 'b', 'c') }}{{ loop.changed(x) }};{% endfor %}")
case("for_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %}|"
     "{% for (a, b), c in [((1, 2), 3)] %}{{ a }}{{ b }}{{ c }}{% endfor %}|{% for a, b in ['xy'] %}{{ b }}{{ a }}{% endfor %}",
     {"d": {"x": 1, "y": 2}})
case("for_unpack_error", "{% for a, b in [[1, 2, 3]] %}{% endfor %}")
case("for_unpack_error2", "{% for a, b in [[1]] %}{% endfor %}")
case("for_else", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1] %}x{% else %}empty{% endfor %}|"
     "{% for x in [1, 2] if x > 5 %}x{% else %}filtered{% endfor %}")
case("for_filter", "{% for x in range(10) if x is odd %}{{ x }}/{{ loop.index }}/{{ loop.length }}"
     "{% if not loop.last %},{% endif %}{% endfor %}")
case("for_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}"
     "{{ x }}{% endfor %}|{% for x in [1, 2] %}{% for y in [1, 2] %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }}{% endfor %}{% endfor %}")
case("for_break_outside", "{% break %}")
case("for_continue_in_macro_in_loop", "{% for x in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}")
case("for_break_in_else", "{% for x in [] %}{% else %}{% break %}{% endfor %}")
case("for_scope", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}")
case("for_scope_fresh_iteration", "{% for i in [1, 2] %}{% if loop.first %}{% set y = 5 %}{% endif %}[{{ y }}]{% endfor %}[{{ y }}]")
case("for_target_restored", "{% set x = 'outer' %}{% for x in [1, 2] %}{{ x }}{% endfor %}{{ x }}")
case("for_nested_loop_var", "{% for a in [1, 2] %}{% for b in [1, 2] %}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}")
case("for_outer_loop_ref", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in 'xy' %}{{ outer.index }}{{ loop.index }} {% endfor %}{% endfor %}")
case("for_recursive", "{% for item in tree recursive %}<{{ item.n }}{% if item.c %}{{ loop(item.c) }}{% endif %}:{{ loop.depth }}>{% endfor %}",
     {"tree": [{"n": "a", "c": [{"n": "b", "c": [{"n": "c"}]}, {"n": "d"}]}, {"n": "e"}]})
case("for_not_iterable", "{% for x in 5 %}{% endfor %}")
case("for_none_iterable", "{% for x in none %}{% endfor %}")
case("for_over_dict_values", "{% for v in d.values() %}{{ v }}{% endfor %}", {"d": {"a": 1, "b": 2}})
case("for_tuple_expr", "{% for x in 1, 2, 3 %}{{ x }}{% endfor %}")
case("for_loop_in_filter_test", "{% for x in [1, 2, 3] if x != 2 %}{{ x }}{% endfor %}")
case("for_range", "{{ range(5)|list }} {{ range(2, 5)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }} {{ range(3) }} {{ range(1, 10, 2) }}")
case("range_too_big", "{{ range(100001)|length }}")
case("range_step_zero", "{{ range(1, 2, 0) }}")
case("loop_undefined_outside", "[{{ loop }}]{{ loop is defined }}")

# --- set, namespace, scoping
case("set_basic", "{% set x = 5 %}{{ x }}{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, %}{{ t }}")
case("set_in_if_leaks", "{% if true %}{% set x = 1 %}{% endif %}{{ x }}")
case("set_block", "{% set x %}hello {{ 'w' }}{% endset %}[{{ x }}]{% set y | upper %}abc{% endset %}{{ y }}"
     "{% set z %}{% set inner = 1 %}q{% endset %}[{{ inner }}]")
case("set_block_trim", "{% set x -%}\n  hi  \n{%- endset %}[{{ x }}]")
case("namespace", "{% set ns = namespace(count=0, items=[]) %}{% for i in range(3) %}{% set ns.count = ns.count + i %}"
     "{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.count }} {{ ns.items }} {{ ns }}")
case("namespace_from_dict", "{% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns.b }}")
case("namespace_set_non_ns", "{% set x = 1 %}{% set x.y = 2 %}")
case("namespace_block_set", "{% set ns = namespace() %}{% set ns.v %}block{% endset %}{{ ns.v }}")
case("dict_global", "{{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ dict({'k': 'v'}, z=0) }}")
case("with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]{% set x = 5 %}{% with x = x + 1 %}{{ x }}{% endwith %}{{ x }}")
case("scope_macro_sees_later_set", "{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% set x = 1 %}{{ m() }}")
case("scope_macro_local_set", "{% set x = 1 %}{% macro m() %}{{ x }}{% set x = 2 %}{{ x }}{% endmacro %}{{ m() }}{{ x }}")
case("scope_loop_in_macro", "{% macro m(l) %}{% for i in l %}{{ i }}{% endfor %}{% endmacro %}{% for j in [1] %}{{ m([7, 8]) }}{{ j }}{% endfor %}")

# jinja2's static frame locals: a name first assigned (unconditionally) in a frame hides the
# context value there and in nested frames until the assignment runs
case("scope_frame_00", '{{ s }}{% set s = "late" %}{{ s }}', {"s": "ctx"})
case("scope_frame_01", '{% for i in [1] %}[{{ s }}]{% endfor %}{% set s = "late" %}{{ s }}', {"s": "ctx"})
case("scope_frame_02", '{% if true %}[{{ s }}]{% endif %}{% set s = "late" %}{{ s }}', {"s": "ctx"})
case("scope_frame_03", '{% for i in [1] %}{% for j in [1] %}[{{ s }}]{% endfor %}{% endfor %}{% set s = "late" %}', {"s": "ctx"})
case("scope_frame_04", '{% for i in [1] %}[{{ s }}]{% set s = "in" %}[{{ s }}]{% endfor %}[{{ s }}]', {"s": "ctx"})
case("scope_frame_05", '{% for i in [1] %}{% for x in s %}{{ x }}{% set s = 1 %}{% endfor %}{% endfor %}', {"s": "ctx"})
case("scope_frame_06", '{% for i in [1] %}{% for x in s %}{{ x }}{% endfor %}{% set s = 1 %}{% endfor %}', {"s": "ctx"})
case("scope_frame_07", '{% macro m() %}[{{ s }}]{% endmacro %}{{ m() }}{% set s = "late" %}{{ m() }}', {"s": "ctx"})
case("scope_frame_08", '{% macro m() %}[{{ s }}]{% set s = 1 %}{% endmacro %}{{ m() }}', {"s": "ctx"})
case("scope_frame_09", '{% for i in [1,2] %}[{{ s }}]{% if i == 1 %}{% set s = "one" %}{% endif %}{% endfor %}', {"s": "ctx"})
case("scope_frame_10", '{% with %}[{{ s }}]{% set s = 2 %}{% endwith %}', {"s": "ctx"})
case("scope_frame_11", '{% set x = s %}{% for i in [1] %}{% set s = 1 %}{% endfor %}[{{ x }}][{{ s }}]', {"s": "ctx"})
case("scope_frame_12", '{% if a %}{% set s = 1 %}{% else %}{% set s = 2 %}{% endif %}{% for i in [1] %}[{{ s }}]{% endfor %}', {"s": "ctx"})
case("scope_frame_13", '{% for i in [1] %}[{{ s }}]{% endfor %}{% if a %}{% set s = 1 %}{% elif b %}{% set s = 3 %}{% else %}{% set s = 2 %}{% endif %}', {"s": "ctx"})
case("scope_frame_14", '{% for i in [1] %}[{{ s }}]{% endfor %}{% if a %}{% set s = 1 %}{% elif b %}{% set t = 3 %}{% else %}{% set s = 2 %}{% endif %}', {"s": "ctx"})
case("scope_frame_15", '{% macro m() %}{% for i in [1] %}[{{ s }}]{% endfor %}{% set s = 5 %}[{{ s }}]{% endmacro %}{{ m() }}', {"s": "ctx"})
case("scope_frame_16", '{% set ns = namespace(v=s) %}{% for i in [1] %}{% set ns.v = s %}{% endfor %}{{ ns.v }}{% set s = 3 %}', {"s": "ctx"})
case("scope_frame_17", '{% for i in [1] %}{% set s %}x{{ s }}{% endset %}{{ s }}{% endfor %}', {"s": "ctx"})
case("scope_frame_18", '{% set s %}[{{ s }}]{% endset %}{{ s }}', {"s": "ctx"})
case("scope_frame_19", '{% for s in [1] %}{% endfor %}{{ s }}', {"s": "ctx"})
case("scope_frame_20", '{% for m in messages %}{{ s }}{% endfor %}{% set s, t = 1, 2 %}', {"s": "ctx", "messages": [1]})
case("scope_frame_21", "{% filter upper %}{{ s }}{% set s = 'q' %}{% endfilter %}{% for i in [1] %}{{ s }}{% endfor %}{% set s = 'z' %}", {"s": "ctx"})

# --- macros
case("macro_basic", "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}"
     "{{ greet('A') }} {{ greet('B', 'Yo') }} {{ greet(greeting='Hey', name='C') }} {{ greet(name='D') }}")
case("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}")
case("macro_missing_arg_use", "{% macro m(a) %}{{ a + 1 }}{% endmacro %}{{ m() }}")
case("macro_too_many", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}")
case("macro_bad_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}")
case("macro_dup_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(1, a=2) }}")
case("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}")
case("macro_default_refs_arg", "{% macro m(a, b=a * 2) %}{{ a }},{{ b }}{% endmacro %}{{ m(3) }} {{ m(3, 1) }}")
case("macro_default_evaluated_each_call", "{% set ns = namespace(n=0) %}{% macro m(x=ns.n) %}{{ x }}{% endmacro %}"
     "{{ m() }}{% set ns.n = 5 %}{{ m() }}")
case("macro_return_is_string", "{% macro m() %}  x  {% endmacro %}[{{ m()|trim }}]{{ m()|length }}{{ m() is string }}")
case("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * (fact(n - 1)|int) }}{% endif %}{% endmacro %}{{ fact(10) }}")
case("macro_nested_def", "{% macro outer() %}{% macro inner(x) %}<{{ x }}>{% endmacro %}{{ inner(1) }}{{ inner(2) }}{% endmacro %}{{ outer() }}")
case("macro_namespace_mutation", "{% set ns = namespace(v=0) %}{% macro bump() %}{% set ns.v = ns.v + 1 %}{% endmacro %}"
     "{{ bump() }}{{ bump() }}{{ ns.v }}")
case("macro_call_kwargs_splat", "{% macro m(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ m(*[1, 2]) }}{{ m(**{'a': 3, 'b': 4}) }}")
case("macro_non_default_after_default", "{% macro m(a=1, b) %}{% endmacro %}")
case("macro_print", "{% macro m() %}{% endmacro %}{{ m }}")
case("macro_infinite", "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}")
case("call_non_callable", "{{ 'abc'() }}")
case("call_int", "{% set x = 5 %}{{ x() }}")

# --- raise_exception and errors with lines
case("raise_exception", "line1\nline2 {{ raise_exception('Boom: ' ~ 42) }}")
case("raise_in_macro", "{% macro check(x) %}\n{% if not x %}\n{{ raise_exception('bad x') }}\n{% endif %}\n{% endmacro %}\n{{ check(1) }}\n{{ check(0) }}")
case("raise_in_loop", "{% for m in msgs %}\n{% if m.role not in ['user', 'assistant'] %}\n{{ raise_exception('Unexpected role: ' + m.role) }}\n{% endif %}\n{% endfor %}",
     {"msgs": [{"role": "user"}, {"role": "robot"}]})
case("syntax_unclosed_if", "a\n{% if x %}\nb")
case("syntax_unclosed_for", "{% for x in y %}")
case("syntax_unknown_tag", "a\n\n{% foo %}")
case("syntax_endfor_alone", "{% endfor %}")
case("syntax_bad_expr", "{{ 1 + }}")
case("syntax_empty_expr", "{{ }}")
case("syntax_unexpected_char", "{{ 1 $ 2 }}")
case("syntax_unclosed_string", "{{ 'abc }}")
case("syntax_unclosed_var", "abc {{ x ")
case("syntax_unclosed_comment", "a {# b")
case("syntax_bad_bracket", "{{ (1] }}")
case("syntax_extra_close", "{{ 1) }}")
case("syntax_multiline_error", "{{\n  1 +\n  }}")
case("syntax_elif_after_else", "{% if a %}{% else %}{% elif b %}{% endif %}")
case("syntax_endif_name_extra", "{% if a %}{% endif junk %}")
case("syntax_set_const", "{% set true = 1 %}")
case("syntax_chained_is", "{{ x is defined is defined }}")
case("syntax_do_tag", "{% do x %}")
case("syntax_include", "{% include 'x.html' %}")
case("syntax_trailing_dot", "{{ a. }}")
case("syntax_bad_escape", "{{ '\\x4' }}")
case("runtime_error_line", "a\nb\nc {{ 1 + 'x' }}")
case("err_line_multiline_print", "{{ 1 +\n'a' }}")
case("err_line_multiline_concat", "{{ x ~\n (1 +\n 'a') }}")
case("err_line_multiline_set", "{% set y = {\n'a': 1,\n'b': 1 + 'x'} %}")
case("err_line_multiline_if", "{% if true and\n 1 + 'a' %}{% endif %}")
case("err_line_print_later_line", "a{{ 1 }}{{\n\n 1+'a' }}")
case("err_line_for_filter", "{% for x in [1,\n2] if x + 'a' %}{% endfor %}")
case("err_line_call_in_loop", "{% for x in [1] %}\n{{ foo(\n1,\nx + \"a\") }}{% endfor %}")
case("err_line_raise_multiline", "{{ raise_exception(\n'x') }}")
case("err_line_in_macro", "{% macro m(a) %}\n{{ a +\n1 }}{% endmacro %}\n{{ m(\n's') }}")
case("err_line_after_macro_call", "{% macro m() %}\n\nok{% endmacro %}\n{{ m() ~ (1 + 'a') }}")
case("err_line_getattr_dot", "{{ x.y\n.z }}")
case("err_line_filter_name", "{{ 1\n|abs(\n2) }}")
case("err_line_elif", "{% if false %}\n{% elif\n 1 + 'a' %}{% endif %}")
case("err_line_compare", "{{ 1 <\n'a'\n }}")
case("runtime_error_line_for", "{% for x in [1, 'a'] %}\n{{ x + 1 }}\n{% endfor %}")

# --- whitespace control, comments, raw
case("ws_trim_blocks", "a\n{% if true %}\nb\n{% endif %}\nc\n")
case("ws_lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc")
case("ws_lstrip_not_var", "a\n    {{ 'x' }}\n")
case("ws_minus", "a  \n  {%- if true -%}  \n  b  \n  {%- endif -%}  \n  c")
case("ws_var_minus", "a  {{- 'x' -}}  b  {{ 'y' -}}\n\n  c {{- 'z' }}")
case("ws_plus", "a\n    {%+ if true %}x{% endif +%}\ny\n  {%+ if 1 -%}  z  {%- endif +%}\n")
case("ws_comment", "a\n  {# comment #}\nb {#- c -#} c\n{#+ d +#}\ne\n  {#- x #}\n")
case("ws_raw", "{% raw %}\n  {{ x }} {% if %}\n  {% endraw %}\nq {%- raw -%}  r  {%- endraw %} s\n  {%+ raw %}t{% endraw %}")
case("ws_trailing_newline_dropped", "abc\n")
case("ws_trailing_two_newlines", "abc\n\n")
case("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\r\n")
case("ws_cr_only", "a\r{{ 'b' }}\rc")
case("ws_unicode_space_minus", "a\u3000\u00a0 {{- 'b' }}")
case("ws_tab_lstrip", "x\n\t \t{% if true %}y{% endif %}")
case("ws_after_var_no_lstrip", "{{ 'a' }}  {% if true %}b{% endif %}")
case("ws_block_after_block", "{% if true %}\n    {% if true %}\n        x\n    {% endif %}\n{% endif %}\n")
case("ws_minus_eats_newlines", "a\n\n\n{%- if true %}b{% endif -%}\n\n\nc")
case("ws_data_only", "   \n  plain text  \n")
case("ws_dict_in_var", "{{ {'a': {'b': 1}} }}|{{ {'a': 1}['a'] }}")
case("ws_block_end_in_string", "{{ '%}' }}{{ '}}' }}{% set x = '%}' %}{{ x }}")
case("comment_multiline", "a{# line1\nline2 #}b\n{# x #}\nc")
case("generation_block", "{% for m in ['a', 'b'] %}{% generation %}<{{ m }}>{% set z = 1 %}{% endgeneration %}{% endfor %}[{{ z }}]")

# --- strftime_now (only shape-independent checks)
case("strftime_literal", "{{ strftime_now('%%') }}|{{ strftime_now('') }}|{{ strftime_now('x') }}")

# --- misc expression forms
case("list_dict_literals", "{{ [1, [2, [3, []]]]|length }} {{ {'a': {'b': [1, {'c': 2}]}}['a']['b'][1].c }} {{ [1, 2, ] }} {{ {'a': 1, } }}")
case("dict_unhashable_key", "{{ {[1]: 2} }}")
case("call_with_trailing_comma", "{{ 'a,b'.split(',', ) }}")
case("attr_on_literal", "{{ 'abc'.upper() }} {{ [1, 2].index(2) }} {{ {'a': 1}.get('a') }}")
case("string_concat_adjacent", "{{ 'a' 'b' \"c\" }}")
case("filter_then_test", "{{ 'abc'|upper is string }} {{ ['a']|first is string }}")
case("test_arg_forms", "{{ 3 is divisibleby 3 }} {{ 3 is divisibleby(3) }} {{ 'a' is in 'abc' }} {{ 'x' is in ['x'] }} "
     "{{ none is sameas none }}")
case("getattr_int_literal_dot", "{{ l.0 }} {{ l.1.0 }}", {"l": [[1], [2, 3]]})
case("neg_filter_precedence", "{{ -1|abs }} {{ -x|abs }} {{ - x ** 2 }}", {"x": 3})
case("compare_with_filter", "{{ msgs|length > 1 }} {{ 'a'|upper == 'A' }}", {"msgs": [1, 2]})
case("nested_ternary_filter", "{{ (x|default('d')) if x is defined else 'u' }} {{ x|default('d') if true else 'n' }}")
case("concat_undefined_attr", "{{ 'a' ~ d.missing ~ 'b' }}", {"d": {}})
case("in_generator", "{{ 2 in [1, 2]|select }}")
case("big_int_literal", "{{ 9223372036854775807 }} {{ -9223372036854775807 }}")
case("string_with_newline_literal", "{{ 'a\nb' }}")
case("whitespace_in_tags", "{{\n  x\n}}{%\nif true\n%}y{%\nendif\n%}", {"x": 1})
case("unicode_identifier", "{% set café = 'c' %}{{ café }}")

# --- realistic chat-template idioms
MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello <b>there</b> & é"},
    {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHi!"},
    {"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image"}]},
]
case("idiom_system_split", "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}"
     "{% set loop_messages = messages[1:] %}{% else %}{% set sys = '' %}{% set loop_messages = messages %}{% endif %}"
     "[{{ sys }}]{% for m in loop_messages %}{{ m.role }}:{{ m.content if m.content is string else m.content|map(attribute='type')|join(',') }};{% endfor %}",
     {"messages": MSGS})
case("idiom_alternation_error", "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% endfor %}",
     {"messages": [{"role": "user"}, {"role": "user"}]})
case("idiom_last_user", "{% set ns = namespace(idx=-1) %}{% for m in messages %}{% if m.role == 'user' %}{% set ns.idx = loop.index0 %}{% endif %}{% endfor %}{{ ns.idx }}",
     {"messages": MSGS})
case("idiom_reversed_loop", "{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}{{ m.role[0] }}{% endfor %}",
     {"messages": MSGS})
case("idiom_tool_args", "{% for k, v in args|items %}<{{ k }}>{{ v|tojson|safe if v is mapping or (v is sequence and v is not string) else v|string }}</{{ k }}>{% endfor %}",
     {"args": {"city": "Paris", "n": 3, "f": 1.5, "opts": {"a": [1, "x"]}, "l": ["é"], "b": True, "z": None}})
case("idiom_think_split", "{% set c = content %}{% if '</think>' in c %}{% set r = c.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
     "{% set c = c.split('</think>')[-1].lstrip('\\n') %}{% endif %}[{{ r }}][{{ c }}]",
     {"content": "<think>\n\nreasoning here\n\n</think>\n\nanswer\n"})
case("idiom_json_tool_list", "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}",
     {"tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather «now»", "parameters":
                {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 1}}, "required": ["city"]}}}]})
case("idiom_bos_eos", "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}",
     {"bos_token": "<s>", "eos_token": "</s>", "messages": [{"content": "a"}, {"content": "b"}]})
case("idiom_content_types", "{% for m in messages %}{% if m.content is string %}S{% elif m.content is iterable and m.content is not mapping %}L{% elif m.content is none %}N{% else %}O{% endif %}{% endfor %}",
     {"messages": [{"content": "x"}, {"content": []}, {"content": None}, {"content": {"a": 1}}, {}]})
case("idiom_is_defined_false", "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}",
     {"enable_thinking": False})
case("idiom_strip_chain", "{{ (x ~ '  ')|trim ~ '|' ~ x.strip('\\n ').upper() }}", {"x": "\n hi \n"})


# ---------------------------------------------------------------------------------------------
# Whitespace-control grid: every sign combination around each tag type, with varied context.

def ws_grid():
    befores = ["", " ", "\n", "  \n  ", "a\n\t ", "x  "]
    afters = ["", "\n", " \n", "\n\n", "x", "  y\n"]
    signs = ["", "-", "+"]
    tags = {
        "block": lambda l, r: "{%" + l + " if true " + r + "%}B{%" + l + " endif " + r + "%}",
        "var": lambda l, r: "{{" + l + " 'V' " + (r if r != "+" else "") + "}}",
        "comment": lambda l, r: "{#" + l + " c " + r + "#}",
        "set": lambda l, r: "{%" + l + " set q = 1 " + r + "%}",
    }
    out = []
    for tname, mk in tags.items():
        for l in signs:
            for r in signs:
                for bi, b in enumerate(befores):
                    for ai, a in enumerate(afters):
                        tpl = "<" + b + mk(l, r) + a + ">"
                        out.append((f"ws_{tname}_{l or 'n'}{r or 'n'}_{bi}{ai}", tpl, {}))
    return out


# ---------------------------------------------------------------------------------------------
# Chat cases with the real templates (what apply_chat_template passes).

QWEN3_CFG = os.path.join(DATA, "tokenizers", "qwen3", "tokenizer_config.json")
QWEN35 = os.path.join(DATA, "templates", "qwen3.5.jinja")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                          "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web — «quoted»",
          "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}}

CONVERSATIONS = [
    ("single", [{"role": "user", "content": "What is 2+2?"}], None, {}),
    ("system", [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}], None, {}),
    ("no_gen", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}], None, {"add_generation_prompt": False}),
    ("think_off", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": False}),
    ("think_on", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": True}),
    ("multi_think", [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "<think>\nGreeting.\n</think>\n\nHello!"},
                     {"role": "user", "content": "Again"}, {"role": "assistant", "content": "<think>r2</think>Sure"},
                     {"role": "user", "content": "Bye"}], None, {}),
    ("reasoning_field", [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "reasoning_content": "because"},
                         {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2", "reasoning_content": "\nr2\n"}], None,
     {"add_generation_prompt": False}),
    ("tools_call", [{"role": "system", "content": "Sys prompt."}, {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
                    {"role": "tool", "content": "{\"temp\": 21}"}, {"role": "assistant", "content": "It is 21C."},
                    {"role": "user", "content": "Thanks"}], [WEATHER, SEARCH], {}),
    ("tools_multi_calls", [{"role": "user", "content": "Do both"},
                           {"role": "assistant", "content": "Calling tools.", "tool_calls": [
                               {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                               {"type": "function", "function": {"name": "search", "arguments": {"q": "news", "n": 3, "opts": {"lang": ["en", "fr"]}, "x": None}}}]},
                           {"role": "tool", "content": "sunny"}, {"role": "tool", "content": "results"}], [WEATHER, SEARCH], {}),
    ("tools_string_args", [{"role": "user", "content": "Go"},
                           {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\": \"x\"}"}}]},
                           {"role": "tool", "content": "ok"}], [SEARCH], {}),
    ("tools_no_function_wrapper", [{"role": "user", "content": "Go"},
                                   {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"q": "y"}}]}], [SEARCH],
     {"add_generation_prompt": False}),
    ("tools_empty_list", [{"role": "user", "content": "Hi"}], [], {}),
    ("multimodal", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}, {"type": "video"}]},
                    {"role": "assistant", "content": "A cat."},
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "And this?"}]}], None, {}),
    ("multimodal_ids", [{"role": "user", "content": [{"type": "image"}, {"type": "image"}, {"type": "text", "text": "Compare"}]}], None,
     {"add_vision_id": True}),
    ("unicode", [{"role": "system", "content": "Réponds en français — «oui»."}, {"role": "user", "content": "日本語 🎉 \u2028 tab\there"}], None, {}),
    ("empty_content", [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}, {"role": "user", "content": "x"}], None, {}),
    ("tool_response_user", [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"}, {"role": "user", "content": "real"}], None, {}),
    ("only_tool_responses", [{"role": "user", "content": "<tool_response>a</tool_response>"}], None, {}),
    ("system_late", [{"role": "user", "content": "a"}, {"role": "system", "content": "late"}], None, {}),
    ("bad_role", [{"role": "robot", "content": "beep"}, {"role": "user", "content": "x"}], None, {}),
    ("no_messages", [], None, {}),
    ("system_image", [{"role": "system", "content": [{"type": "image"}]}, {"role": "user", "content": "x"}], None, {}),
    ("bad_item", [{"role": "user", "content": [{"type": "audio"}]}], None, {}),
    ("content_dict", [{"role": "user", "content": {"a": 1}}], None, {}),
    ("extra_kwargs", [{"role": "user", "content": "x"}], None, {"custom_flag": True, "enable_thinking": False}),
]


def load_qwen3():
    with open(QWEN3_CFG, encoding="utf-8") as f:
        cfg = json.load(f)
    special = {}
    for k in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"]:
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            special[k] = v
    if isinstance(cfg.get("additional_special_tokens"), list):
        special["additional_special_tokens"] = [t if isinstance(t, str) else t["content"] for t in cfg["additional_special_tokens"]]
    return cfg["chat_template"], special


def chat_cases():
    out = []
    q3_src, q3_special = load_qwen3()
    with open(QWEN35, encoding="utf-8") as f:
        q35_src = f.read()
    for tname, src, special, where in [("qwen3", q3_src, q3_special, "tokenizers/qwen3"),
                                       ("qwen35", q35_src, {}, "templates/qwen3.5.jinja")]:
        for cname, msgs, tools, kwargs in CONVERSATIONS:
            ctx = dict(special)
            ctx.update(kwargs)
            ctx.update({"messages": msgs, "tools": tools, "documents": None,
                        "add_generation_prompt": kwargs.get("add_generation_prompt", True)})
            res = render(src, ctx)
            entry = {"name": f"chat_{tname}_{cname}", "chat": True, "source": where,
                     "messages": msgs, "tools": tools,
                     "kwargs": dict(kwargs, add_generation_prompt=kwargs.get("add_generation_prompt", True))}
            entry.update(res)
            out.append(entry)
    return out


def cli_files():
    """Request files and expected outputs for tests/template_cli_test.sh."""
    d = os.path.join(HERE, "cli")
    os.makedirs(d, exist_ok=True)

    def put(name, text):
        with open(os.path.join(d, name), "w", encoding="utf-8", newline="") as f:
            f.write(text)

    def request(messages, tools, kwargs):
        req = {"messages": messages}
        if tools is not None:
            req["tools"] = tools
        req.update(kwargs)
        return json.dumps(req, ensure_ascii=False, indent=1) + "\n"

    with open(os.path.join(DATA, "chat-qwen3.5-A.json"), encoding="utf-8") as f:
        q35 = json.load(f)
    for c in q35["cases"]:
        if c["name"] not in ("tool_call", "plain", "nothink", "no_gen_prompt"):
            continue
        kw = {"add_generation_prompt": True}
        kw.update(c.get("kwargs") or {})
        put(f"qwen35-{c['name']}.request.json", request(c["messages"], c["tools"], kw))
        put(f"qwen35-{c['name']}.expected", c["rendered"])
    with open(os.path.join(DATA, "chat-A.json"), encoding="utf-8") as f:
        qa = json.load(f)
    for c in qa["cases"]:
        if c["name"] not in ("tools", "system"):
            continue
        kw = {"add_generation_prompt": True}
        if c.get("enable_thinking") is not None:
            kw["enable_thinking"] = c["enable_thinking"]
        put(f"qwen3-{c['name']}.request.json", request(c["messages"], c["tools"], kw))
        put(f"qwen3-{c['name']}.expected", c["rendered"])
    put("bad-json.request.json", '{"messages": [{"role": "user", "content": "hi"}\n')
    put("no-messages.request.json", '{"prompt": "hi"}\n')
    put("empty-messages.request.json", '{"messages": [], "add_generation_prompt": true}\n')


def main():
    cli_files()
    cases = []
    names = set()
    for name, tpl, ctx in CASES + ws_grid():
        assert name not in names, name
        names.add(name)
        entry = {"name": name, "template": tpl, "context": ctx}
        entry.update(render(tpl, ctx))
        cases.append(entry)
    cases.extend(chat_cases())
    path = os.path.join(HERE, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"generator": "tests/data/template-cases/gen.py", "jinja2": jinja2.__version__,
                   "cases": cases}, f, ensure_ascii=False, indent=1)
        f.write("\n")
    nerr = sum(1 for c in cases if "error" in c)
    print(f"wrote {len(cases)} cases ({nerr} errors) to {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
