#include "slicesched/comm/arbitration.h"

#include <algorithm>

namespace slicesched {

void ArbitrateTransfers(std::vector<TransferRequest>* pending, std::vector<uint8_t>* busy,
                        std::vector<uint32_t>* granted) {
  std::vector<TransferRequest>& p = *pending;
  std::vector<uint8_t>& b = *busy;
  if (p.empty()) return;
  if (!std::is_sorted(p.begin(), p.end(), ArbitratesBefore)) {
    std::sort(p.begin(), p.end(), ArbitratesBefore);
  }
  size_t kept = 0;
  for (size_t i = 0; i < p.size(); ++i) {
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
