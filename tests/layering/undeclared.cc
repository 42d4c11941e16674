// Must not compile: this target depends on gmg only, and sched is above gmg
// (tests/layering/CMakeLists.txt expects the compiler to name this header).
#include "slicesched/gmg/gmg.h"
#include "slicesched/sched/policy.h"

namespace slicesched {
int LayeringProbeUndeclared() { return 1; }
}  // namespace slicesched
