// A small strict JSON parser (RFC 8259) producing a tree: objects keep
// their key order and reject duplicate keys, numbers keep their text, nesting
// is bounded (64). Errors name the byte offset.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace slicesched {

struct JsonValue;
using JsonObject = std::vector<std::pair<std::string, JsonValue>>;
using JsonArray = std::vector<JsonValue>;

struct JsonNumber {
  std::string text;  // as written
  bool is_integer = false;
};

struct JsonValue {
  std::variant<std::nullptr_t, bool, JsonNumber, std::string, JsonArray, JsonObject> v;
};

// Parses one JSON document; an error reads "malformed <label> at byte N: ...".
absl::StatusOr<JsonValue> ParseJson(std::string_view text, std::string_view label = "JSON");

// The value of `key` in `object`, or null.
const JsonValue* JsonField(const JsonObject& object, std::string_view key);

}  // namespace slicesched
