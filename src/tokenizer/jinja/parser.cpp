// Jinja parser: recursive descent over lexer tokens with jinja2's operator
// precedence (or < and < not < compare < +,- < ~ < *,/,//,% < ** < unary < postfix).
// Tested in tests/tokenizer/jinja_test.cpp.
#include "core/status.h"
#include "tokenizer/jinja/ast.h"

namespace kiln::tok::jinja {
namespace {

using TK = Token::Kind;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  NodeList parse_all() {
    NodeList out = parse_body({});
    if (peek().kind != TK::kEnd) fail("unexpected {% " + stmt_name() + " %}");
    return out;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw_error(ErrorCode::kInvalidFile, "chat template line ", peek().line, ": ", what);
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    throw_error(ErrorCode::kUnsupported, "chat template line ", peek().line, ": ", what,
                " is not supported by kiln's Jinja interpreter");
  }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == TK::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == TK::kName && peek(ahead).text == name;
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', found '" + peek().text + "'");
    next();
  }
  std::string expect_name() {
    if (peek().kind != TK::kName) fail("expected a name, found '" + peek().text + "'");
    return next().text;
  }
  void expect_stmt_close() {
    if (peek().kind != TK::kStmtClose) fail("expected %}, found '" + peek().text + "'");
    next();
  }
  // The keyword of the statement at the cursor (which is a kStmtOpen).
  std::string stmt_name() const { return peek(1).kind == TK::kName ? peek(1).text : ""; }

  NodePtr make(Node::Kind k) {
    auto n = std::make_unique<Node>();
    n->kind = k;
    n->line = peek().line;
    return n;
  }

  // Parses statements until a {% name %} whose name is in `stops` (not consumed).
  NodeList parse_body(std::initializer_list<const char*> stops) {
    NodeList out;
    while (true) {
      const Token& t = peek();
      if (t.kind == TK::kEnd) {
        if (stops.size() != 0) fail(std::string("missing {% ") + *(stops.end() - 1) + " %}");
        return out;
      }
      if (t.kind == TK::kText) {
        auto n = make(Node::Kind::kText);
        n->value = Value(next().text);
        out.push_back(std::move(n));
      } else if (t.kind == TK::kExprOpen) {
        next();
        auto n = make(Node::Kind::kOutput);
        n->children.push_back(parse_expr());
        if (peek().kind != TK::kExprClose) fail("expected }}, found '" + peek().text + "'");
        next();
        out.push_back(std::move(n));
      } else if (t.kind == TK::kStmtOpen) {
        const std::string name = stmt_name();
        for (const char* s : stops) {
          if (name == s) return out;
        }
        out.push_back(parse_statement());
      } else {
        fail("unexpected token '" + t.text + "'");
      }
    }
  }

  NodePtr parse_statement() {
    next();  // {%
    const std::string kw = expect_name();
    if (kw == "if") return parse_if();
    if (kw == "for") return parse_for();
    if (kw == "set") return parse_set();
    if (kw == "macro") return parse_macro();
    if (kw == "break" || kw == "continue") {
      auto n = make(kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue);
      expect_stmt_close();
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask tag: renders its body
      expect_stmt_close();
      auto n = make(Node::Kind::kBlock);
      n->body = parse_body({"endgeneration"});
      next(), next();
      expect_stmt_close();
      return n;
    }
    if (kw == "elif" || kw == "else" || kw == "endif" || kw == "endfor" || kw == "endset" ||
        kw == "endmacro") {
      fail("unexpected {% " + kw + " %}");
    }
    unsupported("the {% " + kw + " %} statement");
  }

  NodePtr parse_if() {
    auto n = make(Node::Kind::kIf);
    n->children.push_back(parse_expr());
    expect_stmt_close();
    n->branches.push_back(parse_body({"elif", "else", "endif"}));
    while (true) {
      next();  // {%
      const std::string kw = next().text;
      if (kw == "elif") {
        n->children.push_back(parse_expr());
        expect_stmt_close();
        n->branches.push_back(parse_body({"elif", "else", "endif"}));
      } else if (kw == "else") {
        expect_stmt_close();
        n->body = parse_body({"endif"});
      } else {  // endif
        expect_stmt_close();
        return n;
      }
    }
  }

  NodePtr parse_for() {
    auto n = make(Node::Kind::kFor);
    n->targets.push_back(expect_name());
    while (is_op(",")) {
      next();
      n->targets.push_back(expect_name());
    }
    if (!is_name("in")) fail("expected 'in' in for loop");
    next();
    n->children.push_back(parse_or(/*no_cond=*/true));
    n->children.push_back(nullptr);
    if (is_name("if")) {
      next();
      n->children[1] = parse_or(true);
    }
    if (is_name("recursive")) unsupported("a recursive for loop");
    expect_stmt_close();
    n->body = parse_body({"else", "endfor"});
    if (stmt_name() == "else") {
      next(), next();
      expect_stmt_close();
      n->else_body = parse_body({"endfor"});
    }
    next(), next();
    expect_stmt_close();
    return n;
  }

  NodePtr parse_set() {
    const std::string first = expect_name();
    if (is_op(".")) {  // set ns.attr = value
      next();
      auto n = make(Node::Kind::kSetAttr);
      n->name = first;
      n->attr = expect_name();
      expect_op("=");
      n->children.push_back(parse_expr());
      expect_stmt_close();
      return n;
    }
    std::vector<std::string> targets{first};
    while (is_op(",")) {
      next();
      targets.push_back(expect_name());
    }
    if (peek().kind == TK::kStmtClose) {  // {% set x %}...{% endset %}
      next();
      auto n = make(Node::Kind::kSetBlock);
      n->targets = targets;
      n->body = parse_body({"endset"});
      next(), next();
      expect_stmt_close();
      return n;
    }
    if (is_op("|")) unsupported("a filtered set block");
    auto n = make(Node::Kind::kSet);
    n->targets = targets;
    expect_op("=");
    n->children.push_back(parse_tuple_or_expr());
    expect_stmt_close();
    return n;
  }

  NodePtr parse_macro() {
    auto n = make(Node::Kind::kMacro);
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      n->targets.push_back(expect_name());
      if (is_op("=")) {
        next();
        n->children.push_back(parse_expr());
      } else {
        n->children.push_back(nullptr);
      }
      if (!is_op(")")) expect_op(",");
    }
    next();
    expect_stmt_close();
    n->body = parse_body({"endmacro"});
    next(), next();
    expect_stmt_close();
    return n;
  }

  // "a, b" on the right of set builds a list (a Python tuple).
  NodePtr parse_tuple_or_expr() {
    NodePtr first = parse_expr();
    if (!is_op(",")) return first;
    auto n = make(Node::Kind::kList);
    n->children.push_back(std::move(first));
    while (is_op(",")) {
      next();
      n->children.push_back(parse_expr());
    }
    return n;
  }

  NodePtr parse_expr() {
    NodePtr e = parse_or(false);
    if (is_name("if")) {  // a if cond else b
      next();
      auto n = make(Node::Kind::kCondExpr);
      NodePtr cond = parse_or(false);
      NodePtr other;
      if (is_name("else")) {
        next();
        other = parse_expr();
      }
      n->children.push_back(std::move(cond));
      n->children.push_back(std::move(e));
      n->children.push_back(std::move(other));
      return n;
    }
    return e;
  }

  NodePtr binary(const std::string& op, NodePtr l, NodePtr r) {
    auto n = make(Node::Kind::kBinary);
    n->name = op;
    n->children.push_back(std::move(l));
    n->children.push_back(std::move(r));
    return n;
  }

  NodePtr parse_or(bool no_cond) {
    NodePtr l = parse_and();
    while (is_name("or")) {
      next();
      l = binary("or", std::move(l), parse_and());
    }
    return l;
  }

  NodePtr parse_and() {
    NodePtr l = parse_not();
    while (is_name("and")) {
      next();
      l = binary("and", std::move(l), parse_not());
    }
    return l;
  }

  NodePtr parse_not() {
    if (is_name("not")) {
      next();
      auto n = make(Node::Kind::kUnary);
      n->name = "not";
      n->children.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  NodePtr parse_compare() {
    NodePtr l = parse_math1();
    while (true) {
      std::string op;
      if (peek().kind == TK::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                     peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next(), next();
        op = "not in";
      } else {
        return l;
      }
      l = binary(op, std::move(l), parse_math1());
    }
  }

  NodePtr parse_math1() {
    NodePtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), parse_concat());
    }
    return l;
  }

  NodePtr parse_concat() {
    NodePtr l = parse_math2();
    while (is_op("~")) {
      next();
      l = binary("~", std::move(l), parse_math2());
    }
    return l;
  }

  NodePtr parse_math2() {
    NodePtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const std::string op = next().text;
      l = binary(op, std::move(l), parse_pow());
    }
    return l;
  }

  NodePtr parse_pow() {
    NodePtr l = parse_unary(true);
    while (is_op("**")) {
      next();
      l = binary("**", std::move(l), parse_unary(true));
    }
    return l;
  }

  NodePtr parse_unary(bool with_filter) {
    NodePtr n;
    if (is_op("-") || is_op("+")) {
      auto u = make(Node::Kind::kUnary);
      u->name = next().text;
      u->children.push_back(parse_unary(false));
      n = std::move(u);
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filters(std::move(n));
    return n;
  }

  void parse_call_args(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (peek().kind == TK::kName && is_op("=", 1)) {
        n.arg_names.push_back(next().text);
        next();
      } else {
        if (is_op("*") || is_op("**")) unsupported("*args/**kwargs in a call");
        n.arg_names.emplace_back();
      }
      n.children.push_back(parse_expr());
      if (!is_op(")")) expect_op(",");
    }
    next();
  }

  NodePtr parse_postfix(NodePtr n) {
    while (true) {
      if (is_op(".")) {
        next();
        auto a = make(Node::Kind::kAttr);
        if (peek().kind == TK::kInt) {  // x.0 is item 0
          a->kind = Node::Kind::kItem;
          a->children.push_back(std::move(n));
          auto lit = make(Node::Kind::kLiteral);
          lit->value = Value(static_cast<int64_t>(std::stoll(next().text)));
          a->children.push_back(std::move(lit));
        } else {
          a->name = expect_name();
          a->children.push_back(std::move(n));
        }
        n = std::move(a);
      } else if (is_op("[")) {
        next();
        NodePtr parts[3];
        int colons = 0;
        while (!is_op("]")) {
          if (is_op(":")) {
            if (++colons > 2) fail("too many ':' in a slice");
            next();
          } else {
            if (parts[colons]) fail("expected ']' or ':'");
            parts[colons] = parse_expr();
          }
        }
        next();
        if (colons == 0) {
          if (!parts[0]) fail("empty subscript");
          auto it = make(Node::Kind::kItem);
          it->children.push_back(std::move(n));
          it->children.push_back(std::move(parts[0]));
          n = std::move(it);
        } else {
          auto s = make(Node::Kind::kSlice);
          s->children.push_back(std::move(n));
          for (auto& p : parts) s->children.push_back(std::move(p));
          n = std::move(s);
        }
      } else if (is_op("(")) {
        auto c = make(Node::Kind::kCall);
        c->children.push_back(std::move(n));
        c->arg_names.emplace_back();  // slot of the callee
        parse_call_args(*c);
        n = std::move(c);
      } else {
        return n;
      }
    }
  }

  NodePtr parse_filters(NodePtr n) {
    while (true) {
      if (is_op("|")) {
        next();
        auto f = make(Node::Kind::kFilter);
        f->name = expect_name();
        f->children.push_back(std::move(n));
        f->arg_names.emplace_back();
        if (is_op("(")) parse_call_args(*f);
        n = std::move(f);
      } else if (is_name("is")) {
        next();
        auto t = make(Node::Kind::kTest);
        if (is_name("not")) {
          next();
          t->negate = true;
        }
        // "none", "true", "false" are test names here, not literals.
        t->name = expect_name();
        t->children.push_back(std::move(n));
        t->arg_names.emplace_back();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if (peek().kind == TK::kString || peek().kind == TK::kInt ||
                   peek().kind == TK::kFloat || (peek().kind == TK::kName && !is_name("and") &&
                                                 !is_name("or") && !is_name("else") && !is_name("if"))) {
          // "x is divisibleby 3", "x is sameas y": one bare argument.
          t->children.push_back(parse_primary());
          t->arg_names.emplace_back();
        }
        n = std::move(t);
      } else {
        return n;
      }
    }
  }

  NodePtr parse_primary() {
    const Token& t = peek();
    auto lit = [&](Value v) {
      auto n = make(Node::Kind::kLiteral);
      n->value = std::move(v);
      next();
      return n;
    };
    switch (t.kind) {
      case TK::kString: {
        // Adjacent literals concatenate, as in Python.
        std::string s = next().text;
        while (peek().kind == TK::kString) s += next().text;
        auto n = make(Node::Kind::kLiteral);
        n->value = Value(std::move(s));
        return n;
      }
      case TK::kInt: {
        try {
          return lit(Value(static_cast<int64_t>(std::stoll(t.text))));
        } catch (const std::exception&) {
          fail("integer literal out of range");
        }
      }
      case TK::kFloat: return lit(Value(std::stod(t.text)));
      case TK::kName: {
        if (t.text == "true" || t.text == "True") return lit(Value(true));
        if (t.text == "false" || t.text == "False") return lit(Value(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        auto n = make(Node::Kind::kName);
        n->name = next().text;
        return n;
      }
      case TK::kOp: {
        if (t.text == "(") {
          next();
          if (is_op(")")) {  // empty tuple
            next();
            auto n = make(Node::Kind::kList);
            return n;
          }
          NodePtr e = parse_expr();
          if (is_op(",")) {  // tuple
            auto n = make(Node::Kind::kList);
            n->children.push_back(std::move(e));
            while (is_op(",")) {
              next();
              if (is_op(")")) break;
              n->children.push_back(parse_expr());
            }
            e = std::move(n);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          next();
          auto n = make(Node::Kind::kList);
          while (!is_op("]")) {
            n->children.push_back(parse_expr());
            if (!is_op("]")) expect_op(",");
          }
          next();
          return n;
        }
        if (t.text == "{") {
          next();
          auto n = make(Node::Kind::kDict);
          while (!is_op("}")) {
            n->children.push_back(parse_expr());
            expect_op(":");
            n->children.push_back(parse_expr());
            if (!is_op("}")) expect_op(",");
          }
          next();
          return n;
        }
        break;
      }
      default: break;
    }
    fail("unexpected '" + (t.text.empty() ? std::string("end of tag") : t.text) + "' in expression");
  }

  std::vector<Token> t_;
  size_t i_ = 0;
};

}  // namespace

NodeList parse_template(std::string_view source, const LexOptions& options) {
  return Parser(lex(source, options)).parse_all();
}

}  // namespace kiln::tok::jinja
