// Chat templates: kiln's Jinja interpreter must render the real chat templates of
// Llama-2/3/3.1, Mistral, Qwen2/2.5, Zephyr, Gemma and SmolLM2 byte-identically to
// transformers' jinja2 environment (fixture from gen_chat_fixtures.py), including
// raise_exception errors.
#include <gtest/gtest.h>

#include "core/status.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kiln::tok {
namespace {

using ojson = nlohmann::ordered_json;

TEST(ChatTemplate, RealTemplatesMatchJinja2) {
  const ojson fixture = ojson::parse(test::read_text(test::fixtures_dir() / "chat_templates.json"));
  size_t rendered = 0, errors = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["template"];
    const std::string conv = c["conversation"];
    SCOPED_TRACE(name + " / " + conv + (c["add_generation_prompt"].get<bool>() ? " +gen" : "") +
                 (c["tools"].get<bool>() ? " +tools" : ""));
    const ChatTemplate tmpl(fixture["templates"][name].get<std::string>());
    ChatTemplateOptions opt;
    opt.add_generation_prompt = c["add_generation_prompt"];
    opt.bos_token = fixture["tokens"][name][0];
    opt.eos_token = fixture["tokens"][name][1];
    if (c["tools"].get<bool>()) opt.extra["tools"] = fixture["tools"];
    const ojson& messages = fixture["conversations"][conv];
    if (c.contains("error")) {
      try {
        tmpl.render(messages, opt);
        ADD_FAILURE() << "expected raise_exception: " << c["error"];
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << e.what();
      }
      ++errors;
    } else {
      EXPECT_EQ(tmpl.render(messages, opt), c["rendered"].get<std::string>());
      ++rendered;
    }
  }
  EXPECT_GT(rendered, 100u);
  EXPECT_GT(errors, 10u);
}

TEST(ChatTemplate, SmolLM2FromGguf) {
  const auto path = test::smollm2_gguf();
  if (!path) GTEST_SKIP() << "SmolLM2 GGUF not found under " << test::models_dir();
  const Tokenizer tok = Tokenizer::from_gguf(test::read_gguf_tokenizer(*path));
  const std::string prompt = apply_chat_template(tok, to_json({{"user", "Hi!"}}));
  EXPECT_EQ(prompt,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n");
  // The special tokens in the rendered prompt are single ids.
  const auto ids = tok.encode(prompt, false);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 2), 2);
}

TEST(ChatTemplate, UnsupportedConstructsAreClearErrors) {
  auto code_of = [](const std::string& src) {
    try {
      ChatTemplate t(src);
      t.render(ojson::array(), {});
    } catch (const Error& e) {
      return std::make_pair(e.code(), std::string(e.what()));
    }
    return std::make_pair(ErrorCode::kInternal, std::string("no error"));
  };
  auto [c1, m1] = code_of("{% include 'x.j2' %}");
  EXPECT_EQ(c1, ErrorCode::kUnsupported);
  EXPECT_NE(m1.find("include"), std::string::npos) << m1;
  auto [c2, m2] = code_of("{{ x | groupby('a') }}");
  EXPECT_EQ(c2, ErrorCode::kUnsupported);
  EXPECT_NE(m2.find("groupby"), std::string::npos) << m2;
  auto [c3, m3] = code_of("{% if x %}never closed");
  EXPECT_EQ(c3, ErrorCode::kInvalidFile);
  EXPECT_NE(m3.find("endif"), std::string::npos) << m3;
  auto [c4, m4] = code_of("{{ 'unterminated }}");
  EXPECT_EQ(c4, ErrorCode::kInvalidFile);
  auto [c5, m5] = code_of("{{ foo(1) }}");
  EXPECT_EQ(c5, ErrorCode::kUnsupported);
  EXPECT_NE(m5.find("foo"), std::string::npos) << m5;
}

TEST(ChatTemplate, ExpressionsAndFilters) {
  auto render = [](const std::string& src, ojson extra = ojson::object()) {
    ChatTemplateOptions opt;
    opt.extra = std::move(extra);
    return ChatTemplate(src).render(ojson::array(), opt);
  };
  EXPECT_EQ(render("{{ [1, 2, 3][1:] }}|{{ 'abc'[::-1] }}|{{ (7 // 2) ~ (7 % 3) ~ (2 ** 3) }}"),
            "[2, 3]|cba|318");
  EXPECT_EQ(render("{{ 1 / 2 }} {{ 0.1 + 0.2 }} {{ 1e20 if false else 3.0 }}"), "0.5 0.30000000000000004 3.0");
  EXPECT_EQ(render("{{ ' x '|trim|upper }}{{ 'a,b'.split(',')|join('+') }}{{ none|default('d') }}{{ u|default('u') }}"),
            "Xa+bNoneu");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(5) %}{% if i is odd %}{% set ns.n = ns.n + i %}{% endif %}{% endfor %}{{ ns.n }}"),
            "4");
  EXPECT_EQ(render("{% for x in xs %}{% if loop.first %}[{% endif %}{{ x }}{{ ',' if not loop.last }}{% if loop.last %}]{% endif %}{% endfor %}",
                   {{"xs", {1, "a", true}}}),
            "[1,a,True]");
  EXPECT_EQ(render("{{ d|tojson }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   {{"d", {{"b", 1}, {"a", {nullptr, 2.5}}}}}),
            "{\"b\": 1, \"a\": [null, 2.5]} b=1;a=[None, 2.5];");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bob') }} {{ greet('Al', punct='?') }}"),
            "Hi Bob! Hi Al?");
  EXPECT_EQ(render("{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}"),
            "02");
  EXPECT_EQ(render("  {%- if true -%}  x  {%- endif -%}  \n"), "x");
  EXPECT_EQ(render("a\n  {% if true %}\nb\n  {% endif %}\nc"), "a\nb\nc");
  EXPECT_EQ(render("{{ 'x' in 'xyz' }}{{ 2 in [1, 2] }}{{ 'k' not in {'k': 1} }}"), "TrueTrueFalse");
}

}  // namespace
}  // namespace kiln::tok
