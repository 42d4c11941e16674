#include "slicesched/comm/arbitration.h"

#include <algorithm>
#include <cstddef>

namespace slicesched {

void ArbitrateTransfers(std::vector<TransferRequest>* pending, std::vector<uint8_t>* busy,
                        std::vector<uint32_t>* granted) {
  ArbitrateNewTransfers(pending, 0, busy, granted);
}

void ArbitrateNewTransfers(std::vector<TransferRequest>* pending, size_t first, std::vector<uint8_t>* busy,
                           std::vector<uint32_t>* granted) {
  std::vector<TransferRequest>& p = *pending;
  std::vector<uint8_t>& b = *busy;
  if (first >= p.size()) return;
  const auto tail = p.begin() + static_cast<std::ptrdiff_t>(first);
  if (!std::is_sorted(tail, p.end(), ArbitratesBefore)) std::sort(tail, p.end(), ArbitratesBefore);
  size_t kept = first;
  for (size_t i = first; i < p.size(); ++i) {
    const TransferRequest& r = p[i];
    if (!b[r.src] && !b[r.dst]) {
      b[r.src] = 1;
      b[r.dst] = 1;
      granted->push_back(r.id);
    } else {
      p[kept++] = r;
    }
  }
  p.resize(kept);
}

}  // namespace slicesched
