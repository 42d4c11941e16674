// A minimal writer of flat JSON objects for job event details: keys in
// insertion order, strings escaped per RFC 8259, non-finite numbers written
// as null. Values that are themselves JSON (a nested object, a list) are
// added with AddRaw and must be valid JSON.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "slicesched/common/json.h"

namespace slicesched::jobs {

inline std::string JsonString(std::string_view s) { return JsonQuote(s); }

// Shortest text that reads back as the same double; null when not finite.
inline std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

class JsonObject {
 public:
  JsonObject& Add(std::string_view key, std::string_view value) { return AddRaw(key, JsonString(value)); }
  JsonObject& Add(std::string_view key, const char* value) { return Add(key, std::string_view(value)); }
  JsonObject& Add(std::string_view key, const std::string& value) { return Add(key, std::string_view(value)); }
  JsonObject& Add(std::string_view key, int64_t value) { return AddRaw(key, std::to_string(value)); }
  JsonObject& Add(std::string_view key, uint64_t value) { return AddRaw(key, std::to_string(value)); }
  JsonObject& Add(std::string_view key, int value) { return AddRaw(key, std::to_string(value)); }
  JsonObject& Add(std::string_view key, double value) { return AddRaw(key, JsonNumber(value)); }
  JsonObject& Add(std::string_view key, bool value) { return AddRaw(key, value ? "true" : "false"); }
  JsonObject& Add(std::string_view key, const std::vector<uint32_t>& values) {
    std::string list = "[";
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) list += ",";
      list += std::to_string(values[i]);
    }
    return AddRaw(key, list + "]");
  }
  JsonObject& AddRaw(std::string_view key, std::string_view json) {
    if (!body_.empty()) body_ += ",";
    body_ += JsonString(key);
    body_ += ":";
    body_ += json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace slicesched::jobs
