// JSON text helpers shared by every hand-written JSON producer (timelines,
// job event details, safetensors headers, experiment reports).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace slicesched {

// `s` as a JSON string literal, quotes included (RFC 8259): quote, backslash
// and control characters escaped (\n \r \t by name, the others as \u00XX);
// other bytes, UTF-8 included, are copied as they are.
inline std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

// `values` as a JSON array of numbers, each with `decimals` digits after the
// point ("[1.250, 3.000]").
inline std::string JsonNumberList(const std::vector<double>& values, int decimals) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%s%.*f", i ? ", " : "", decimals, values[i]);
    out += buf;
  }
  return out + "]";
}

}  // namespace slicesched
