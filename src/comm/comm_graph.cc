#include "slicesched/comm/comm_graph.h"

#include "slicesched/common/strings.h"

namespace slicesched {

CommGraph::CommGraph(size_t num_devices) : busy_(num_devices, 0) {}

absl::Status CommGraph::AddIntent(const TransferIntent& intent) {
  if (!intent.src.valid() || !intent.dst.valid() || intent.src.value() >= busy_.size() ||
      intent.dst.value() >= busy_.size() || intent.src == intent.dst) {
    return absl::InvalidArgumentError(
        StrCat("transfer ", intent.id, ": bad ends ", intent.src, " -> ", intent.dst));
  }
  if (intents_.contains(intent.id)) {
    return absl::AlreadyExistsError(StrCat("transfer ", intent.id, " is already known"));
  }
  Entry e;
  e.intent = intent;
  e.seq = next_seq_++;
  intents_.emplace(intent.id, e);
  ++num_pending_;
  return absl::OkStatus();
}

std::vector<TransferIntent> CommGraph::Arbitrate(const std::vector<uint8_t>* blocked) {
  std::vector<TransferIntent> out;
  if (num_pending_ == 0) return out;
  std::vector<TransferRequest> requests;
  std::vector<Entry*> entries;
  requests.reserve(num_pending_);
  for (auto& [id, e] : intents_) {
    if (e.phase != Phase::kPending) continue;
    const uint16_t s = e.intent.src.value(), d = e.intent.dst.value();
    if (blocked != nullptr && ((*blocked)[s] || (*blocked)[d])) continue;
    requests.push_back(TransferRequest{static_cast<uint32_t>(entries.size()), s, d,
                                       e.intent.priority, e.intent.ready_ns, e.seq});
    entries.push_back(&e);
  }
  std::vector<uint32_t> granted;
  ArbitrateTransfers(&requests, &busy_, &granted);
  out.reserve(granted.size());
  for (uint32_t i : granted) {
    Entry& e = *entries[i];
    if (e.retries > 0) --num_retrying_;
    e.phase = Phase::kReceiving;
    --num_pending_;
    ++total_granted_;
    out.push_back(e.intent);
  }
  return out;
}

void CommGraph::FreeEnds(const Entry& e) {
  busy_[e.intent.src.value()] = 0;
  busy_[e.intent.dst.value()] = 0;
}

absl::Status CommGraph::RecvReady(uint64_t id) {
  auto it = intents_.find(id);
  if (it == intents_.end()) return absl::NotFoundError(StrCat("no transfer ", id));
  if (it->second.phase != Phase::kReceiving) {
    return absl::FailedPreconditionError(StrCat("transfer ", id, " is not receiving"));
  }
  it->second.phase = Phase::kSending;
  return absl::OkStatus();
}

absl::Status CommGraph::RecvFailed(uint64_t id) {
  auto it = intents_.find(id);
  if (it == intents_.end()) return absl::NotFoundError(StrCat("no transfer ", id));
  Entry& e = it->second;
  if (e.phase != Phase::kReceiving) {
    return absl::FailedPreconditionError(StrCat("transfer ", id, " is not receiving"));
  }
  FreeEnds(e);
  e.phase = Phase::kPending;
  ++e.retries;
  ++num_retrying_;
  ++num_pending_;
  ++total_retries_;
  return absl::OkStatus();
}

absl::Status CommGraph::Complete(uint64_t id) {
  auto it = intents_.find(id);
  if (it == intents_.end()) return absl::NotFoundError(StrCat("no transfer ", id));
  if (it->second.phase != Phase::kSending) {
    return absl::FailedPreconditionError(StrCat("transfer ", id, " is not sending"));
  }
  FreeEnds(it->second);
  intents_.erase(it);
  return absl::OkStatus();
}

absl::Status CommGraph::Abort(uint64_t id) {
  auto it = intents_.find(id);
  if (it == intents_.end()) return absl::NotFoundError(StrCat("no transfer ", id));
  const Entry& e = it->second;
  if (e.phase == Phase::kPending) {
    --num_pending_;
    if (e.retries > 0) --num_retrying_;
  } else {
    FreeEnds(e);
  }
  intents_.erase(it);
  return absl::OkStatus();
}

int CommGraph::retries(uint64_t id) const {
  auto it = intents_.find(id);
  return it == intents_.end() ? -1 : it->second.retries;
}

CommGraph::Phase CommGraph::phase(uint64_t id) const { return intents_.at(id).phase; }

}  // namespace slicesched
