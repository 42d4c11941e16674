#include "slicesched/gmg/shape_expr.h"

#include <algorithm>
#include <cassert>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "slicesched/common/status.h"

namespace slicesched {
namespace {

// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view), so the std::string_view API converts at the boundary.
absl::string_view AsAbsl(std::string_view s) { return {s.data(), s.size()}; }

}  // namespace

// ---------------------------------------------------------------------------
// SymbolTable, SymbolValues, BindSymbols

int SymbolTable::Intern(std::string_view name) {
  auto it = index_.find(AsAbsl(name));
  if (it != index_.end()) return it->second;
  const int index = static_cast<int>(names_.size());
  names_.emplace_back(name);
  index_.emplace(names_.back(), index);
  return index;
}

std::optional<int> SymbolTable::Find(std::string_view name) const {
  auto it = index_.find(AsAbsl(name));
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void SymbolValues::Set(int sym, int64_t value) {
  assert(sym >= 0);
  if (sym < 0) return;
  const auto index = static_cast<size_t>(sym);
  if (index >= values_.size()) {
    values_.resize(index + 1, 0);
    bound_.resize(index + 1, 0);
  }
  values_[index] = value;
  bound_[index] = 1;
}

void SymbolValues::Unset(int sym) {
  if (sym < 0 || static_cast<size_t>(sym) >= values_.size()) return;
  values_[sym] = 0;
  bound_[sym] = 0;
}

absl::StatusOr<SymbolValues> BindSymbols(
    const SymbolTable& symbols,
    const absl::flat_hash_map<std::string, int64_t>& named) {
  SymbolValues values(symbols.size());
  std::vector<std::string> unknown;
  for (const auto& [name, value] : named) {
    std::optional<int> sym = symbols.Find(name);
    if (!sym.has_value()) {
      unknown.push_back(name);
      continue;
    }
    values.Set(*sym, value);
  }
  if (!unknown.empty()) {
    // Sorted so that the message does not depend on hash order.
    std::sort(unknown.begin(), unknown.end());
    return absl::InvalidArgumentError(absl::StrCat(
        unknown.size() == 1 ? "unknown symbol '" : "unknown symbols '",
        absl::StrJoin(unknown, "', '"), "'"));
  }
  return values;
}

// ---------------------------------------------------------------------------
// Arithmetic shared by Evaluate and constant folding.

ShapeExpr::Fault ShapeExpr::Apply(Op op, const int64_t* args, int n,
                                  int64_t* out) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  switch (op) {
    case Op::kNeg: {
      const int64_t a = args[0];
      if (a == kMin) return Fault::kOverflow;
      *out = -a;
      return Fault::kNone;
    }
    // `out` may alias `args` (Evaluate computes in place), so the operands
    // are read into locals before anything is stored.
    case Op::kAdd:
    case Op::kSub:
    case Op::kMul: {
      const int64_t a = args[0];
      const int64_t b = args[1];
      int64_t result;
      bool overflow;
      if (op == Op::kAdd) {
        overflow = __builtin_add_overflow(a, b, &result);
      } else if (op == Op::kSub) {
        overflow = __builtin_sub_overflow(a, b, &result);
      } else {
        overflow = __builtin_mul_overflow(a, b, &result);
      }
      if (overflow) return Fault::kOverflow;
      *out = result;
      return Fault::kNone;
    }
    case Op::kDiv:
    case Op::kCeilDiv: {
      const int64_t a = args[0];
      const int64_t b = args[1];
      if (b == 0) return Fault::kDivByZero;
      if (a == kMin && b == -1) return Fault::kOverflow;
      int64_t q = a / b;  // truncates toward zero
      const int64_t r = a % b;
      if (r != 0) {
        // The exact quotient is negative iff r and b have different signs.
        const bool negative = (r < 0) != (b < 0);
        if (op == Op::kDiv && negative) --q;
        if (op == Op::kCeilDiv && !negative) ++q;
      }
      *out = q;
      return Fault::kNone;
    }
    case Op::kMin:
      *out = *std::min_element(args, args + n);
      return Fault::kNone;
    case Op::kMax:
      *out = *std::max_element(args, args + n);
      return Fault::kNone;
    case Op::kPushConst:
    case Op::kPushSym:
      break;
  }
  assert(false && "Apply called with a push");
  return Fault::kNone;
}

// ---------------------------------------------------------------------------
// Parser: recursive descent straight to postfix, then constant folding.

class ShapeExpr::Parser {
 public:
  explicit Parser(std::string_view text) : text_(AsAbsl(text)) {}

  // Parses text_ into *out, interning its symbols in *symbols on success.
  absl::Status Run(SymbolTable* symbols, ShapeExpr* out) {
    SLICESCHED_RETURN_IF_ERROR(ParseExpr());
    SkipSpace();
    if (!AtEnd()) {
      if (Peek() == ')') return Error(pos_, "unbalanced ')'");
      return Error(
          pos_, absl::StrCat("expected an operator, found ", Describe(pos_)));
    }

    std::vector<Instr> program = Fold(program_);
    if (StackDepth(program) > kMaxStackDepth) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape expression '", text_,
          "': too complex; evaluating it needs a stack deeper than ",
          kMaxStackDepth));
    }
    if (!names_.empty() && symbols == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape expression '", text_, "': symbol '", names_[0],
                       "' needs a symbol table"));
    }

    // Nothing can fail from here on, so the table only changes on success.
    std::vector<int> global;
    global.reserve(names_.size());
    for (const std::string& name : names_)
      global.push_back(symbols->Intern(name));
    for (Instr& instr : program) {
      if (instr.op == Op::kPushSym) instr.arg = global[instr.arg];
    }
    out->text_ = std::string(text_);
    out->program_ = std::move(program);
    out->symbols_ = std::move(global);
    out->symbol_names_ = std::move(names_);
    return absl::OkStatus();
  }

 private:
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  static bool IsIdentStart(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  static bool IsIdentChar(char c) { return IsIdentStart(c) || IsDigit(c); }
  static bool IsSpace(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
           c == '\v';
  }

  bool AtEnd() const { return pos_ >= text_.size(); }
  // Only meaningful when !AtEnd().
  char Peek() const { return text_[pos_]; }
  bool Next(char c) const { return !AtEnd() && Peek() == c; }
  void SkipSpace() {
    while (!AtEnd() && IsSpace(Peek())) ++pos_;
  }
  std::string Describe(size_t pos) const {
    if (pos >= text_.size()) return "the end of the expression";
    return absl::StrCat("'", absl::CHexEscape(text_.substr(pos, 1)), "'");
  }

  // "shape expression '<text>': <message> at column <pos + 1>".
  absl::Status Error(size_t pos, absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape expression '", text_, "': ", message, " at column ", pos + 1));
  }

  absl::Status Enter(size_t pos) {
    if (++depth_ > kMaxNesting) {
      return Error(pos, absl::StrCat("expression nests more than ", kMaxNesting,
                                     " levels deep"));
    }
    return absl::OkStatus();
  }
  void Leave() { --depth_; }

  void Emit(Op op, int32_t arg = 0, int64_t imm = 0) {
    program_.push_back(Instr{op, arg, imm});
  }

  int LocalSymbol(absl::string_view name) {
    auto it = local_index_.find(name);
    if (it != local_index_.end()) return it->second;
    const int index = static_cast<int>(names_.size());
    names_.emplace_back(name);
    local_index_.emplace(names_.back(), index);
    return index;
  }

  // expr := term (('+' | '-') term)*
  absl::Status ParseExpr() {
    SLICESCHED_RETURN_IF_ERROR(ParseTerm());
    for (;;) {
      SkipSpace();
      if (!Next('+') && !Next('-')) return absl::OkStatus();
      const Op op = Peek() == '+' ? Op::kAdd : Op::kSub;
      ++pos_;
      SLICESCHED_RETURN_IF_ERROR(ParseTerm());
      Emit(op);
    }
  }

  // term := unary (('*' | '/') unary)*
  absl::Status ParseTerm() {
    SLICESCHED_RETURN_IF_ERROR(ParseUnary());
    for (;;) {
      SkipSpace();
      if (!Next('*') && !Next('/')) return absl::OkStatus();
      const Op op = Peek() == '*' ? Op::kMul : Op::kDiv;
      ++pos_;
      SLICESCHED_RETURN_IF_ERROR(ParseUnary());
      Emit(op);
    }
  }

  // unary := '-' unary | primary
  absl::Status ParseUnary() {
    SkipSpace();
    if (!Next('-')) return ParsePrimary();
    const size_t at = pos_++;
    SLICESCHED_RETURN_IF_ERROR(Enter(at));
    SLICESCHED_RETURN_IF_ERROR(ParseUnary());
    Leave();
    Emit(Op::kNeg);
    return absl::OkStatus();
  }

  // primary := INT | IDENT | IDENT '(' args ')' | '(' expr ')'
  absl::Status ParsePrimary() {
    SkipSpace();
    const size_t start = pos_;
    if (!AtEnd() && IsDigit(Peek())) return ParseNumber();
    if (!AtEnd() && IsIdentStart(Peek())) {
      while (!AtEnd() && IsIdentChar(Peek())) ++pos_;
      const absl::string_view name = text_.substr(start, pos_ - start);
      SkipSpace();
      if (Next('(')) return ParseCall(name, start);
      if (IsFunction(name)) {
        return Error(
            start, absl::StrCat("function '", name, "' needs arguments, as in ",
                                name, "(...)"));
      }
      Emit(Op::kPushSym, LocalSymbol(name));
      return absl::OkStatus();
    }
    if (Next('(')) {
      ++pos_;
      SLICESCHED_RETURN_IF_ERROR(Enter(start));
      SLICESCHED_RETURN_IF_ERROR(ParseExpr());
      SkipSpace();
      if (!Next(')')) return Error(pos_, "expected ')'");
      ++pos_;
      Leave();
      return absl::OkStatus();
    }
    return Error(start, absl::StrCat("expected a number, symbol or '(', found ",
                                     Describe(start)));
  }

  absl::Status ParseNumber() {
    const size_t start = pos_;
    int64_t value = 0;
    bool overflow = false;
    for (; !AtEnd() && IsDigit(Peek()); ++pos_) {
      // Separate result variables: GCC may store the result before it has
      // read an operand that aliases it.
      int64_t times_ten = 0;
      int64_t next = 0;
      overflow = overflow || __builtin_mul_overflow(value, 10, &times_ten) ||
                 __builtin_add_overflow(times_ten, Peek() - '0', &next);
      value = next;
    }
    if (overflow) {
      return Error(start, absl::StrCat("integer literal '",
                                       text_.substr(start, pos_ - start),
                                       "' does not fit in int64"));
    }
    Emit(Op::kPushConst, 0, value);
    return absl::OkStatus();
  }

  static bool IsFunction(absl::string_view name) {
    return name == "ceil" || name == "cdiv" || name == "min" || name == "max";
  }

  // Called with pos_ at the '(' after `name`, which starts at name_pos.
  absl::Status ParseCall(absl::string_view name, size_t name_pos) {
    if (!IsFunction(name)) {
      return Error(name_pos, absl::StrCat("unknown function '", name,
                                          "' (known: ceil, cdiv, min, max)"));
    }
    SLICESCHED_RETURN_IF_ERROR(Enter(name_pos));
    ++pos_;  // '('
    int num_args = 0;
    size_t first_arg_pos = pos_;
    SkipSpace();
    if (Next(')')) {
      ++pos_;
    } else {
      for (;;) {
        SkipSpace();
        if (num_args == 0) first_arg_pos = pos_;
        SLICESCHED_RETURN_IF_ERROR(ParseExpr());
        ++num_args;
        SkipSpace();
        if (Next(',')) {
          ++pos_;
          continue;
        }
        if (Next(')')) {
          ++pos_;
          break;
        }
        return Error(pos_, "expected ',' or ')'");
      }
    }
    Leave();

    if (name == "ceil") {
      if (num_args != 1) {
        return Error(name_pos,
                     absl::StrCat("ceil expects 1 argument, got ", num_args));
      }
      // Postfix order: the last instruction is the argument's top-level op.
      if (program_.back().op != Op::kDiv) {
        return Error(first_arg_pos,
                     "ceil expects a division such as ceil(C/256)");
      }
      program_.back().op = Op::kCeilDiv;
    } else if (name == "cdiv") {
      if (num_args != 2) {
        return Error(name_pos,
                     absl::StrCat("cdiv expects 2 arguments, got ", num_args));
      }
      Emit(Op::kCeilDiv);
    } else {  // min, max
      if (num_args < 2) {
        return Error(name_pos,
                     absl::StrCat(name, " expects at least 2 arguments, got ",
                                  num_args));
      }
      Emit(name == "min" ? Op::kMin : Op::kMax, num_args);
    }
    return absl::OkStatus();
  }

  // Number of stack values `instr` pops (pushes pop none).
  static int Pops(const Instr& instr) {
    switch (instr.op) {
      case Op::kPushConst:
      case Op::kPushSym:
        return 0;
      case Op::kNeg:
        return 1;
      case Op::kMin:
      case Op::kMax:
        return instr.arg;
      default:
        return 2;
    }
  }

  // Replaces every op whose operands are all literal pushes by a push of its
  // result, unless computing it fails (that failure is left for Evaluate to
  // report). Iterative, so long operator chains cannot exhaust the C++ stack.
  static std::vector<Instr> Fold(const std::vector<Instr>& in) {
    std::vector<Instr> out;
    out.reserve(in.size());
    // Parallel to the evaluation stack: does the slot hold the value of a
    // single kPushConst (which is then among the last instructions of out)?
    std::vector<uint8_t> is_const;
    std::vector<int64_t> args;
    for (const Instr& instr : in) {
      const int n = Pops(instr);
      if (n == 0) {
        out.push_back(instr);
        is_const.push_back(instr.op == Op::kPushConst);
        continue;
      }
      const bool all_const = std::all_of(is_const.end() - n, is_const.end(),
                                         [](uint8_t c) { return c != 0; });
      is_const.resize(is_const.size() - n);
      if (all_const) {
        args.clear();
        for (auto it = out.end() - n; it != out.end(); ++it) {
          args.push_back(it->imm);
        }
        int64_t result = 0;
        if (Apply(instr.op, args.data(), n, &result) == Fault::kNone) {
          out.resize(out.size() - n);
          out.push_back(Instr{Op::kPushConst, 0, result});
          is_const.push_back(1);
          continue;
        }
      }
      out.push_back(instr);
      is_const.push_back(0);
    }
    return out;
  }

  static int StackDepth(const std::vector<Instr>& program) {
    int depth = 0;
    int max_depth = 0;
    for (const Instr& instr : program) {
      const int n = Pops(instr);
      depth += 1 - n;
      // A push raises the depth; an op never exceeds its operands' depth.
      max_depth = std::max(max_depth, depth);
    }
    return max_depth;
  }

  absl::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  std::vector<Instr> program_;  // symbol args are indices into names_
  std::vector<std::string> names_;
  absl::flat_hash_map<std::string, int> local_index_;
};

// ---------------------------------------------------------------------------
// ShapeExpr

ShapeExpr::ShapeExpr() : text_("0"), program_{Instr{Op::kPushConst, 0, 0}} {}

absl::StatusOr<ShapeExpr> ShapeExpr::Parse(std::string_view text,
                                           SymbolTable* symbols) {
  ShapeExpr expr;
  Parser parser(text);
  SLICESCHED_RETURN_IF_ERROR(parser.Run(symbols, &expr));
  return expr;
}

ShapeExpr ShapeExpr::Constant(int64_t value) {
  ShapeExpr expr;
  expr.text_ = absl::StrCat(value);
  expr.program_.front().imm = value;
  return expr;
}

absl::StatusOr<int64_t> ShapeExpr::Evaluate(const SymbolValues& values) const {
  int64_t stack[kMaxStackDepth];
  int sp = 0;
  const size_t num_values = values.values_.size();
  const int64_t* value = values.values_.data();
  const uint8_t* bound = values.bound_.data();
  for (const Instr& instr : program_) {
    // The common ops are spelled out here (rather than calling Apply) so
    // that the loop stays branch-light; the results match Apply exactly.
    int64_t result;
    switch (instr.op) {
      case Op::kPushConst:
        stack[sp++] = instr.imm;
        continue;
      case Op::kPushSym: {
        const auto sym = static_cast<size_t>(instr.arg);
        if (ABSL_PREDICT_FALSE(sym >= num_values || bound[sym] == 0)) {
          return UnboundError(instr.arg);
        }
        stack[sp++] = value[sym];
        continue;
      }
      case Op::kAdd:
        if (ABSL_PREDICT_FALSE(__builtin_add_overflow(
                stack[sp - 2], stack[sp - 1], &result))) {
          return FaultError(Fault::kOverflow, instr.op);
        }
        stack[--sp - 1] = result;
        continue;
      case Op::kSub:
        if (ABSL_PREDICT_FALSE(__builtin_sub_overflow(
                stack[sp - 2], stack[sp - 1], &result))) {
          return FaultError(Fault::kOverflow, instr.op);
        }
        stack[--sp - 1] = result;
        continue;
      case Op::kMul:
        if (ABSL_PREDICT_FALSE(__builtin_mul_overflow(
                stack[sp - 2], stack[sp - 1], &result))) {
          return FaultError(Fault::kOverflow, instr.op);
        }
        stack[--sp - 1] = result;
        continue;
      default: {
        int n = 2;
        if (instr.op == Op::kNeg) n = 1;
        if (instr.op == Op::kMin || instr.op == Op::kMax) n = instr.arg;
        sp -= n;
        const Fault fault = Apply(instr.op, stack + sp, n, &result);
        if (ABSL_PREDICT_FALSE(fault != Fault::kNone)) {
          return FaultError(fault, instr.op);
        }
        stack[sp++] = result;
        continue;
      }
    }
  }
  return stack[0];
}

ABSL_ATTRIBUTE_NOINLINE absl::Status ShapeExpr::FaultError(Fault fault,
                                                           Op op) const {
  if (fault == Fault::kDivByZero) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape expression '", text_, "': division by zero",
                     op == Op::kCeilDiv ? " (ceiling division)" : ""));
  }
  const char* what = "";
  switch (op) {
    case Op::kNeg:
      what = "negation";
      break;
    case Op::kAdd:
      what = "addition";
      break;
    case Op::kSub:
      what = "subtraction";
      break;
    case Op::kMul:
      what = "multiplication";
      break;
    case Op::kDiv:
    case Op::kCeilDiv:
      what = "division";
      break;
    default:
      what = "evaluation";
      break;
  }
  return absl::OutOfRangeError(
      absl::StrCat("shape expression '", text_, "': int64 overflow in ", what));
}

ABSL_ATTRIBUTE_NOINLINE absl::Status ShapeExpr::UnboundError(int sym) const {
  absl::string_view name = "?";
  for (size_t i = 0; i < symbols_.size(); ++i) {
    if (symbols_[i] == sym) name = symbol_names_[i];
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "shape expression '", text_, "': symbol '", name, "' is not bound"));
}

// ---------------------------------------------------------------------------
// Shapes

absl::StatusOr<std::vector<int64_t>> EvaluateShape(
    std::span<const ShapeExpr> dims, const SymbolValues& values) {
  std::vector<int64_t> result;
  result.reserve(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    absl::StatusOr<int64_t> dim = dims[i].Evaluate(values);
    if (!dim.ok()) {
      return Annotate(dim.status(), absl::StrCat("dimension ", i));
    }
    if (*dim <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dimension ", i, " ('", dims[i].text(), "') evaluated to ", *dim,
          "; dimensions must be positive"));
    }
    result.push_back(*dim);
  }
  return result;
}

absl::StatusOr<int64_t> NumElements(std::span<const int64_t> dims) {
  int64_t product = 1;
  for (int64_t dim : dims) {
    int64_t next = 0;
    if (__builtin_mul_overflow(product, dim, &next)) {
      return absl::OutOfRangeError(absl::StrCat("number of elements of shape [",
                                                absl::StrJoin(dims, ", "),
                                                "] overflows int64"));
    }
    product = next;
  }
  return product;
}

absl::StatusOr<int64_t> NumElements(std::span<const ShapeExpr> dims,
                                    const SymbolValues& values) {
  SLICESCHED_ASSIGN_OR_RETURN(std::vector<int64_t> evaluated,
                              EvaluateShape(dims, values));
  absl::StatusOr<int64_t> product =
      NumElements(std::span<const int64_t>(evaluated));
  if (!product.ok()) {
    std::vector<std::string> texts;
    for (const ShapeExpr& dim : dims) texts.push_back(dim.text());
    return absl::OutOfRangeError(absl::StrCat(
        "number of elements of shape [", absl::StrJoin(texts, ", "), "] = [",
        absl::StrJoin(evaluated, ", "), "] overflows int64"));
  }
  return product;
}

}  // namespace slicesched
