// slicectl: the command-line client of the `sliced` daemon. Everything but
// main() is in src/cli/slicectl.cc; see include/slicesched/cli/slicectl.h
// and `slicectl --help`.
#include "slicesched/cli/slicectl.h"

#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  return slicesched::RunSlicectl(args, std::cout, std::cerr);
}
