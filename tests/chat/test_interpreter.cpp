// The interpreter's features one at a time, with what Python's jinja2 renders in Hugging Face's
// environment (trim_blocks, lstrip_blocks), and its errors naming template and line.
#include <gtest/gtest.h>

#include "specdec/chat_template.h"

namespace {

std::string render(const std::string& source, nlohmann::ordered_json vars = nlohmann::ordered_json::object()) {
  specdec::ChatRenderOptions o;
  o.extra = std::move(vars);
  return specdec::ChatTemplate::from_source(source, "t").render(nlohmann::ordered_json::array(), o);
}

TEST(ChatInterpreter, ExpressionsFollowPython) {
  EXPECT_EQ(render("{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} {{ 1e-05 * 1 }}"),
            "3 -4 -2 3.5 1024 1.0 1e-05");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ none }} {{ 'b' if x else 'c' }} {{ [1, 2] + [3] }} {{ {'k': true} }}"),
            "a1None c [1, 2, 3] {'k': True}");
  EXPECT_EQ(render("{{ 'abcdef'[1:-1] }} {{ 'abcdef'[::-2] }} {{ [1,2,3,4][-2:] }} {{ 'héllo'[1] }}"),
            "bcde fdb [3, 4] é");
  EXPECT_EQ(render("{{ 'x' in 'xyz' }} {{ 2 not in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 1 == 1.0 }}"),
            "True False True True");
}

TEST(ChatInterpreter, UndefinedIsEmptyAndFalsyButFailsWhenUsed) {
  EXPECT_EQ(render("[{{ nothing }}]{% if not nothing %}falsy{% endif %}{{ nothing | length }}"), "[]falsy0");
  EXPECT_EQ(render("{{ {'a': 1}.b is defined }}"), "False");
  EXPECT_THROW(render("{{ nothing.attr }}"), std::runtime_error);
  EXPECT_THROW(render("{{ 'x' + nothing }}"), std::runtime_error);
}

TEST(ChatInterpreter, LoopsScopesAndNamespaces) {
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.index }}/{{ loop.length }}:{{ x }}"
                   "{% if loop.last %}.{% endif %}{% endfor %}"),
            "1/2:22/2:4.");
  EXPECT_EQ(render("{% for x in [] %}a{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% set n = 1 %}{% for x in [1] %}{% set n = 2 %}{% endfor %}{{ n }}"), "1");
  EXPECT_EQ(render("{% set ns = namespace(n=1) %}{% for x in [1] %}{% set ns.n = 2 %}{% endfor %}{{ ns.n }}"), "2");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}"), "a=1;b=2;");
  EXPECT_EQ(render("{% for x in range(5) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}"
                   "{% endif %}{{ x }}{% endfor %}"),
            "02");
}

TEST(ChatInterpreter, MacrosSetBlocksAndFilterBlocks) {
  EXPECT_EQ(render("{% macro m(a, b='B') %}<{{ a }}{{ b }}>{% endmacro %}{{ m(1) }}{{ m(1, b=2) }}"), "<1B><12>");
  EXPECT_EQ(render("{% set s %} x {% endset %}[{{ s }}]{% filter upper %}abc{% endfilter %}"), "[ x ]ABC");
}

TEST(ChatInterpreter, FiltersAndMethods) {
  EXPECT_EQ(render("{{ {'a': [1, 'é'], 'b': none} | tojson }}"), R"({"a": [1, "é"], "b": null})");
  EXPECT_EQ(render("{{ {'a': [1]} | tojson(indent=2) }}"), "{\n  \"a\": [\n    1\n  ]\n}");
  EXPECT_EQ(render("{{ [3, 1, 2] | sort | join(',') }} {{ [1, 1, 2] | unique | list }} {{ 'a b' | upper }}"),
            "1,2,3 [1, 2] A B");
  EXPECT_EQ(render("{{ [{'t': 'x'}, {'t': 'y'}] | selectattr('t', 'equalto', 'y') | map(attribute='t') | list }}"),
            "['y']");
  EXPECT_EQ(render("{{ '  a,b  '.strip().split(',') }} {{ 'xxhixx'.strip('x') }} {{ 'ab'.startswith(('x', 'a')) }}"),
            "['a', 'b'] hi True");
  EXPECT_EQ(render("{{ d.get('k', 5) }} {{ x | default('dflt') }} {{ '' | default('e', true) }}",
                   {{"d", nlohmann::ordered_json::object()}}),
            "5 dflt e");
}

TEST(ChatInterpreter, WhitespaceControlAsHuggingFace) {
  // trim_blocks drops the newline after a block tag; lstrip_blocks the indentation before it.
  EXPECT_EQ(render("a\n  {% if true %}\nb\n  {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(render("a  {{- ' b ' -}}  c"), "a b c");
  EXPECT_EQ(render("{# note #}\nx"), "x");
}

TEST(ChatInterpreter, ErrorsNameTemplateAndLine) {
  auto message = [](const std::string& source) {
    try {
      render(source);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message("\n\n{{ raise_exception('no system role') }}"), "template t line 3: TemplateError: no system role");
  EXPECT_EQ(message("a\n{{ x | nosuchfilter }}"), "template t line 2: no filter named 'nosuchfilter'");
  EXPECT_NE(message("{% if x %}").find("template t line 1: syntax error: missing "), std::string::npos);
  EXPECT_NE(message("{{ (1 + }}").find("template t line 1: syntax error"), std::string::npos);
}

}  // namespace

namespace {

// The error a template's render throws, or "" when it renders.
std::string error_of(const std::string& source) {
  try {
    render(source);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

std::string repeated(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

}  // namespace

TEST(ChatInterpreter, DepthIsBoundedWithAClearError) {
  // A macro may call itself, as templates that render nested tool schemas do...
  EXPECT_EQ(render("{% macro down(n) %}{{ n }}{% if n > 0 %}{{ down(n - 1) }}{% endif %}{% endmacro %}{{ down(5) }}"),
            "543210");
  // ...but one that never stops fails the render with an error, instead of exhausting the stack.
  EXPECT_NE(error_of("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}").find("macro 'f' called 64 levels deep"),
            std::string::npos);
  // Expressions and blocks nested past what any template needs are refused when parsed.
  EXPECT_EQ(render("{{ " + repeated("(", 40) + "1" + repeated(")", 40) + " }}"), "1");
  EXPECT_NE(error_of("{{ " + repeated("(", 3000) + "1" + repeated(")", 3000) + " }}").find("nested more than"),
            std::string::npos);
  EXPECT_NE(error_of("{{ " + repeated("not ", 3000) + "1 }}").find("nested more than"), std::string::npos);
  EXPECT_NE(error_of("{{ " + repeated("-", 3000) + "1 }}").find("nested more than"), std::string::npos);
  EXPECT_NE(
      error_of(repeated("{% if 1 %}", 3000) + "x" + repeated("{% endif %}", 3000)).find("blocks nested more than"),
      std::string::npos);
  // The renderer is unharmed: the next template renders.
  EXPECT_EQ(render("{{ 1 + 1 }}"), "2");
}
