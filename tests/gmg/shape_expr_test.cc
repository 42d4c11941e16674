#include "slicesched/gmg/shape_expr.h"

#include <cstdint>
#include <iterator>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace slicesched {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

using Bindings = absl::flat_hash_map<std::string, int64_t>;

// Parses `text` against a fresh table and evaluates it with `named`.
absl::StatusOr<int64_t> Eval(std::string_view text,
                             const Bindings& named = {}) {
  SymbolTable symbols;
  absl::StatusOr<ShapeExpr> expr = ShapeExpr::Parse(text, &symbols);
  if (!expr.ok()) return expr.status();
  // Names not in the expression are ignored here so that tests can share
  // binding maps; BindSymbols itself is tested separately.
  SymbolValues values(symbols.size());
  for (const auto& [name, value] : named) {
    if (std::optional<int> sym = symbols.Find(name)) values.Set(*sym, value);
  }
  return expr->Evaluate(values);
}

int64_t EvalOk(std::string_view text, const Bindings& named = {}) {
  absl::StatusOr<int64_t> v = Eval(text, named);
  EXPECT_TRUE(v.ok()) << text << ": " << v.status();
  return v.value_or(-999999);
}

// The message of a Parse failure (or "" if it parsed).
std::string ParseError(std::string_view text) {
  SymbolTable symbols;
  absl::StatusOr<ShapeExpr> expr = ShapeExpr::Parse(text, &symbols);
  if (expr.ok()) return "";
  EXPECT_EQ(expr.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(expr.status().message());
}

// ---------------------------------------------------------------------------
// SymbolTable / SymbolValues / BindSymbols

TEST(SymbolTableTest, InternAndFind) {
  SymbolTable symbols;
  EXPECT_EQ(symbols.size(), 0u);
  EXPECT_EQ(symbols.Intern("B"), 0);
  EXPECT_EQ(symbols.Intern("S"), 1);
  EXPECT_EQ(symbols.Intern("B"), 0);
  EXPECT_EQ(symbols.size(), 2u);
  EXPECT_EQ(symbols.Find("S"), 1);
  EXPECT_EQ(symbols.Find("Q"), std::nullopt);
  EXPECT_EQ(symbols.name(0), "B");
  EXPECT_EQ(symbols.name(1), "S");
}

TEST(SymbolValuesTest, SetGetUnsetAndGrow) {
  SymbolValues values(2);
  EXPECT_EQ(values.size(), 2u);
  EXPECT_FALSE(values.IsBound(0));
  EXPECT_EQ(values.Get(0), 0);
  values.Set(1, -7);
  EXPECT_TRUE(values.IsBound(1));
  EXPECT_EQ(values.Get(1), -7);
  EXPECT_FALSE(values.IsBound(5));
  EXPECT_FALSE(values.IsBound(-1));
  values.Set(5, 42);  // grows
  EXPECT_EQ(values.size(), 6u);
  EXPECT_TRUE(values.IsBound(5));
  EXPECT_EQ(values.Get(5), 42);
  EXPECT_FALSE(values.IsBound(4));
  values.Unset(1);
  EXPECT_FALSE(values.IsBound(1));
  values.Unset(100);  // no-op
}

TEST(BindSymbolsTest, BindsKnownNames) {
  SymbolTable symbols;
  ASSERT_TRUE(ShapeExpr::Parse("B*S", &symbols).ok());
  absl::StatusOr<SymbolValues> values =
      BindSymbols(symbols, {{"B", 4}, {"S", 128}});
  ASSERT_TRUE(values.ok()) << values.status();
  EXPECT_EQ(values->size(), 2u);
  EXPECT_EQ(values->Get(*symbols.Find("B")), 4);
  EXPECT_EQ(values->Get(*symbols.Find("S")), 128);
}

TEST(BindSymbolsTest, PartialBindingLeavesOthersUnbound) {
  SymbolTable symbols;
  ASSERT_TRUE(ShapeExpr::Parse("B*S", &symbols).ok());
  absl::StatusOr<SymbolValues> values = BindSymbols(symbols, {{"B", 4}});
  ASSERT_TRUE(values.ok());
  EXPECT_TRUE(values->IsBound(*symbols.Find("B")));
  EXPECT_FALSE(values->IsBound(*symbols.Find("S")));
}

TEST(BindSymbolsTest, RejectsUnknownNames) {
  SymbolTable symbols;
  ASSERT_TRUE(ShapeExpr::Parse("B*S", &symbols).ok());
  absl::StatusOr<SymbolValues> values =
      BindSymbols(symbols, {{"B", 4}, {"Q", 1}});
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.status().message(), "unknown symbol 'Q'");

  values = BindSymbols(symbols, {{"Z", 4}, {"Q", 1}, {"S", 2}});
  EXPECT_EQ(values.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(values.status().message(), "unknown symbols 'Q', 'Z'");
}

// ---------------------------------------------------------------------------
// Parsing and evaluation

TEST(ShapeExprTest, Literals) {
  EXPECT_EQ(EvalOk("0"), 0);
  EXPECT_EQ(EvalOk("42"), 42);
  EXPECT_EQ(EvalOk("9223372036854775807"), kInt64Max);
  EXPECT_EQ(EvalOk("-9223372036854775807"), -kInt64Max);
  EXPECT_EQ(EvalOk("007"), 7);
}

TEST(ShapeExprTest, PrecedenceAndAssociativity) {
  EXPECT_EQ(EvalOk("2+3*4"), 14);
  EXPECT_EQ(EvalOk("2*3+4"), 10);
  EXPECT_EQ(EvalOk("(2+3)*4"), 20);
  const Bindings abc = {{"a", 100}, {"b", 7}, {"c", 3}};
  EXPECT_EQ(EvalOk("a-b-c", abc), 90);  // (a-b)-c, not a-(b-c) = 96
  EXPECT_EQ(EvalOk("a-(b-c)", abc), 96);
  EXPECT_EQ(EvalOk("a/b/c", abc), 4);  // (100/7)/3 = 14/3, not 100/2
  EXPECT_EQ(EvalOk("a/(b/c)", abc), 50);
  EXPECT_EQ(EvalOk("a*b/c", abc), 233);  // (700)/3
  EXPECT_EQ(EvalOk("a/c*b", abc), 231);  // (33)*7
  EXPECT_EQ(EvalOk("a-b+c", abc), 96);
  EXPECT_EQ(EvalOk("a+b*c-a/b", abc), 100 + 21 - 14);
}

TEST(ShapeExprTest, UnaryMinus) {
  EXPECT_EQ(EvalOk("-x + 3", {{"x", 5}}), -2);
  EXPECT_EQ(EvalOk("--x", {{"x", 5}}), 5);
  EXPECT_EQ(EvalOk("a*-b", {{"a", 3}, {"b", 4}}), -12);
  EXPECT_EQ(EvalOk("a - -b", {{"a", 3}, {"b", 4}}), 7);
  EXPECT_EQ(EvalOk("a--b", {{"a", 3}, {"b", 4}}), 7);
  EXPECT_EQ(EvalOk("-(a+b)", {{"a", 3}, {"b", 4}}), -7);
  // Unary minus binds tighter than '/': -a/b is (-a)/b.
  EXPECT_EQ(EvalOk("-a/b", {{"a", 7}, {"b", 2}}), -4);
  EXPECT_EQ(EvalOk("-(a/b)", {{"a", 7}, {"b", 2}}), -3);
}

TEST(ShapeExprTest, WhitespaceIsIgnored) {
  EXPECT_EQ(EvalOk("  2 *\tB\n+ ( S\r)  ", {{"B", 3}, {"S", 4}}), 10);
  EXPECT_EQ(EvalOk("min ( a , b )", {{"a", 3}, {"b", 4}}), 3);
}

TEST(ShapeExprTest, IdentifiersWithDigitsAndUnderscores) {
  EXPECT_EQ(EvalOk("_x1 * head_dim2", {{"_x1", 3}, {"head_dim2", 64}}), 192);
  // Function names are only special when called, and only in lower case.
  EXPECT_EQ(EvalOk("MIN + ceiling", {{"MIN", 1}, {"ceiling", 2}}), 3);
}

// '/' is floor division: it rounds toward negative infinity (like Python's
// //), so it differs from C++'s truncating '/' when the signs differ.
// ceil(a/b) and cdiv(a, b) round toward positive infinity.
TEST(ShapeExprTest, FloorAndCeilDivisionWithNegatives) {
  struct Case {
    int64_t a, b, floor, ceil;
  };
  const Case cases[] = {
      {7, 2, 3, 4},
      {-7, 2, -4, -3},
      {7, -2, -4, -3},
      {-7, -2, 3, 4},
      {6, 2, 3, 3},
      {-6, 2, -3, -3},
      {6, -2, -3, -3},
      {-6, -2, 3, 3},
      {0, 5, 0, 0},
      {1, 5, 0, 1},
      {-1, 5, -1, 0},
      {5, 1, 5, 5},
      {kInt64Min, 2, kInt64Min / 2, kInt64Min / 2},
      {kInt64Max, 2, kInt64Max / 2, kInt64Max / 2 + 1},
      {kInt64Min, kInt64Max, -2, -1},
      {kInt64Max, kInt64Min, -1, 0},
  };
  for (const Case& c : cases) {
    const Bindings ab = {{"a", c.a}, {"b", c.b}};
    EXPECT_EQ(EvalOk("a/b", ab), c.floor) << c.a << "/" << c.b;
    EXPECT_EQ(EvalOk("ceil(a/b)", ab), c.ceil) << c.a << "/" << c.b;
    EXPECT_EQ(EvalOk("cdiv(a, b)", ab), c.ceil) << c.a << "/" << c.b;
  }
  // Constant-folded divisions follow the same rules.
  EXPECT_EQ(EvalOk("-7/2"), -4);
  EXPECT_EQ(EvalOk("7/-2"), -4);
  EXPECT_EQ(EvalOk("ceil(-7/2)"), -3);
  EXPECT_EQ(EvalOk("cdiv(7, 2)"), 4);
}

TEST(ShapeExprTest, CeilPadsToMultiple) {
  for (auto [c, want] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {1, 256}, {255, 256}, {256, 256}, {257, 512}}) {
    EXPECT_EQ(EvalOk("ceil(C/256)*256", {{"C", c}}), want) << c;
  }
  // Only the top-level division of the argument is rounded up; parentheses
  // around it are fine.
  EXPECT_EQ(EvalOk("ceil((a/b))", {{"a", 7}, {"b", 2}}), 4);
  EXPECT_EQ(EvalOk("ceil(a/b/c)", {{"a", 7}, {"b", 2}, {"c", 2}}),
            2);  // ceil(3/2)
  EXPECT_EQ(EvalOk("ceil(a/(b*c))", {{"a", 7}, {"b", 2}, {"c", 2}}), 2);
  EXPECT_EQ(EvalOk("ceil(a*b/c)", {{"a", 3}, {"b", 3}, {"c", 2}}), 5);
}

TEST(ShapeExprTest, MinMax) {
  EXPECT_EQ(EvalOk("min(S, 128)", {{"S", 100}}), 100);
  EXPECT_EQ(EvalOk("min(S, 128)", {{"S", 1000}}), 128);
  EXPECT_EQ(EvalOk("max(a,b,c)", {{"a", 3}, {"b", 9}, {"c", -4}}), 9);
  EXPECT_EQ(EvalOk("min(a,b,c)", {{"a", 3}, {"b", 9}, {"c", -4}}), -4);
  EXPECT_EQ(EvalOk("max(min(a, b), cdiv(a + b, 2)) * 2", {{"a", 3}, {"b", 9}}),
            12);
  EXPECT_EQ(EvalOk("min(1,2,3,4,5,6,7,8,9,-10)"), -10);
}

TEST(ShapeExprTest, RealisticShapes) {
  const Bindings dims = {{"F", 1},  {"B", 8},  {"C", 1000},
                         {"S", 24}, {"KV", 8}, {"HD", 128}};
  EXPECT_EQ(EvalOk("B*S", dims), 192);
  EXPECT_EQ(EvalOk("2*F*B*(C+S)*KV*HD", dims), 2 * 1 * 8 * 1024 * 8 * 128);
}

TEST(ShapeExprTest, ConstantsAndFolding) {
  ShapeExpr zero;
  EXPECT_TRUE(zero.is_constant());
  EXPECT_EQ(zero.constant_value(), 0);
  EXPECT_EQ(zero.text(), "0");

  ShapeExpr c = ShapeExpr::Constant(-5);
  EXPECT_TRUE(c.is_constant());
  EXPECT_EQ(c.constant_value(), -5);
  EXPECT_EQ(c.text(), "-5");
  EXPECT_THAT(c.symbols(), IsEmpty());
  EXPECT_EQ(c.Evaluate(SymbolValues(0)).value(), -5);

  SymbolTable symbols;
  absl::StatusOr<ShapeExpr> e =
      ShapeExpr::Parse("min(3, 4) * (2 + -1)", &symbols);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->is_constant());
  EXPECT_EQ(e->constant_value(), 3);
  EXPECT_EQ(e->text(), "min(3, 4) * (2 + -1)");
  EXPECT_EQ(symbols.size(), 0u);

  // A literal-only expression whose evaluation fails is not constant.
  e = ShapeExpr::Parse("1/0", &symbols);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE(e->is_constant());
  EXPECT_EQ(e->constant_value(), std::nullopt);
  EXPECT_EQ(e->Evaluate(SymbolValues(0)).status().code(),
            absl::StatusCode::kInvalidArgument);

  e = ShapeExpr::Parse("2*x", &symbols);
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(e->is_constant());
  EXPECT_EQ(e->constant_value(), std::nullopt);

  // A null symbol table is fine when there are no symbols.
  e = ShapeExpr::Parse("ceil(10/4)", nullptr);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->constant_value(), 3);
  e = ShapeExpr::Parse("x+1", nullptr);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShapeExprTest, SymbolsListedInFirstAppearanceOrder) {
  SymbolTable symbols;
  symbols.Intern("H");  // index 0
  absl::StatusOr<ShapeExpr> e =
      ShapeExpr::Parse("B*S + B*H + max(S, 2)", &symbols);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(symbols.size(), 3u);
  EXPECT_EQ(symbols.name(1), "B");
  EXPECT_EQ(symbols.name(2), "S");
  EXPECT_THAT(e->symbols(), ElementsAre(1, 2, 0));

  // A second expression shares the table.
  absl::StatusOr<ShapeExpr> f = ShapeExpr::Parse("S*D", &symbols);
  ASSERT_TRUE(f.ok());
  EXPECT_THAT(f->symbols(), ElementsAre(2, 3));
  EXPECT_EQ(symbols.name(3), "D");
}

TEST(ShapeExprTest, FailedParseLeavesTableUnchanged) {
  SymbolTable symbols;
  symbols.Intern("A");
  EXPECT_FALSE(ShapeExpr::Parse("X*Y*(Z", &symbols).ok());
  EXPECT_EQ(symbols.size(), 1u);
  EXPECT_EQ(symbols.Find("X"), std::nullopt);
}

TEST(ShapeExprTest, ExpressionsCanBeCopiedAndOutliveNothing) {
  SymbolValues values;
  ShapeExpr copy;
  {
    SymbolTable symbols;
    ShapeExpr e = ShapeExpr::Parse("B*S", &symbols).value();
    copy = e;
    values = BindSymbols(symbols, {{"B", 2}}).value();
  }
  // The unbound-symbol message still knows the name after the table is gone.
  EXPECT_EQ(copy.Evaluate(values).status().message(),
            "shape expression 'B*S': symbol 'S' is not bound");
  values.Set(1, 5);
  EXPECT_EQ(copy.Evaluate(values).value(), 10);
}

// ---------------------------------------------------------------------------
// Parse errors

TEST(ShapeExprParseErrorTest, SyntaxErrorsGiveColumn) {
  EXPECT_EQ(ParseError("B*(S"),
            "shape expression 'B*(S': expected ')' at column 5");
  EXPECT_EQ(ParseError("B*"),
            "shape expression 'B*': expected a number, symbol or '(', found "
            "the end of the expression at column 3");
  EXPECT_EQ(ParseError(""),
            "shape expression '': expected a number, symbol or '(', found the "
            "end of the expression at column 1");
  EXPECT_EQ(ParseError("B + # 2"),
            "shape expression 'B + # 2': expected a number, symbol or '(', "
            "found '#' at column 5");
  EXPECT_EQ(
      ParseError("B S"),
      "shape expression 'B S': expected an operator, found 'S' at column 3");
  EXPECT_EQ(
      ParseError("2x"),
      "shape expression '2x': expected an operator, found 'x' at column 2");
  EXPECT_EQ(ParseError("B)"),
            "shape expression 'B)': unbalanced ')' at column 2");
  EXPECT_EQ(ParseError("(B))"),
            "shape expression '(B))': unbalanced ')' at column 4");
  EXPECT_EQ(ParseError("()"),
            "shape expression '()': expected a number, symbol or '(', found "
            "')' at column 2");
  EXPECT_EQ(ParseError("a ** b"),
            "shape expression 'a ** b': expected a number, symbol or '(', "
            "found '*' at column 4");
  EXPECT_EQ(ParseError("+a"),
            "shape expression '+a': expected a number, symbol or '(', found "
            "'+' at column 1");
  EXPECT_EQ(
      ParseError("a, b"),
      "shape expression 'a, b': expected an operator, found ',' at column 2");
  EXPECT_EQ(ParseError("99999999999999999999 * B"),
            "shape expression '99999999999999999999 * B': integer literal "
            "'99999999999999999999' does not fit in int64 at column 1");
  EXPECT_EQ(ParseError("1 + 9223372036854775808"),
            "shape expression '1 + 9223372036854775808': integer literal "
            "'9223372036854775808' does not fit in int64 at column 5");
}

TEST(ShapeExprParseErrorTest, FunctionErrors) {
  EXPECT_EQ(ParseError("foo(1)"),
            "shape expression 'foo(1)': unknown function 'foo' (known: ceil, "
            "cdiv, min, max) at column 1");
  EXPECT_EQ(ParseError("2 * Ceil (C/2)"),
            "shape expression '2 * Ceil (C/2)': unknown function 'Ceil' "
            "(known: ceil, cdiv, min, max) at column 5");
  EXPECT_EQ(ParseError("ceil(C)"),
            "shape expression 'ceil(C)': ceil expects a division such as "
            "ceil(C/256) at column 6");
  EXPECT_EQ(ParseError("ceil( C/2*2)"),
            "shape expression 'ceil( C/2*2)': ceil expects a division such as "
            "ceil(C/256) at column 7");
  EXPECT_EQ(ParseError("ceil(-(C/2))"),
            "shape expression 'ceil(-(C/2))': ceil expects a division such as "
            "ceil(C/256) at column 6");
  EXPECT_EQ(ParseError("ceil(C/2, 3)"),
            "shape expression 'ceil(C/2, 3)': ceil expects 1 argument, got 2 "
            "at column 1");
  EXPECT_EQ(ParseError("ceil()"),
            "shape expression 'ceil()': ceil expects 1 argument, got 0 at "
            "column 1");
  EXPECT_EQ(ParseError("cdiv(C)"),
            "shape expression 'cdiv(C)': cdiv expects 2 arguments, got 1 at "
            "column 1");
  EXPECT_EQ(ParseError("cdiv(a,b,c)"),
            "shape expression 'cdiv(a,b,c)': cdiv expects 2 arguments, got 3 "
            "at column 1");
  EXPECT_EQ(ParseError("1+min(S)"),
            "shape expression '1+min(S)': min expects at least 2 arguments, "
            "got 1 at column 3");
  EXPECT_EQ(ParseError("max()"),
            "shape expression 'max()': max expects at least 2 arguments, got "
            "0 at column 1");
  EXPECT_EQ(ParseError("min(a b)"),
            "shape expression 'min(a b)': expected ',' or ')' at column 7");
  EXPECT_EQ(ParseError("min(a,"),
            "shape expression 'min(a,': expected a number, symbol or '(', "
            "found the end of the expression at column 7");
  EXPECT_EQ(ParseError("min(a,)"),
            "shape expression 'min(a,)': expected a number, symbol or '(', "
            "found ')' at column 7");
  EXPECT_EQ(ParseError("min + 1"),
            "shape expression 'min + 1': function 'min' needs arguments, as in "
            "min(...) at column 1");
}

TEST(ShapeExprParseErrorTest, NestingAndStackLimits) {
  const int n = ShapeExpr::kMaxNesting;
  std::string ok = std::string(n, '(') + "a" + std::string(n, ')');
  EXPECT_EQ(ParseError(ok), "");
  std::string deep = std::string(n + 1, '(') + "a" + std::string(n + 1, ')');
  EXPECT_THAT(ParseError(deep), HasSubstr("nests more than 128 levels deep"));
  EXPECT_THAT(ParseError(std::string(1000, '-') + "a"),
              HasSubstr("nests more than 128 levels deep"));
  // Right-nested sums need one stack slot per level.
  std::string right = "a";
  for (int i = 0; i < ShapeExpr::kMaxStackDepth + 5; ++i) {
    right = absl::StrCat("a+(", right, ")");
  }
  EXPECT_THAT(ParseError(right), HasSubstr("too complex"));
  std::string many_args = "min(a";
  for (int i = 0; i < ShapeExpr::kMaxStackDepth; ++i)
    absl::StrAppend(&many_args, ",a");
  EXPECT_THAT(ParseError(many_args + ")"), HasSubstr("too complex"));
  // ...unless they are literals, which fold away.
  std::string many_literals = "min(1";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&many_literals, ",", i);
  EXPECT_EQ(EvalOk(many_literals + ")"), 0);
  // Long left-associative chains need no depth at all.
  std::string chain = "a";
  for (int i = 0; i < 100000; ++i) chain += "+a";
  EXPECT_EQ(EvalOk(chain, {{"a", 2}}), 200002);
}

// ---------------------------------------------------------------------------
// Evaluation errors

TEST(ShapeExprEvalErrorTest, UnboundSymbol) {
  absl::StatusOr<int64_t> v = Eval("B*S", {{"B", 2}});
  EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(v.status().message(),
            "shape expression 'B*S': symbol 'S' is not bound");

  // Values made before a symbol was interned do not cover it.
  SymbolTable symbols;
  ShapeExpr b = ShapeExpr::Parse("B", &symbols).value();
  SymbolValues values = BindSymbols(symbols, {{"B", 3}}).value();
  ShapeExpr bs = ShapeExpr::Parse("B*S", &symbols).value();
  EXPECT_EQ(b.Evaluate(values).value(), 3);
  EXPECT_EQ(bs.Evaluate(values).status().message(),
            "shape expression 'B*S': symbol 'S' is not bound");
}

TEST(ShapeExprEvalErrorTest, DivisionByZero) {
  for (const char* text :
       {"a/b", "ceil(a/b)", "cdiv(a, b)", "1/0", "cdiv(1,0)"}) {
    absl::StatusOr<int64_t> v = Eval(text, {{"a", 5}, {"b", 0}});
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(v.status().message(),
                HasSubstr(absl::StrCat("shape expression '", text,
                                       "': division by zero")));
  }
}

TEST(ShapeExprEvalErrorTest, Overflow) {
  const Bindings big = {
      {"a", kInt64Max}, {"b", 2}, {"m", kInt64Min}, {"n", -1}};
  struct Case {
    const char* text;
    const char* what;
  };
  for (const Case& c : {Case{"a*b", "multiplication"}, Case{"a+b", "addition"},
                        Case{"m-b", "subtraction"}, Case{"-m", "negation"},
                        Case{"m/n", "division"}, Case{"ceil(m/n)", "division"},
                        Case{"9223372036854775807 + 1", "addition"},
                        Case{"-9223372036854775807 - 2", "subtraction"},
                        Case{"min(a*a, 1)", "multiplication"}}) {
    absl::StatusOr<int64_t> v = Eval(c.text, big);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kOutOfRange) << c.text;
    EXPECT_EQ(v.status().message(),
              absl::StrCat("shape expression '", c.text,
                           "': int64 overflow in ", c.what));
  }
  // Just inside the range.
  EXPECT_EQ(EvalOk("m + a", big), -1);
  EXPECT_EQ(EvalOk("-a - 1", big), kInt64Min);
  EXPECT_EQ(EvalOk("m / 1", big), kInt64Min);
}

// ---------------------------------------------------------------------------
// Shapes

class ShapeTest : public ::testing::Test {
 protected:
  Shape Dims(std::initializer_list<const char*> texts) {
    Shape shape;
    for (const char* text : texts) {
      shape.push_back(ShapeExpr::Parse(text, &symbols_).value());
    }
    return shape;
  }
  SymbolValues Bind(const Bindings& named) {
    return BindSymbols(symbols_, named).value();
  }
  SymbolTable symbols_;
};

TEST_F(ShapeTest, EvaluateShape) {
  Shape shape = Dims({"B", "S", "C-S", "ceil(C/256)*256"});
  absl::StatusOr<std::vector<int64_t>> dims =
      EvaluateShape(shape, Bind({{"B", 2}, {"S", 3}, {"C", 300}}));
  ASSERT_TRUE(dims.ok()) << dims.status();
  EXPECT_THAT(*dims, ElementsAre(2, 3, 297, 512));
  EXPECT_EQ(NumElements(shape, Bind({{"B", 2}, {"S", 3}, {"C", 300}})).value(),
            2 * 3 * 297 * 512);
}

TEST_F(ShapeTest, RejectsNonPositiveDimensions) {
  Shape shape = Dims({"B", "S", "C-S"});
  absl::StatusOr<std::vector<int64_t>> dims =
      EvaluateShape(shape, Bind({{"B", 2}, {"S", 8}, {"C", 5}}));
  EXPECT_EQ(dims.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dims.status().message(),
            "dimension 2 ('C-S') evaluated to -3; dimensions must be positive");
  dims = EvaluateShape(shape, Bind({{"B", 2}, {"S", 8}, {"C", 8}}));
  EXPECT_EQ(dims.status().message(),
            "dimension 2 ('C-S') evaluated to 0; dimensions must be positive");
  EXPECT_EQ(NumElements(shape, Bind({{"B", 2}, {"S", 8}, {"C", 8}}))
                .status()
                .message(),
            "dimension 2 ('C-S') evaluated to 0; dimensions must be positive");
}

TEST_F(ShapeTest, PropagatesEvaluationErrorsWithDimension) {
  Shape shape = Dims({"B", "S"});
  absl::StatusOr<std::vector<int64_t>> dims =
      EvaluateShape(shape, Bind({{"B", 2}}));
  EXPECT_EQ(dims.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dims.status().message(),
            "dimension 1: shape expression 'S': symbol 'S' is not bound");
}

TEST_F(ShapeTest, NumElementsOverflowAndScalar) {
  Shape shape = Dims({"B", "B", "B"});
  absl::StatusOr<int64_t> n =
      NumElements(shape, Bind({{"B", int64_t{1} << 22}}));
  EXPECT_EQ(n.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(n.status().message(),
            "number of elements of shape [B, B, B] = [4194304, 4194304, "
            "4194304] overflows int64");
  EXPECT_EQ(NumElements(shape, Bind({{"B", int64_t{1} << 21}})).status().code(),
            absl::StatusCode::kOutOfRange);  // 2^63
  EXPECT_EQ(NumElements(shape, Bind({{"B", int64_t{1} << 20}})).value(),
            int64_t{1} << 60);
  EXPECT_EQ(NumElements(Shape{}, SymbolValues(0)).value(), 1);
  EXPECT_EQ(NumElements(std::vector<int64_t>{}).value(), 1);
  EXPECT_EQ(NumElements(std::vector<int64_t>{3, 4, 5}).value(), 60);
  EXPECT_EQ(NumElements(std::vector<int64_t>{kInt64Max, 2}).status().code(),
            absl::StatusCode::kOutOfRange);
}

// ---------------------------------------------------------------------------
// Randomized comparison against a recursive reference evaluator.

struct RefNode {
  enum Kind {
    kConst,
    kSym,
    kNeg,
    kAdd,
    kSub,
    kMul,
    kDiv,
    kCeil,
    kCdiv,
    kMin,
    kMax
  };
  Kind kind;
  int64_t value = 0;  // kConst (non-negative; negatives come from kNeg)
  std::string name;   // kSym
  std::vector<std::unique_ptr<RefNode>> kids;
};

// Result of the reference evaluator: a value or the kind of failure.
struct RefResult {
  enum Kind { kOk, kUnbound, kDivByZero, kOverflow } kind = kOk;
  int64_t value = 0;
};

RefResult Fits(__int128 v) {
  if (v < kInt64Min || v > kInt64Max) return {RefResult::kOverflow, 0};
  return {RefResult::kOk, static_cast<int64_t>(v)};
}

// Evaluates children left to right and reports the first failure, which is
// the order the postfix program runs in.
RefResult RefEval(const RefNode& node, const Bindings& env) {
  switch (node.kind) {
    case RefNode::kConst:
      return {RefResult::kOk, node.value};
    case RefNode::kSym: {
      auto it = env.find(node.name);
      if (it == env.end()) return {RefResult::kUnbound, 0};
      return {RefResult::kOk, it->second};
    }
    default:
      break;
  }
  std::vector<__int128> args;
  for (const auto& kid : node.kids) {
    RefResult r = RefEval(*kid, env);
    if (r.kind != RefResult::kOk) return r;
    args.push_back(r.value);
  }
  switch (node.kind) {
    case RefNode::kNeg:
      return Fits(-args[0]);
    case RefNode::kAdd:
      return Fits(args[0] + args[1]);
    case RefNode::kSub:
      return Fits(args[0] - args[1]);
    case RefNode::kMul:
      return Fits(args[0] * args[1]);
    case RefNode::kDiv:
    case RefNode::kCeil:
    case RefNode::kCdiv: {
      const __int128 a = args[0], b = args[1];
      if (b == 0) return {RefResult::kDivByZero, 0};
      __int128 q = a / b;
      const bool exact = q * b == a;
      const bool negative = (a < 0) != (b < 0);
      if (!exact && node.kind == RefNode::kDiv && negative) q -= 1;
      if (!exact && node.kind != RefNode::kDiv && !negative) q += 1;
      return Fits(q);
    }
    case RefNode::kMin: {
      __int128 m = args[0];
      for (__int128 a : args) m = a < m ? a : m;
      return Fits(m);
    }
    case RefNode::kMax: {
      __int128 m = args[0];
      for (__int128 a : args) m = a > m ? a : m;
      return Fits(m);
    }
    default:
      return {RefResult::kOk, 0};
  }
}

class RandomExprGen {
 public:
  explicit RandomExprGen(uint64_t seed) : rng_(seed) {}

  int Uniform(int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng_);
  }
  bool Chance(double p) { return std::bernoulli_distribution(p)(rng_); }

  int64_t Value() {
    switch (Uniform(0, 9)) {
      case 0:
        return 0;
      case 1:
        return std::uniform_int_distribution<int64_t>(kInt64Min,
                                                      kInt64Max)(rng_);
      case 2:
        return Chance(0.5) ? kInt64Max - Uniform(0, 3)
                           : kInt64Min + Uniform(0, 3);
      case 3:
        return std::uniform_int_distribution<int64_t>(-(int64_t{1} << 32),
                                                      int64_t{1} << 32)(rng_);
      default:
        return Uniform(-40, 40);
    }
  }

  std::unique_ptr<RefNode> Gen(int depth) {
    auto node = std::make_unique<RefNode>();
    if (depth == 0 || Chance(0.25)) {
      if (Chance(0.5)) {
        node->kind = RefNode::kConst;
        node->value = Chance(0.9)
                          ? Uniform(0, 50)
                          : (Chance(0.5) ? kInt64Max : int64_t{1} << 40);
      } else {
        node->kind = RefNode::kSym;
        static const char* const kNames[] = {"a", "b",   "c",
                                             "B", "S_1", "unbound"};
        node->name = kNames[Chance(0.03) ? 5 : Uniform(0, 4)];
      }
      return node;
    }
    static const RefNode::Kind kOps[] = {
        RefNode::kNeg, RefNode::kAdd,  RefNode::kSub,  RefNode::kMul,
        RefNode::kDiv, RefNode::kCeil, RefNode::kCdiv, RefNode::kMin,
        RefNode::kMax, RefNode::kAdd,  RefNode::kMul,  RefNode::kDiv};
    node->kind = kOps[Uniform(0, std::size(kOps) - 1)];
    int arity = 2;
    if (node->kind == RefNode::kNeg) arity = 1;
    if (node->kind == RefNode::kMin || node->kind == RefNode::kMax) {
      arity = Uniform(2, 4);
    }
    for (int i = 0; i < arity; ++i) node->kids.push_back(Gen(depth - 1));
    return node;
  }

  // Renders with the parentheses precedence needs, plus random extra ones
  // and random whitespace. Returns the text; *prec is 1 for + -, 2 for * /,
  // 3 for unary minus and 4 for atoms.
  std::string Render(const RefNode& node, int* prec) {
    std::string text = RenderBare(node, prec);
    if (Chance(0.05)) {
      *prec = 4;
      return absl::StrCat("(", Space(), text, Space(), ")");
    }
    return text;
  }

 private:
  std::string Space() { return Chance(0.2) ? (Chance(0.5) ? " " : "\t ") : ""; }

  std::string Operand(const RefNode& node, int min_prec) {
    int p = 0;
    std::string text = Render(node, &p);
    if (p < min_prec) return absl::StrCat("(", text, ")");
    return text;
  }

  std::string Args(const RefNode& node) {
    std::string out;
    for (size_t i = 0; i < node.kids.size(); ++i) {
      int p = 0;
      absl::StrAppend(&out, i == 0 ? "" : ",", Space(),
                      Render(*node.kids[i], &p), Space());
    }
    return out;
  }

  std::string RenderBare(const RefNode& node, int* prec) {
    auto binary = [&](const char* op, int p) {
      *prec = p;
      // Left-associative: the right operand needs parentheses at equal
      // precedence.
      return absl::StrCat(Operand(*node.kids[0], p), Space(), op, Space(),
                          Operand(*node.kids[1], p + 1));
    };
    switch (node.kind) {
      case RefNode::kConst:
        *prec = 4;
        return absl::StrCat(node.value);
      case RefNode::kSym:
        *prec = 4;
        return node.name;
      case RefNode::kNeg:
        *prec = 3;
        return absl::StrCat("-", Space(), Operand(*node.kids[0], 3));
      case RefNode::kAdd:
        return binary("+", 1);
      case RefNode::kSub:
        return binary("-", 1);
      case RefNode::kMul:
        return binary("*", 2);
      case RefNode::kDiv:
        return binary("/", 2);
      case RefNode::kCeil:
        *prec = 4;
        return absl::StrCat("ceil(", Space(), Operand(*node.kids[0], 2),
                            Space(), "/", Space(), Operand(*node.kids[1], 3),
                            Space(), ")");
      case RefNode::kCdiv:
        *prec = 4;
        return absl::StrCat("cdiv(", Args(node), ")");
      case RefNode::kMin:
        *prec = 4;
        return absl::StrCat("min(", Args(node), ")");
      case RefNode::kMax:
        *prec = 4;
        return absl::StrCat("max(", Args(node), ")");
    }
    return "";
  }

  std::mt19937_64 rng_;
};

TEST(ShapeExprRandomTest, MatchesReferenceEvaluator) {
  RandomExprGen gen(/*seed=*/0x5eed5eed);
  SymbolTable symbols;  // shared, as in the real graph
  int counts[4] = {0, 0, 0, 0};
  constexpr int kIterations = 20000;
  for (int iter = 0; iter < kIterations; ++iter) {
    std::unique_ptr<RefNode> tree = gen.Gen(gen.Uniform(0, 6));
    int prec = 0;
    const std::string text = gen.Render(*tree, &prec);
    Bindings env;
    for (const char* name : {"a", "b", "c", "B", "S_1"})
      env[name] = gen.Value();

    absl::StatusOr<ShapeExpr> expr = ShapeExpr::Parse(text, &symbols);
    ASSERT_TRUE(expr.ok()) << text << ": " << expr.status();
    EXPECT_EQ(expr->text(), text);
    SymbolValues values(symbols.size());
    for (const auto& [name, value] : env) {
      if (std::optional<int> sym = symbols.Find(name)) values.Set(*sym, value);
    }

    const RefResult want = RefEval(*tree, env);
    ++counts[want.kind];
    const absl::StatusOr<int64_t> got = expr->Evaluate(values);
    const std::string context =
        absl::StrCat(text, " with a=", env["a"], " b=", env["b"],
                     " c=", env["c"], " B=", env["B"], " S_1=", env["S_1"]);
    switch (want.kind) {
      case RefResult::kOk:
        ASSERT_TRUE(got.ok()) << context << ": " << got.status();
        EXPECT_EQ(*got, want.value) << context;
        if (expr->is_constant()) {
          EXPECT_EQ(expr->constant_value(), want.value) << context;
        }
        break;
      case RefResult::kUnbound:
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
            << context;
        EXPECT_THAT(got.status().message(), HasSubstr("'unbound' is not bound"))
            << context;
        break;
      case RefResult::kDivByZero:
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument)
            << context;
        EXPECT_THAT(got.status().message(), HasSubstr("division by zero"))
            << context;
        break;
      case RefResult::kOverflow:
        EXPECT_EQ(got.status().code(), absl::StatusCode::kOutOfRange)
            << context;
        break;
    }
  }
  // Make sure the generator exercises every outcome, mostly successes.
  EXPECT_GT(counts[RefResult::kOk], kIterations / 3);
  EXPECT_GT(counts[RefResult::kUnbound], 50);
  EXPECT_GT(counts[RefResult::kDivByZero], 50);
  EXPECT_GT(counts[RefResult::kOverflow], 50);
}

}  // namespace
}  // namespace slicesched
