#include "command.h"

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

namespace slicesim {
namespace {

// Filled by the groups' initialisers before main, read-only afterwards.
std::map<std::string, CommandFn, std::less<>>& Table() {
  static auto* table = new std::map<std::string, CommandFn, std::less<>>();
  return *table;
}

}  // namespace

bool RegisterCommands(std::initializer_list<std::pair<std::string_view, CommandFn>> commands) {
  for (const auto& [name, fn] : commands) {
    if (!Table().emplace(std::string(name), fn).second) {
      std::fprintf(stderr, "slicesim: command '%.*s' registered twice\n", static_cast<int>(name.size()),
                   name.data());
      std::abort();
    }
  }
  return true;
}

CommandFn FindCommand(std::string_view name) {
  auto it = Table().find(name);
  return it == Table().end() ? nullptr : it->second;
}

}  // namespace slicesim
