#include "slicesched/jobs/batch_input.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "slicesched/common/json_parse.h"
#include "slicesched/common/strings.h"
#include "json_writer.h"

namespace slicesched {
namespace {

std::string TypeName(const JsonValue& v) {
  switch (v.v.index()) {
    case 0: return "null";
    case 1: return "a boolean";
    case 2: return "a number";
    case 3: return "a string";
    case 4: return "an array";
    default: return "an object";
  }
}

std::optional<int64_t> AsInt(const JsonValue& v) {
  const auto* n = std::get_if<JsonNumber>(&v.v);
  if (n == nullptr || !n->is_integer) return std::nullopt;
  int64_t out = 0;
  const char* end = n->text.data() + n->text.size();
  const auto r = std::from_chars(n->text.data(), end, out);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return out;
}

std::optional<double> AsDouble(const JsonValue& v) {
  const auto* n = std::get_if<JsonNumber>(&v.v);
  if (n == nullptr) return std::nullopt;
  double out = 0;
  const char* end = n->text.data() + n->text.size();
  const auto r = std::from_chars(n->text.data(), end, out);
  if (r.ec != std::errc() || r.ptr != end || !std::isfinite(out)) return std::nullopt;
  return out;
}

// One line's checks; the first failure is the line's error.
class LineParser {
 public:
  LineParser(int64_t line, const BatchModelLookup& models, std::string_view deployment)
      : line_(line), models_(models), deployment_(deployment) {}

  // Empty on success, else the error message.
  std::string Parse(std::string_view text, BatchRequest* out) {
    out->line = line_;
    auto doc = ParseJson(text, "JSON");
    if (!doc.ok()) return std::string(doc.status().message());
    const auto* top = std::get_if<JsonObject>(&doc->v);
    if (top == nullptr) return StrCat("the line is ", TypeName(*doc), ", not a JSON object");
    for (const auto& [key, value] : *top) {
      if (key != "custom_id" && key != "method" && key != "url" && key != "body") {
        return StrCat("unknown field '", key, "' (fields: custom_id, method, url, body)");
      }
    }
    const JsonValue* id = JsonField(*top, "custom_id");
    if (id == nullptr) return "missing custom_id";
    const auto* id_s = std::get_if<std::string>(&id->v);
    if (id_s == nullptr || id_s->empty()) return "custom_id must be a non-empty string";
    out->custom_id = *id_s;
    const JsonValue* method = JsonField(*top, "method");
    const auto* method_s = method != nullptr ? std::get_if<std::string>(&method->v) : nullptr;
    if (method_s == nullptr || *method_s != "POST") return "method must be \"POST\"";
    const JsonValue* url = JsonField(*top, "url");
    const auto* url_s = url != nullptr ? std::get_if<std::string>(&url->v) : nullptr;
    if (url_s == nullptr || *url_s != "/v1/completions") {
      return "url must be \"/v1/completions\" (the only endpoint a batch may call)";
    }
    const JsonValue* body = JsonField(*top, "body");
    if (body == nullptr) return "missing body";
    const auto* b = std::get_if<JsonObject>(&body->v);
    if (b == nullptr) return StrCat("body is ", TypeName(*body), ", not an object");
    return ParseBody(*b, out);
  }

 private:
  std::string ParseBody(const JsonObject& b, BatchRequest* out) {
    static constexpr std::string_view kFields[] = {"model", "prompt", "max_tokens", "temperature",
                                                   "top_p", "seed",   "stop"};
    for (const auto& [key, value] : b) {
      if (std::find(std::begin(kFields), std::end(kFields), key) == std::end(kFields)) {
        return StrCat("unknown field 'body.", key, "' (fields: model, prompt, max_tokens, temperature, top_p, seed, stop)");
      }
    }
    const JsonValue* model = JsonField(b, "model");
    const std::string deployment(deployment_);
    const auto* model_s = model != nullptr ? std::get_if<std::string>(&model->v) : nullptr;
    if (model == nullptr && !deployment_.empty()) model_s = &deployment;
    if (model_s == nullptr || model_s->empty()) return "body.model must name a deployment";
    if (!deployment_.empty() && *model_s != deployment_) {
      return StrCat("body.model '", *model_s, "' is not the batch's deployment '", deployment_, "'");
    }
    out->model = *model_s;
    const std::optional<BatchModelInfo> info = models_(*model_s);
    if (!info.has_value()) return StrCat("unknown model '", *model_s, "' (no deployment has that name)");
    if (const JsonValue* v = JsonField(b, "max_tokens")) {
      const std::optional<int64_t> n = AsInt(*v);
      if (!n.has_value() || *n < 1) return "body.max_tokens must be a positive integer";
      out->max_tokens = *n;
    }
    if (const JsonValue* v = JsonField(b, "temperature")) {
      const std::optional<double> t = AsDouble(*v);
      if (!t.has_value() || *t < 0 || *t > 2) return "body.temperature must be a number in [0, 2]";
      out->temperature = *t;
    }
    if (const JsonValue* v = JsonField(b, "top_p")) {
      const std::optional<double> p = AsDouble(*v);
      if (!p.has_value() || *p <= 0 || *p > 1) return "body.top_p must be a number in (0, 1]";
      out->top_p = *p;
    }
    if (const JsonValue* v = JsonField(b, "seed")) {
      const std::optional<int64_t> s = AsInt(*v);
      if (!s.has_value() || *s < 0) return "body.seed must be a non-negative integer";
      out->seed = static_cast<uint64_t>(*s);
    }
    const JsonValue* prompt = JsonField(b, "prompt");
    if (prompt == nullptr) return "missing body.prompt";
    if (const auto* text = std::get_if<std::string>(&prompt->v)) {
      if (!info->has_tokenizer) {
        return StrCat("body.prompt is text but deployment '", *model_s, "' has no tokenizer: give token ids");
      }
      if (text->empty()) return "body.prompt is empty";
      out->prompt_text = *text;
      if (info->encode) {
        absl::StatusOr<std::vector<int64_t>> ids = info->encode(*text);
        if (!ids.ok()) return StrCat("body.prompt: ", ids.status().message());
        if (ids->empty()) return "body.prompt encodes to no token";
        for (int64_t t : *ids) {
          if (t < 0 || t >= info->vocab) {
            return StrCat("body.prompt encodes to token ", t, ", outside deployment '", *model_s,
                          "''s vocabulary of ", info->vocab);
          }
        }
        out->prompt_tokens = *std::move(ids);
      }
      const int64_t need = static_cast<int64_t>(out->prompt_tokens.size()) + out->max_tokens;
      if (need > info->max_context_tokens) {
        return StrCat("the prompt of ", out->prompt_tokens.size(), " tokens plus max_tokens ", out->max_tokens,
                      " needs a KV cache of ", need, " tokens; deployment '", *model_s, "' holds at most ",
                      info->max_context_tokens);
      }
    } else if (const auto* ids = std::get_if<JsonArray>(&prompt->v)) {
      if (ids->empty()) return "body.prompt is empty";
      for (size_t i = 0; i < ids->size(); ++i) {
        const std::optional<int64_t> t = AsInt((*ids)[i]);
        if (!t.has_value() || *t < 0 || *t >= info->vocab) {
          return StrCat("body.prompt[", i, "] must be a token id in [0, ", info->vocab, ")");
        }
        out->prompt_tokens.push_back(*t);
      }
      const int64_t need = static_cast<int64_t>(ids->size()) + out->max_tokens;
      if (need > info->max_context_tokens) {
        return StrCat("the prompt of ", ids->size(), " tokens plus max_tokens ", out->max_tokens, " needs a KV cache of ",
                      need, " tokens; deployment '", *model_s, "' holds at most ", info->max_context_tokens);
      }
    } else {
      return StrCat("body.prompt is ", TypeName(*prompt), ": give token ids (an array) or text");
    }
    if (const JsonValue* v = JsonField(b, "stop")) {
      const JsonArray single = {*v};
      const auto* list = std::get_if<JsonArray>(&v->v);
      for (const JsonValue& s : list != nullptr ? *list : single) {
        if (const auto* text = std::get_if<std::string>(&s.v)) {
          if (!info->has_tokenizer) {
            return StrCat("body.stop is text but deployment '", *model_s, "' has no tokenizer: give token ids");
          }
          // A stop string of one token stops generation; a longer one cuts
          // the decoded text (jobs/batch_manager.h).
          std::optional<int64_t> single;
          if (info->encode) {
            absl::StatusOr<std::vector<int64_t>> ids = info->encode(*text);
            if (ids.ok() && ids->size() == 1 && (*ids)[0] >= 0 && (*ids)[0] < info->vocab) single = (*ids)[0];
          }
          if (single.has_value()) {
            out->stop_tokens.push_back(*single);
          } else {
            out->stop_text.push_back(*text);
          }
        } else if (const std::optional<int64_t> t = AsInt(s); t.has_value() && *t >= 0 && *t < info->vocab) {
          out->stop_tokens.push_back(*t);
        } else {
          return StrCat("body.stop must hold token ids in [0, ", info->vocab, ") or strings");
        }
      }
    }
    return "";
  }

  int64_t line_;
  const BatchModelLookup& models_;
  std::string_view deployment_;
};

}  // namespace

std::string DescribeBatchErrors(const std::vector<BatchLineError>& errors) {
  std::string out;
  for (size_t i = 0; i < errors.size() && i < kMaxBatchErrorsListed; ++i) {
    out += StrCat(i > 0 ? "\n" : "", errors[i].message);
  }
  if (errors.size() > kMaxBatchErrorsListed) {
    out += StrCat("\n... and ", errors.size() - kMaxBatchErrorsListed, " more bad lines");
  }
  return out;
}

absl::StatusOr<BatchInput> ParseBatchInput(std::string_view jsonl, const BatchModelLookup& models, bool strict,
                                           std::string_view deployment) {
  BatchInput in;
  absl::flat_hash_map<std::string, int64_t> first_line;  // custom_id -> line
  // One lookup per model, not per line: the daemon's lookup is a round trip
  // to its loop thread, and a file holds one model in 100,000 lines.
  absl::flat_hash_map<std::string, std::optional<BatchModelInfo>> looked_up;
  const BatchModelLookup cached = [&](std::string_view model) {
    auto it = looked_up.find(std::string(model));
    if (it == looked_up.end()) it = looked_up.emplace(std::string(model), models(model)).first;
    return it->second;
  };
  int64_t line = 0;
  size_t pos = 0;
  while (pos < jsonl.size()) {
    size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    std::string_view text = jsonl.substr(pos, end - pos);
    pos = end + 1;
    ++line;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.find_first_not_of(" \t") == std::string_view::npos) continue;
    BatchRequest r;
    std::string error = LineParser(line, cached, deployment).Parse(text, &r);
    if (error.empty()) {
      auto [it, inserted] = first_line.emplace(r.custom_id, line);
      if (!inserted) error = StrCat("duplicate custom_id '", r.custom_id, "' (first on line ", it->second, ")");
    }
    if (!error.empty()) {
      in.errors.push_back({line, r.custom_id, StrCat("line ", line, ": ", error)});
      continue;
    }
    in.requests.push_back(std::move(r));
  }
  if (strict && !in.errors.empty()) {
    return absl::InvalidArgumentError(StrCat("the batch input has ", in.errors.size(),
                                             " bad line(s) and --strict refuses it whole:\n",
                                             DescribeBatchErrors(in.errors)));
  }
  if (in.requests.empty()) {
    return absl::InvalidArgumentError(in.errors.empty() ? "the batch input holds no request"
                                                        : StrCat("the batch input holds no valid request:\n",
                                                                 DescribeBatchErrors(in.errors)));
  }
  return in;
}

namespace {

std::string IntList(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += StrCat(i > 0 ? "," : "", v[i]);
  return out + "]";
}

std::string TextList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += StrCat(i > 0 ? "," : "", JsonQuote(v[i]));
  return out + "]";
}

}  // namespace

std::string EncodeBatchRequest(const BatchRequest& r) {
  jobs::JsonObject o;
  o.Add("custom_id", r.custom_id).Add("model", r.model);
  if (r.prompt_text.has_value()) o.Add("prompt_text", *r.prompt_text);
  if (!r.prompt_tokens.empty() || !r.prompt_text.has_value()) o.AddRaw("prompt", IntList(r.prompt_tokens));
  o.Add("max_tokens", r.max_tokens).Add("temperature", r.temperature).Add("top_p", r.top_p);
  if (r.seed.has_value()) o.Add("seed", *r.seed);
  if (!r.stop_tokens.empty()) o.AddRaw("stop", IntList(r.stop_tokens));
  if (!r.stop_text.empty()) o.AddRaw("stop_text", TextList(r.stop_text));
  return o.str();
}

absl::StatusOr<BatchRequest> DecodeBatchRequest(std::string_view json) {
  auto parsed = ParseJson(json, "stored batch request");
  if (!parsed.ok()) return absl::DataLossError(parsed.status().message());
  const auto* o = std::get_if<JsonObject>(&parsed->v);
  if (o == nullptr) return absl::DataLossError("stored batch request: not a JSON object");
  auto bad = [](std::string_view field) {
    return absl::DataLossError(StrCat("stored batch request: field '", field, "' is missing or malformed"));
  };
  auto text = [&](std::string_view key, std::string* out) {
    const JsonValue* v = JsonField(*o, key);
    const auto* str = v != nullptr ? std::get_if<std::string>(&v->v) : nullptr;
    if (str == nullptr) return false;
    *out = *str;
    return true;
  };
  auto ints = [&](std::string_view key, std::vector<int64_t>* out) {
    const JsonValue* v = JsonField(*o, key);
    if (v == nullptr) return true;
    const auto* list = std::get_if<JsonArray>(&v->v);
    if (list == nullptr) return false;
    for (const JsonValue& e : *list) {
      const std::optional<int64_t> i = AsInt(e);
      if (!i.has_value()) return false;
      out->push_back(*i);
    }
    return true;
  };
  BatchRequest r;
  if (!text("custom_id", &r.custom_id)) return bad("custom_id");
  if (!text("model", &r.model)) return bad("model");
  if (std::string t; text("prompt_text", &t)) r.prompt_text = std::move(t);
  if (!ints("prompt", &r.prompt_tokens) || (r.prompt_tokens.empty() && !r.prompt_text.has_value())) {
    return bad("prompt");
  }
  const JsonValue* max_tokens = JsonField(*o, "max_tokens");
  const std::optional<int64_t> mt = max_tokens != nullptr ? AsInt(*max_tokens) : std::nullopt;
  if (!mt.has_value() || *mt < 1) return bad("max_tokens");
  r.max_tokens = *mt;
  for (auto [key, out] : {std::pair<std::string_view, double*>{"temperature", &r.temperature}, {"top_p", &r.top_p}}) {
    const JsonValue* v = JsonField(*o, key);
    const std::optional<double> d = v != nullptr ? AsDouble(*v) : std::nullopt;
    if (!d.has_value()) return bad(key);
    *out = *d;
  }
  if (const JsonValue* v = JsonField(*o, "seed")) {
    const auto* n = std::get_if<JsonNumber>(&v->v);
    uint64_t seed = 0;
    if (n == nullptr || std::from_chars(n->text.data(), n->text.data() + n->text.size(), seed).ec != std::errc()) {
      return bad("seed");
    }
    r.seed = seed;
  }
  if (!ints("stop", &r.stop_tokens)) return bad("stop");
  if (const JsonValue* v = JsonField(*o, "stop_text")) {
    const auto* list = std::get_if<JsonArray>(&v->v);
    if (list == nullptr) return bad("stop_text");
    for (const JsonValue& e : *list) {
      const auto* str = std::get_if<std::string>(&e.v);
      if (str == nullptr) return bad("stop_text");
      r.stop_text.push_back(*str);
    }
  }
  return r;
}

uint64_t BatchRequestSeed(const BatchRequest& r) {
  if (r.seed.has_value() && *r.seed != 0) return *r.seed;
  // FNV-1a of the custom_id: stable across runs and builds.
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : r.custom_id) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h == 0 ? 1 : h;
}

}  // namespace slicesched
