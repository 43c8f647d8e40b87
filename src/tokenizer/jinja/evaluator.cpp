// Jinja tree-walking evaluator; see evaluator.h. Tested in tests/tokenizer/jinja_test.cpp.
#include "tokenizer/jinja/evaluator.h"

#include <cmath>

#include "core/status.h"
#include "tokenizer/unicode.h"

namespace kiln::tok::jinja {
namespace {

constexpr int kMaxDepth = 200;
constexpr size_t kMaxSteps = 50'000'000;

[[noreturn]] void fail(int line, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "chat template line ", line, ": ", what);
}

void tick(Context& ctx, int line) {
  if (++ctx.steps > kMaxSteps) fail(line, "template takes too long to render (step limit)");
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      ValueList l = a.list();
      l.insert(l.end(), b.list().begin(), b.list().end());
      return Value(std::move(l));
    }
  }
  if (op == "*" && (a.is_string() || a.is_list()) && (b.kind() == Value::Kind::kInt)) {
    const int64_t n = b.as_int();
    if (n > 1'000'000) fail(line, "repetition count too large");
    if (a.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += a.as_string();
      return Value(std::move(s));
    }
    ValueList l;
    for (int64_t i = 0; i < n; ++i) l.insert(l.end(), a.list().begin(), a.list().end());
    return Value(std::move(l));
  }
  const bool num = (a.is_number() || a.kind() == Value::Kind::kBool) &&
                   (b.is_number() || b.kind() == Value::Kind::kBool);
  if (!num) {
    fail(line, "unsupported operand types for " + op + ": " + a.type_name() + " and " + b.type_name());
  }
  const bool is_float = a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat;
  if (op == "/") {
    if (b.as_double() == 0) fail(line, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) fail(line, "division by zero");
    if (is_float) {
      const double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value(q) : Value(a.as_double() - q * b.as_double());
    }
    const int64_t x = a.as_int(), y = b.as_int();
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // Python floors
    return op == "//" ? Value(q) : Value(x - q * y);
  }
  if (op == "**") return is_float || b.as_int() < 0 ? Value(std::pow(a.as_double(), b.as_double()))
                                                    : Value(static_cast<int64_t>(std::pow(a.as_double(), b.as_double())));
  if (is_float) {
    const double x = a.as_double(), y = b.as_double();
    return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
  }
  const int64_t x = a.as_int(), y = b.as_int();
  return Value(op == "+" ? x + y : op == "-" ? x - y : x * y);
}

bool contains(const Value& container, const Value& item, int line) {
  if (container.is_string()) {
    if (!item.is_string()) fail(line, "'in <string>' requires a string on the left");
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const auto& v : container.list()) {
      if (v.equals(item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return item.is_string() && container.dict_find(item.as_string()) != nullptr;
  if (container.is_undefined() || container.is_none()) return false;
  fail(line, "'in' needs a string, list or dict, got " + container.type_name());
}

Value slice(const Value& v, const Value& start, const Value& stop, const Value& step, int line) {
  const bool is_str = v.is_string();
  if (!is_str && !v.is_list()) {
    if (v.is_undefined()) return v;
    fail(line, "cannot slice a " + v.type_name());
  }
  std::vector<char32_t> cps;
  if (is_str) cps = utf8_to_cps(v.as_string());
  const int64_t n = is_str ? static_cast<int64_t>(cps.size()) : static_cast<int64_t>(v.list().size());
  const int64_t st = step.is_undefined() || step.is_none() ? 1 : step.as_int();
  if (st == 0) fail(line, "slice step cannot be zero");
  auto norm = [&](const Value& x, int64_t dflt) {
    if (x.is_undefined() || x.is_none()) return dflt;
    int64_t i = x.as_int();
    if (i < 0) i += n;
    if (st > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = norm(start, st > 0 ? 0 : n - 1);
  const int64_t e = norm(stop, st > 0 ? n : -1);
  std::string s;
  ValueList l;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (is_str) {
      utf8_append(s, cps[static_cast<size_t>(i)]);
    } else {
      l.push_back(v.list()[static_cast<size_t>(i)]);
    }
  }
  return is_str ? Value(std::move(s)) : Value(std::move(l));
}

Args eval_args(const Node& n, Context& ctx) {
  Args args;
  for (size_t i = 1; i < n.children.size(); ++i) {
    Value v = eval(*n.children[i], ctx);
    if (n.arg_names[i].empty()) {
      args.positional.push_back(std::move(v));
    } else {
      args.named.emplace_back(n.arg_names[i], std::move(v));
    }
  }
  return args;
}

// A macro: a callable that renders its body in a fresh scope over the globals.
Value make_macro(const Node& n, Context& ctx) {
  std::vector<Value> defaults;
  for (const auto& d : n.children) defaults.push_back(d ? eval(*d, ctx) : Value());
  const Node* node = &n;
  Context* def_ctx = &ctx;
  return Value(Function([node, def_ctx, defaults](const Args& args) -> Value {
    Context& c = *def_ctx;
    if (++c.depth > kMaxDepth) fail(node->line, "macro recursion too deep");
    c.push_scope();
    for (size_t i = 0; i < node->targets.size(); ++i) {
      const Value* v = args.get(i, node->targets[i]);
      c.set(node->targets[i], v ? *v : defaults[i]);
    }
    std::string out;
    try {
      exec(node->body, c, out);
    } catch (...) {
      c.pop_scope();
      --c.depth;
      throw;
    }
    c.pop_scope();
    --c.depth;
    return Value(std::move(out));
  }));
}

void assign(Context& ctx, const std::vector<std::string>& targets, const Value& v, int line) {
  if (targets.size() == 1) {
    ctx.set(targets[0], v);
    return;
  }
  const ValueList items = iterate(v, line);
  if (items.size() != targets.size()) {
    fail(line, "cannot unpack " + std::to_string(items.size()) + " values into " +
                   std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) ctx.set(targets[i], items[i]);
}

void exec_for(const Node& n, Context& ctx, std::string& out) {
  const Value seq = eval(*n.children[0], ctx);
  ValueList items = iterate(seq, n.line);
  if (n.children[1]) {  // "for x in xs if cond": filter before loop.* is computed
    ValueList kept;
    for (const auto& item : items) {
      ctx.push_scope();
      assign(ctx, n.targets, item, n.line);
      const bool keep = eval(*n.children[1], ctx).truthy();
      ctx.pop_scope();
      if (keep) kept.push_back(item);
    }
    items.swap(kept);
  }
  if (items.empty()) {
    exec(n.else_body, ctx, out);
    return;
  }
  const auto len = static_cast<int64_t>(items.size());
  ctx.push_scope();
  for (int64_t i = 0; i < len; ++i) {
    ValueDict loop{{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(len - i)},
                   {"revindex0", Value(len - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == len - 1)},
                   {"length", Value(len)},
                   {"previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value()},
                   {"nextitem", i + 1 < len ? items[static_cast<size_t>(i + 1)] : Value()}};
    const Value loop_value(std::move(loop));
    const int64_t idx = i;
    loop_value.dict_set("cycle", Value(Function([idx](const Args& a) {
      if (a.positional.empty()) return Value();
      return a.positional[static_cast<size_t>(idx) % a.positional.size()];
    })));
    ctx.set("loop", loop_value);
    assign(ctx, n.targets, items[static_cast<size_t>(i)], n.line);
    exec(n.body, ctx, out);
    if (ctx.flow == Context::Flow::kBreak) {
      ctx.flow = Context::Flow::kNormal;
      break;
    }
    ctx.flow = Context::Flow::kNormal;
  }
  ctx.pop_scope();
}

}  // namespace

Context::Context(const ValueDict& globals) {
  scopes_.emplace_back();
  for (const auto& [k, v] : globals) scopes_.back()[k] = v;
}

Value Context::lookup(const std::string& name) const {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return Value();
}

void Context::set(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }
void Context::push_scope() { scopes_.emplace_back(); }
void Context::pop_scope() {
  KILN_CHECK(scopes_.size() > 1, "jinja scope underflow");
  scopes_.pop_back();
}

ValueList iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kList: return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& [k, _] : v.dict()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      for (char32_t c : utf8_to_cps(v.as_string())) chars.emplace_back(utf8_encode(c));
      return chars;
    }
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return {};
    default: fail(line, "cannot iterate over a " + v.type_name());
  }
}

Value eval(const Node& n, Context& ctx) {
  tick(ctx, n.line);
  switch (n.kind) {
    case Node::Kind::kLiteral: return n.value;
    case Node::Kind::kName: return ctx.lookup(n.name);
    case Node::Kind::kList: {
      ValueList l;
      for (const auto& c : n.children) l.push_back(eval(*c, ctx));
      return Value(std::move(l));
    }
    case Node::Kind::kDict: {
      Value d{ValueDict{}};
      for (size_t i = 0; i + 1 < n.children.size(); i += 2) {
        const Value k = eval(*n.children[i], ctx);
        d.dict_set(k.str(), eval(*n.children[i + 1], ctx));
      }
      return d;
    }
    case Node::Kind::kAttr: {
      const Value obj = eval(*n.children[0], ctx);
      Value v = obj.get_attr(n.name);
      if (v.is_undefined() && !obj.is_dict() && !obj.is_undefined() && !obj.is_none()) {
        // A bound method, called by the enclosing kCall.
        const std::string name = n.name;
        const int line = n.line;
        return Value(Function([obj, name, line](const Args& args) {
          Value out;
          if (!call_method(obj, name, args, line, &out)) {
            fail(line, "'" + obj.type_name() + "' has no method '" + name + "'");
          }
          return out;
        }));
      }
      if (v.is_undefined() && obj.is_dict()) {
        // dict methods (items, get, keys, values) when no such key exists.
        static const char* kMethods[] = {"items", "get", "keys", "values"};
        for (const char* m : kMethods) {
          if (n.name == m) {
            const std::string name = n.name;
            const int line = n.line;
            return Value(Function([obj, name, line](const Args& args) {
              Value out;
              call_method(obj, name, args, line, &out);
              return out;
            }));
          }
        }
      }
      return v;
    }
    case Node::Kind::kItem: {
      const Value obj = eval(*n.children[0], ctx);
      const Value key = eval(*n.children[1], ctx);
      Value v = obj.get_item(key);
      if (v.is_undefined() && key.is_string() && !obj.is_dict()) return obj.get_attr(key.as_string());
      return v;
    }
    case Node::Kind::kSlice: {
      const Value obj = eval(*n.children[0], ctx);
      auto part = [&](size_t i) { return n.children[i] ? eval(*n.children[i], ctx) : Value(); };
      return slice(obj, part(1), part(2), part(3), n.line);
    }
    case Node::Kind::kCall: {
      const Value callee = eval(*n.children[0], ctx);
      if (!callee.is_callable()) {
        std::string what = n.children[0]->kind == Node::Kind::kName ? n.children[0]->name : "expression";
        if (n.children[0]->kind == Node::Kind::kAttr) what = n.children[0]->name;
        if (callee.is_undefined()) {
          throw_error(ErrorCode::kUnsupported, "chat template line ", n.line, ": function '", what,
                      "' is not defined (not supported by kiln's Jinja interpreter)");
        }
        fail(n.line, "'" + what + "' is not callable");
      }
      if (++ctx.depth > kMaxDepth) fail(n.line, "call nesting too deep");
      Value r = callee.function()(eval_args(n, ctx));
      --ctx.depth;
      return r;
    }
    case Node::Kind::kFilter: {
      const Value input = eval(*n.children[0], ctx);
      return apply_filter(n.name, input, eval_args(n, ctx), n.line);
    }
    case Node::Kind::kTest: {
      const Value input = eval(*n.children[0], ctx);
      const bool r = apply_test(n.name, input, eval_args(n, ctx), n.line);
      return Value(n.negate ? !r : r);
    }
    case Node::Kind::kUnary: {
      const Value v = eval(*n.children[0], ctx);
      if (n.name == "not") return Value(!v.truthy());
      if (!v.is_number()) fail(n.line, "bad operand for unary " + n.name + ": " + v.type_name());
      if (n.name == "+") return v;
      return v.kind() == Value::Kind::kInt ? Value(-v.as_int()) : Value(-v.as_double());
    }
    case Node::Kind::kBinary: {
      const std::string& op = n.name;
      const Value a = eval(*n.children[0], ctx);
      if (op == "and") return a.truthy() ? eval(*n.children[1], ctx) : a;
      if (op == "or") return a.truthy() ? a : eval(*n.children[1], ctx);
      const Value b = eval(*n.children[1], ctx);
      if (op == "~") return Value(a.str() + b.str());
      if (op == "==") return Value(a.equals(b));
      if (op == "!=") return Value(!a.equals(b));
      if (op == "in") return Value(contains(b, a, n.line));
      if (op == "not in") return Value(!contains(b, a, n.line));
      if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        const int c = a.compare(b);
        return Value(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
      }
      return arith(op, a, b, n.line);
    }
    case Node::Kind::kCondExpr: {
      if (eval(*n.children[0], ctx).truthy()) return eval(*n.children[1], ctx);
      return n.children[2] ? eval(*n.children[2], ctx) : Value();
    }
    default: fail(n.line, "statement used as an expression");
  }
}

void exec(const NodeList& body, Context& ctx, std::string& out) {
  for (const auto& np : body) {
    const Node& n = *np;
    tick(ctx, n.line);
    if (ctx.flow != Context::Flow::kNormal) return;
    switch (n.kind) {
      case Node::Kind::kText: out += n.value.as_string(); break;
      case Node::Kind::kOutput: out += eval(*n.children[0], ctx).str(); break;
      case Node::Kind::kIf: {
        bool taken = false;
        for (size_t i = 0; i < n.children.size(); ++i) {
          if (eval(*n.children[i], ctx).truthy()) {
            exec(n.branches[i], ctx, out);
            taken = true;
            break;
          }
        }
        if (!taken) exec(n.body, ctx, out);
        break;
      }
      case Node::Kind::kFor: exec_for(n, ctx, out); break;
      case Node::Kind::kSet: assign(ctx, n.targets, eval(*n.children[0], ctx), n.line); break;
      case Node::Kind::kSetAttr: {
        const Value ns = ctx.lookup(n.name);
        if (!ns.is_dict()) fail(n.line, "cannot set attribute '" + n.attr + "' on " + ns.type_name() + " '" + n.name + "' (expected a namespace())");
        ns.dict_set(n.attr, eval(*n.children[0], ctx));
        break;
      }
      case Node::Kind::kSetBlock: {
        std::string captured;
        exec(n.body, ctx, captured);
        ctx.set(n.targets[0], Value(std::move(captured)));
        break;
      }
      case Node::Kind::kMacro: ctx.set(n.name, make_macro(n, ctx)); break;
      case Node::Kind::kBreak: ctx.flow = Context::Flow::kBreak; return;
      case Node::Kind::kContinue: ctx.flow = Context::Flow::kContinue; return;
      case Node::Kind::kBlock: exec(n.body, ctx, out); break;
      default: fail(n.line, "expression used as a statement");
    }
    if (out.size() > (size_t{256} << 20)) fail(n.line, "rendered text exceeds 256 MiB");
  }
}

}  // namespace kiln::tok::jinja
