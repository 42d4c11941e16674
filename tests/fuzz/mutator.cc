#include "fuzz/mutator.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace slicesched::fuzz {
namespace {

// Outputs are capped so that one input is bounded work for any parser.
constexpr size_t kMaxOutput = 256 << 10;

std::vector<std::string> SplitLines(const std::string& s) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    if (nl == std::string::npos) nl = s.size() - 1;
    lines.push_back(s.substr(start, nl - start + 1));
    start = nl + 1;
  }
  return lines;
}

std::string JoinLines(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l;
  return out;
}

// Where the value of a `key: value` or `key,value` line starts; npos if none.
size_t ValueStart(const std::string& line) {
  size_t p = line.find(": ");
  if (p != std::string::npos) return p + 2;
  p = line.find(',');
  if (p != std::string::npos) return p + 1;
  p = line.find(':');
  if (p != std::string::npos) return p + 1;
  return std::string::npos;
}

// Where that value ends (before a comma, a closing bracket or the newline).
size_t ValueEnd(const std::string& line, size_t start) {
  const size_t e = line.find_first_of(",}]\n", start);
  return e == std::string::npos ? line.size() : e;
}

}  // namespace

const std::vector<std::string>& Mutator::ExtremeValues() {
  static const std::vector<std::string>* const values = [] {
    auto* v = new std::vector<std::string>{
        "-1", "0", "1", "2147483647", "2147483648", "-2147483649", "4294967296",
        "9223372036854775807", "9223372036854775808", "-9223372036854775808", "18446744073709551616",
        "1e308", "-1e308", "1e309", "4.9e-324", "nan", ".nan", "NaN", "inf", "-inf", ".inf", "-.inf",
        "0.5", "-0.0", "1e-300", "0x7fffffff", "~", "null", "true", "false", "''", "\"\"", "[]", "{}",
        "8EiB", "16EiB", "-1GiB", "1e400MB", "99999999999999999999TiB", "1.5GiB", "0B",
        "9223372036854775807ns", "1e300s", "-5s", "nan ms", "18446744073709551615us",
        "\xff\xfe\xc3", "\xc0\x80", "a\x00" "b", "\xed\xa0\x80", "!!binary AAAA", "&a x", "*a",
        "'unterminated", "\"unterminated", "{a: [", "]]]]", "- - - -", "? x", "|\n  block"};
    v->push_back(std::string(64 << 10, 'a'));
    v->push_back(std::string(4000, '[') + std::string(4000, ']'));
    std::string deep_map;
    for (int i = 0; i < 2000; ++i) deep_map += "{a: ";
    deep_map += "1";
    deep_map += std::string(2000, '}');
    v->push_back(std::move(deep_map));
    return v;
  }();
  return *values;
}

const std::vector<int64_t>& Mutator::ExtremeIntegers() {
  static const std::vector<int64_t> values = {
      -1, 0, 1, 2, 3, 7, 64, 255, 256, 65535, 65536, int64_t{1} << 31, (int64_t{1} << 31) - 1,
      int64_t{1} << 32, int64_t{1} << 40, int64_t{1} << 53, std::numeric_limits<int64_t>::max(),
      std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max() - 1, -(int64_t{1} << 31)};
  return values;
}

int64_t Mutator::ExtremeInteger() {
  const auto& v = ExtremeIntegers();
  return v[Below(v.size())];
}

std::string Mutator::OddString() {
  switch (Below(4)) {
    case 0: {
      const auto& v = ExtremeValues();
      return v[Below(v.size())];
    }
    case 1: {
      std::string s(1 + Below(16), '\0');
      for (char& c : s) c = static_cast<char>(Below(256));
      return s;
    }
    case 2:
      return std::string(1 + Below(1000), static_cast<char>('a' + Below(26)));
    default:
      return "";
  }
}

std::string Mutator::Mutate(std::string_view input) {
  std::string s(input);
  const size_t n = 1 + Below(3);
  for (size_t i = 0; i < n; ++i) MutateOnce(s);
  if (s.size() > kMaxOutput) s.resize(kMaxOutput);
  return s;
}

void Mutator::MutateOnce(std::string& s) {
  switch (Below(3)) {
    case 0: ByteMutation(s); break;
    case 1: LineMutation(s); break;
    default: ValueMutation(s); break;
  }
}

void Mutator::ByteMutation(std::string& s) {
  if (s.empty()) {
    s = OddString();
    return;
  }
  const size_t pos = Below(s.size());
  switch (Below(8)) {
    case 0: s[pos] = static_cast<char>(s[pos] ^ (1 << Below(8))); break;
    case 1: s[pos] = static_cast<char>(Below(256)); break;
    case 2: s.resize(pos); break;  // truncation
    case 3: s.erase(pos, 1 + Below(std::min<size_t>(64, s.size() - pos))); break;
    case 4: {  // a duplicated range
      const size_t len = 1 + Below(std::min<size_t>(128, s.size() - pos));
      s.insert(pos, s.substr(pos, len));
      break;
    }
    case 5: {
      static const char* const kOdd[] = {"\xff", "\xc3", "\xe2\x82", "\x00", "\r", "\t", "\x7f", "\xef\xbb\xbf"};
      const char* odd = kOdd[Below(8)];
      s.insert(pos, odd[0] == '\0' ? std::string(1, '\0') : std::string(odd));
      break;
    }
    case 6: {  // an interesting byte from the syntax
      static constexpr std::string_view kSyntax = ":-,[]{}#&*!|>'\"%@`\\\n ";
      s.insert(pos, 1, kSyntax[Below(kSyntax.size())]);
      break;
    }
    default: s.insert(pos, OddString()); break;
  }
}

void Mutator::LineMutation(std::string& s) {
  std::vector<std::string> lines = SplitLines(s);
  if (lines.empty()) {
    ByteMutation(s);
    return;
  }
  const size_t a = Below(lines.size());
  const size_t b = Below(lines.size());
  switch (Below(6)) {
    case 0: lines.erase(lines.begin() + static_cast<std::ptrdiff_t>(a)); break;
    case 1: lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(a), lines[b]); break;
    case 2: std::swap(lines[a], lines[b]); break;
    case 3: {  // swap the values of two keys
      const size_t va = ValueStart(lines[a]);
      const size_t vb = ValueStart(lines[b]);
      if (a == b || va == std::string::npos || vb == std::string::npos) break;
      const size_t ea = ValueEnd(lines[a], va);
      const size_t eb = ValueEnd(lines[b], vb);
      const std::string x = lines[a].substr(va, ea - va);
      const std::string y = lines[b].substr(vb, eb - vb);
      lines[a].replace(va, ea - va, y);
      lines[b].replace(vb, eb - vb, x);
      break;
    }
    case 4: {  // indentation shift
      if (Below(2) == 0) {
        lines[a].insert(0, std::string(1 + Below(4), ' '));
      } else {
        const size_t sp = lines[a].find_first_not_of(' ');
        lines[a].erase(0, std::min<size_t>(sp == std::string::npos ? 0 : sp, 1 + Below(4)));
      }
      break;
    }
    default: {  // rename a key
      const size_t colon = lines[a].find(':');
      if (colon == std::string::npos || colon == 0) break;
      const size_t k = Below(colon);
      lines[a][k] = static_cast<char>('a' + Below(26));
      break;
    }
  }
  s = JoinLines(lines);
}

void Mutator::ValueMutation(std::string& s) {
  std::vector<std::string> lines = SplitLines(s);
  if (lines.empty()) {
    s = OddString();
    return;
  }
  // Prefer a line with a value; give up after a few draws.
  for (int tries = 0; tries < 8; ++tries) {
    std::string& line = lines[Below(lines.size())];
    const size_t vs = ValueStart(line);
    if (vs == std::string::npos) continue;
    const size_t ve = ValueEnd(line, vs);
    const auto& values = ExtremeValues();
    line.replace(vs, ve - vs, values[Below(values.size())]);
    s = JoinLines(lines);
    return;
  }
  ByteMutation(s);
}

}  // namespace slicesched::fuzz
