// Compiles: gmg's own header and common's, which gmg depends on.
#include "slicesched/common/units.h"
#include "slicesched/gmg/gmg.h"

namespace slicesched {
int LayeringProbeDeclared() { return sizeof(GlobalMappingGraph) > 0 ? 1 : 0; }
}  // namespace slicesched
