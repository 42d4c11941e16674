// Symbolic shape expressions for the Global Mapping Graph.
//
// A ShapeExpr is an int64 expression over named symbols, e.g. the size of a
// KV cache `2*F*B*(C+S)*KV*HD` or a padded length `ceil(C/256)*256`. It is
// parsed once, with every identifier resolved against a SymbolTable, and
// compiled to a flat postfix program; Evaluate then runs that program on a
// small fixed stack with no string lookups and no heap allocation (except
// to build an error status).
//
// Grammar (whitespace between tokens is ignored):
//
//   expr    := term (('+' | '-') term)*
//   term    := unary (('*' | '/') unary)*
//   unary   := '-' unary | primary
//   primary := INT | IDENT | IDENT '(' expr (',' expr)* ')' | '(' expr ')'
//   INT     := [0-9]+               (must fit in int64)
//   IDENT   := [A-Za-z_][A-Za-z0-9_]*
//
// Binary operators are left-associative: a-b-c is (a-b)-c and a/b/c is
// (a/b)/c. Unary minus binds tighter than '*' and '/', so -a/b is (-a)/b.
// There is no implicit multiplication: `2x` is a syntax error.
//
// Semantics:
//   a / b       FLOOR division (rounds toward negative infinity, like Python's
//               //, unlike C++'s `/`): 7/2 = 3, -7/2 = -4, 7/-2 = -4.
//   ceil(X/Y)   ceiling division (rounds toward positive infinity):
//               ceil(7/2) = 4, ceil(-7/2) = -3. The argument must be a
//               division at its top level (ceil(C/256), not ceil(C)); only
//               that top-level division is rounded up, so ceil(a/b/c) is
//               ceil((a/b)/c) with a/b floored.
//   cdiv(a, b)  same as ceil(a/b).
//   min(a, b, ...), max(a, b, ...)   two or more arguments.
//
// Function names (ceil, cdiv, min, max) are reserved and lower-case only; any
// other identifier followed by '(' is an error ("unknown function").
// Negative literals are written with unary minus, so the smallest literal
// value is -9223372036854775807.
//
// Errors:
//   * Parse: absl::InvalidArgumentError naming the expression and the 1-based
//     column, e.g. "shape expression 'B*(S': expected ')' at column 5".
//   * Evaluate: InvalidArgumentError for an unbound symbol ("shape expression
//     'B*S': symbol 'S' is not bound") or a division by zero;
//     OutOfRangeError when +, -, *, unary minus or a division overflows int64.
//
// Thread safety: ShapeExpr is immutable after Parse and may be evaluated
// concurrently. SymbolTable and SymbolValues are not synchronized.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace slicesched {

// Interns symbol names into dense indices 0, 1, 2, ... in first-seen order.
class SymbolTable {
 public:
  SymbolTable() = default;

  // Returns the index of `name`, adding it if it is new.
  int Intern(std::string_view name);
  // Returns the index of `name`, or nullopt if it was never interned.
  std::optional<int> Find(std::string_view name) const;
  // The name of symbol `index`; requires 0 <= index < size().
  const std::string& name(int index) const { return names_[index]; }
  size_t size() const { return names_.size(); }

 private:
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, int> index_;
};

// Values bound to the symbols of a SymbolTable, indexed by symbol index.
class SymbolValues {
 public:
  SymbolValues() = default;
  // `n` symbols, all unbound (normally n = SymbolTable::size()).
  explicit SymbolValues(size_t n) : values_(n, 0), bound_(n, 0) {}

  // Binds symbol `sym` (>= 0) to `value`. Grows the table if `sym` >= size(),
  // so symbols interned after this object was made can still be bound.
  void Set(int sym, int64_t value);
  // Unbinds symbol `sym`; no-op if it is out of range.
  void Unset(int sym);
  // False for symbols out of range.
  bool IsBound(int sym) const {
    return sym >= 0 && static_cast<size_t>(sym) < bound_.size() &&
           bound_[sym] != 0;
  }
  // The value of `sym`, or 0 if it is not bound.
  int64_t Get(int sym) const { return IsBound(sym) ? values_[sym] : 0; }
  size_t size() const { return values_.size(); }

 private:
  friend class ShapeExpr;  // Reads the arrays directly in Evaluate.

  std::vector<int64_t> values_;
  std::vector<uint8_t> bound_;
};

// Builds SymbolValues from names. Fails with InvalidArgumentError
// ("unknown symbol 'Q'") if a name is not in `symbols`.
absl::StatusOr<SymbolValues> BindSymbols(
    const SymbolTable& symbols,
    const absl::flat_hash_map<std::string, int64_t>& named);

class ShapeExpr {
 public:
  // Deepest evaluation stack an expression may need; Parse rejects more.
  static constexpr int kMaxStackDepth = 64;
  // Deepest nesting of parentheses, calls and unary minus Parse accepts.
  static constexpr int kMaxNesting = 128;

  // The constant 0.
  ShapeExpr();

  // Parses `text`. On success every identifier in it has been interned in
  // `*symbols`; on failure `*symbols` is unchanged. `symbols` may be null
  // only if `text` contains no identifiers. Sub-expressions made only of
  // literals are folded at parse time (unless evaluating them fails).
  static absl::StatusOr<ShapeExpr> Parse(std::string_view text,
                                         SymbolTable* symbols);
  // The constant `value`; text() is its decimal form.
  static ShapeExpr Constant(int64_t value);

  // Evaluates the expression with `values` (indexed by symbol index).
  absl::StatusOr<int64_t> Evaluate(const SymbolValues& values) const;

  // The text given to Parse, or the decimal value for Constant.
  const std::string& text() const { return text_; }
  // True if the expression folded to a single value: it references no
  // symbols and evaluating it cannot fail (so "1/0" is not constant).
  bool is_constant() const {
    return program_.size() == 1 && program_.front().op == Op::kPushConst;
  }
  std::optional<int64_t> constant_value() const {
    if (!is_constant()) return std::nullopt;
    return program_.front().imm;
  }
  // Indices of the symbols referenced, without duplicates, in order of first
  // appearance in the text.
  std::vector<int> symbols() const { return symbols_; }

 private:
  enum class Op : uint8_t {
    kPushConst,  // push imm
    kPushSym,    // push value of symbol arg
    kNeg,
    kAdd,
    kSub,
    kMul,
    kDiv,      // floor division
    kCeilDiv,  // ceiling division
    kMin,      // pops arg values, pushes the smallest
    kMax,      // pops arg values, pushes the largest
  };
  struct Instr {
    Op op;
    int32_t arg;  // symbol index (kPushSym) or arity (kMin, kMax)
    int64_t imm;  // value (kPushConst)
  };
  class Parser;

  // Why applying an op failed.
  enum class Fault : uint8_t { kNone, kDivByZero, kOverflow };

  // Applies a non-push op to its `n` operands args[0..n) (n is 1 for kNeg,
  // 2 for the binary ops, the arity for kMin and kMax) and stores the result
  // in *out (which may alias args). Shared by Evaluate and constant folding.
  static Fault Apply(Op op, const int64_t* args, int n, int64_t* out);
  absl::Status FaultError(Fault fault, Op op) const;
  absl::Status UnboundError(int sym) const;

  std::string text_;
  std::vector<Instr> program_;
  std::vector<int> symbols_;               // referenced, first-seen order
  std::vector<std::string> symbol_names_;  // parallel to symbols_
};

// A tensor shape: one expression per dimension.
using Shape = std::vector<ShapeExpr>;

// Evaluates every dimension. Fails if one fails (the message says which
// dimension, 0-based) or is not positive: "dimension 2 ('C-S') evaluated to
// -3; dimensions must be positive".
absl::StatusOr<std::vector<int64_t>> EvaluateShape(
    std::span<const ShapeExpr> dims, const SymbolValues& values);

// Product of the evaluated dimensions (1 for a scalar shape). Fails like
// EvaluateShape, or with OutOfRangeError if the product overflows int64.
absl::StatusOr<int64_t> NumElements(std::span<const ShapeExpr> dims,
                                    const SymbolValues& values);
// Product of already evaluated dimensions, with the same overflow check.
absl::StatusOr<int64_t> NumElements(std::span<const int64_t> dims);

}  // namespace slicesched
