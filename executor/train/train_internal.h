// Executor-internal helpers shared by the training TUs (torch-free).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "slicesched/executor/train/train_ops.h"

namespace slicesched::executor::internal {

// The tensors of `a` in NamedTensors order (layers' q_a, q_b, v_a, v_b, then
// head). The pointers stay valid while `a` is not resized.
std::vector<Tensor*> AdapterTensors(TaskAdapters& a);
std::vector<const Tensor*> AdapterTensors(const TaskAdapters& a);

// The expected shapes of the tensors of an adapter set in the same order.
std::vector<std::vector<int64_t>> AdapterShapes(const LlamaDims& dims, int64_t rank,
                                                int64_t head_outputs);

std::string ShapeString(const std::vector<int64_t>& s);

}  // namespace slicesched::executor::internal
