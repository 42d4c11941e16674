// Strongly typed integer identifiers.
//
// Each id type is a distinct C++ type, so a DeviceId cannot be passed where an
// InstanceId is expected. Ids are dense small integers assigned by their owner
// (the GMG for nodes and instances, the accelerator set for devices);
// kInvalid marks "no id".
#pragma once

#include <compare>
#include <cstdint>
#include <functional>
#include <limits>
#include <ostream>
#include <string>

#include "absl/strings/str_cat.h"

namespace slicesched {

template <typename Tag, typename Rep = uint32_t>
class StrongId {
 public:
  using rep_type = Rep;
  static constexpr Rep kInvalidValue = std::numeric_limits<Rep>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep value) : value_(value) {}

  static constexpr StrongId Invalid() { return StrongId(); }
  constexpr bool valid() const { return value_ != kInvalidValue; }
  constexpr Rep value() const { return value_; }

  constexpr auto operator<=>(const StrongId&) const = default;

  // "dev3", "node17", or "dev?" when invalid.
  std::string ToString() const {
    if (!valid()) return absl::StrCat(Tag::kPrefix, "?");
    return absl::StrCat(Tag::kPrefix, value_);
  }

  template <typename H>
  friend H AbslHashValue(H h, StrongId id) {
    return H::combine(std::move(h), id.value_);
  }
  friend std::ostream& operator<<(std::ostream& os, StrongId id) {
    if (!id.valid()) return os << Tag::kPrefix << "?";
    return os << Tag::kPrefix << id.value_;
  }

 private:
  Rep value_ = kInvalidValue;
};

struct DeviceIdTag { static constexpr const char* kPrefix = "dev"; };
struct TemplateIdTag { static constexpr const char* kPrefix = "tpl"; };
struct InstanceIdTag { static constexpr const char* kPrefix = "inst"; };
struct NodeIdTag { static constexpr const char* kPrefix = "node"; };
struct CheckpointIdTag { static constexpr const char* kPrefix = "ckpt"; };
struct TenantIdTag { static constexpr const char* kPrefix = "tenant"; };

using DeviceId = StrongId<DeviceIdTag, uint16_t>;
using TemplateId = StrongId<TemplateIdTag, uint32_t>;
using InstanceId = StrongId<InstanceIdTag, uint64_t>;
using NodeId = StrongId<NodeIdTag, uint64_t>;
using CheckpointId = StrongId<CheckpointIdTag, uint64_t>;
using TenantId = StrongId<TenantIdTag, uint32_t>;

}  // namespace slicesched

namespace std {
template <typename Tag, typename Rep>
struct hash<slicesched::StrongId<Tag, Rep>> {
  size_t operator()(slicesched::StrongId<Tag, Rep> id) const noexcept {
    return std::hash<Rep>()(id.value());
  }
};
}  // namespace std
