// Jinja evaluator: walks the syntax tree with jinja2's scoping (for-loop bodies and
// macros get their own scope; namespace() objects carry state out of loops) and its
// undefined semantics (missing keys are falsy, print as "").
// Tested in tests/tokenizer/jinja_test.cpp and chat_template_test.cpp.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace kiln::tok::jinja {

class Context {
 public:
  explicit Context(const ValueDict& globals);

  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value v);
  void push_scope();
  void pop_scope();

  // Limits that keep a hostile template from hanging or exhausting the stack.
  int depth = 0;
  size_t steps = 0;
  enum class Flow { kNormal, kBreak, kContinue } flow = Flow::kNormal;

 private:
  std::vector<std::unordered_map<std::string, Value>> scopes_;
};

Value eval(const Node& node, Context& ctx);
void exec(const NodeList& body, Context& ctx, std::string& out);

// Builtins (builtins.cpp).
Value apply_filter(const std::string& name, const Value& input, const Args& args, int line);
bool apply_test(const std::string& name, const Value& input, const Args& args, int line);
// Python str/list/dict methods such as "text".strip() or d.items(); undefined result
// (not an error) when `name` is not a method of the value.
bool call_method(const Value& self, const std::string& name, const Args& args, int line, Value* out);
ValueDict builtin_globals();

// Iterating a value as jinja2 does (dict -> keys, string -> characters).
ValueList iterate(const Value& v, int line);

}  // namespace kiln::tok::jinja
