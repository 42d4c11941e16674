// Reading the project's Markdown docs in tests that keep them honest (the
// documented config keys, metrics and slicectl commands are the ones the code
// has). Only structure is parsed (headings, tables, code blocks); the tests
// compare what they find with what the code reports about itself.
#pragma once

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#ifndef SLICESCHED_SOURCE_DIR
#error "define SLICESCHED_SOURCE_DIR (the source tree) for tests that read the docs"
#endif

namespace slicesched::testing_docs {

inline bool StartsWith(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// The lines of `text`.
inline std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    out.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// The text of PATH (relative to the source tree); "" when unreadable.
inline std::string ReadSourceFile(std::string_view path) {
  std::ifstream in(std::string(SLICESCHED_SOURCE_DIR) + "/" + std::string(path), std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The lines after the heading line `heading` (e.g. "### `scheduler`", matched
// as a prefix) up to the next heading of the same or a higher level; empty
// when the heading is missing.
inline std::vector<std::string> MarkdownSection(const std::string& doc, std::string_view heading) {
  const size_t level = heading.find_first_not_of('#');
  std::vector<std::string> out;
  bool inside = false;
  for (std::string_view line : Lines(doc)) {
    const size_t hashes = line.find_first_not_of('#');
    const bool is_heading = hashes != 0 && hashes != std::string_view::npos && line[hashes] == ' ';
    if (inside && is_heading && hashes <= level) break;
    if (inside) out.emplace_back(line);
    if (!inside && StartsWith(line, heading)) inside = true;
  }
  return out;
}

// The `code` spans of a string, in order.
inline std::vector<std::string> CodeSpans(std::string_view text) {
  std::vector<std::string> out;
  for (size_t open = text.find('`'); open != std::string_view::npos; open = text.find('`', open)) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string_view::npos) break;
    out.emplace_back(text.substr(open + 1, close - open - 1));
    open = close + 1;
  }
  return out;
}

// The `code` spans of the first cell of every table row among `lines`
// (header and separator rows have none).
inline std::vector<std::string> FirstColumnCodes(const std::vector<std::string>& lines) {
  std::vector<std::string> out;
  for (const std::string& line : lines) {
    if (!StartsWith(line, "|")) continue;
    // A cell ends at the first '|' outside a code span (`json\|dot` has one inside).
    size_t end = 1;
    for (bool in_code = false; end < line.size() && (in_code || line[end] != '|'); ++end) {
      if (line[end] == '`') in_code = !in_code;
    }
    for (std::string& code : CodeSpans(std::string_view(line).substr(1, end - 1))) out.push_back(std::move(code));
  }
  return out;
}

// The lines of the fenced code blocks of `doc` whose info string is `lang`.
inline std::vector<std::string> CodeBlockLines(const std::string& doc, std::string_view lang) {
  std::vector<std::string> out;
  bool inside = false, wanted = false;
  for (std::string_view line : Lines(doc)) {
    if (StartsWith(line, "```")) {
      wanted = !inside && line.substr(3) == lang;
      inside = !inside;
      continue;
    }
    if (inside && wanted) out.emplace_back(line);
  }
  return out;
}

}  // namespace slicesched::testing_docs
