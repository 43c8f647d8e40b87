// Syntax tree and lexer tokens of kiln's Jinja subset (what HF chat templates use).
// The lexer applies jinja2's whitespace rules (trim_blocks, lstrip_blocks, "-"/"+"
// markers) so the parser sees exactly the text jinja2 would output.
// Tested in tests/tokenizer/jinja_test.cpp.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace kiln::tok::jinja {

struct Token {
  enum class Kind { kText, kStmtOpen, kStmtClose, kExprOpen, kExprClose, kName, kString, kInt,
                    kFloat, kOp, kEnd };
  Kind kind;
  std::string text;
  int line = 1;
};

struct LexOptions {
  bool trim_blocks = true;    // transformers renders with these two on
  bool lstrip_blocks = true;
};

// Throws kiln::Error(kInvalidFile) with the line for unterminated tags or strings.
std::vector<Token> lex(std::string_view source, const LexOptions& options);

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

struct Node {
  enum class Kind {
    // expressions
    kLiteral, kName, kList, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest, kUnary,
    kBinary, kCondExpr,
    // statements
    kText, kOutput, kIf, kFor, kSet, kSetAttr, kSetBlock, kMacro, kBreak, kContinue, kBlock,
  };
  Kind kind;
  int line = 0;
  std::string name;                 // identifier, attribute, filter/test, operator
  std::string attr;                 // kSetAttr: attribute
  Value value;                      // kLiteral / kText
  NodeList children;                // operands, arguments (may hold nullptr in kSlice)
  std::vector<std::string> arg_names;  // kCall/kFilter/kTest: "" for positional args
  std::vector<std::string> targets;    // kFor/kSet/kMacro: loop vars, set names, params
  bool negate = false;              // kTest: "is not"
  std::vector<NodeList> branches;   // kIf: one body per condition in children
  NodeList body;                    // kFor/kSetBlock/kMacro/kBlock body; kIf else
  NodeList else_body;               // kFor else
};

// Parses a whole template; throws kiln::Error(kInvalidFile) for syntax errors and
// kiln::Error(kUnsupported) for constructs kiln does not implement, naming them.
NodeList parse_template(std::string_view source, const LexOptions& options = {});

}  // namespace kiln::tok::jinja
