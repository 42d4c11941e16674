// The queue discipline: which ready operator a device runs next.
//
// One implementation, used by both the simulator and the executors
// (docs/architecture.md, invariant 2), so a snapshot can be replayed exactly:
//
//   1. online before offline (PriorityClass order);
//   2. higher numeric priority first;
//   3. earlier ready time first (the moment its last input became local);
//   4. lower tiebreak first (the GMG node id: instance order, then template
//      op order).
//
// RunsBefore() states the order; ReadyQueue implements it efficiently for a
// device's ready operators: one FIFO bucket per (class, priority), each kept
// sorted by (ready time, tiebreak). Ready times arrive in nondecreasing order
// during execution, so a push is an append (a bucket that receives an
// out-of-order push is re-sorted lazily on the next pop) and a pop takes the
// head of the first non-empty bucket. The order is total, so choices at equal
// times are deterministic.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <iterator>
#include <utility>
#include <vector>

namespace slicesched {

struct DisciplineKey {
  uint8_t priority_class = 0;  // PriorityClass value: 0 online, 1 offline
  int32_t priority = 0;
  int64_t ready_ns = 0;
  uint64_t tiebreak = 0;
};

// True when `a` runs before `b`.
constexpr bool RunsBefore(const DisciplineKey& a, const DisciplineKey& b) {
  if (a.priority_class != b.priority_class) return a.priority_class < b.priority_class;
  if (a.priority != b.priority) return a.priority > b.priority;
  if (a.ready_ns != b.ready_ns) return a.ready_ns < b.ready_ns;
  return a.tiebreak < b.tiebreak;
}

// The ready operators of one device, popped in RunsBefore order.
class ReadyQueue {
 public:
  void Clear() {
    for (Bucket& b : buckets_) {
      b.q.clear();
      b.head = 0;
      b.sorted = true;
    }
    size_ = 0;
    first_ = 0;
  }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  // Buckets held, empty ones included (beyond kKeepBuckets buckets, at most
  // about as many empty ones as non-empty ones; see Pop()).
  size_t num_buckets() const { return buckets_.size(); }
  static constexpr size_t kKeepBuckets = 8;

  void Push(const DisciplineKey& key, uint32_t item) {
    const size_t i = BucketFor(key.priority_class, key.priority);
    if (i < first_) first_ = i;
    Bucket& b = buckets_[i];
    const Entry e{key.ready_ns, key.tiebreak, item};
    if (b.q.size() > b.head && Before(e, b.q.back())) b.sorted = false;
    b.q.push_back(e);
    ++size_;
  }

  // The key of the item Pop() would return, without removing it. Requires
  // !empty().
  DisciplineKey Front() {
    const Bucket& b = buckets_[SortedFront()];
    const Entry& e = b.q[b.head];
    return DisciplineKey{b.cls, b.prio, e.ready_ns, e.tiebreak};
  }

  // Removes and returns the item that runs first. Requires !empty().
  uint32_t Pop(DisciplineKey* key = nullptr) {
    const size_t i = SortedFront();
    Bucket& b = buckets_[i];
    const uint8_t cls = b.cls;
    const int32_t prio = b.prio;
    const Entry e = b.q[b.head++];
    if (b.head == b.q.size()) {
      b.q.clear();
      b.head = 0;
      // Emptied, and so is every bucket before it (SortedFront). With more
      // than a handful of buckets, that empty prefix is dropped, so a queue
      // whose priorities keep changing (a master that ranks its instances
      // first-come first-served) holds the buckets of its live priorities
      // and about as many empty ones, not one per priority it ever saw. It
      // goes in one erase once it is at least half of the buckets: dropping
      // each bucket as it empties moved every later bucket on each such pop
      // (a thousand buckets with a thousand instances in flight).
      if (buckets_.size() > kKeepBuckets) DropEmptyPrefix(i + 1);
    } else if (b.head >= kCompactAfter && 2 * b.head >= b.q.size()) {
      // A busy device's bucket rarely empties: drop the popped prefix once
      // it is at least half the vector (moving at most as many entries as
      // were popped since the last drop), so the bucket stays about twice
      // its live size, and in cache, instead of growing with every push.
      b.q.erase(b.q.begin(), b.q.begin() + static_cast<std::ptrdiff_t>(b.head));
      b.head = 0;
    }
    --size_;
    if (key != nullptr) *key = DisciplineKey{cls, prio, e.ready_ns, e.tiebreak};
    return e.item;
  }

 private:
  struct Entry {
    int64_t ready_ns;
    uint64_t tiebreak;
    uint32_t item;
  };
  struct Bucket {
    uint8_t cls;
    int32_t prio;
    std::vector<Entry> q;
    size_t head = 0;
    bool sorted = true;
  };
  // Index of the first non-empty bucket, made first_ (every bucket before it
  // is empty), its entries sorted. Requires !empty(): an entry exists at or
  // after first_, so the scan needs no bound check.
  size_t SortedFront() {
    assert(!empty());
    size_t i = first_;
    while (buckets_[i].head == buckets_[i].q.size()) ++i;
    first_ = i;
    if (!buckets_[i].sorted) SortBucket(buckets_[i]);
    return i;
  }
  // Out of line: rare, and inlined it would bloat every caller of Pop.
  [[gnu::noinline]] static void SortBucket(Bucket& b) {
    std::sort(b.q.begin() + static_cast<std::ptrdiff_t>(b.head), b.q.end(), Before);
    b.sorted = true;
  }
  static bool Before(const Entry& a, const Entry& b) {
    return a.ready_ns != b.ready_ns ? a.ready_ns < b.ready_ns : a.tiebreak < b.tiebreak;
  }
  // Drops buckets [0, k), all empty, once they are at least half of the
  // buckets; the hints are then reset.
  [[gnu::noinline]] void DropEmptyPrefix(size_t k) {
    if (2 * k < buckets_.size()) return;
    // Their (empty) vectors are kept for the next new buckets: with
    // per-instance priorities a bucket is created and dropped about once
    // per operator, and each would otherwise cost a heap allocation and a
    // free.
    for (size_t i = 0; i < k && spare_.size() < kKeepBuckets; ++i) spare_.push_back(std::move(buckets_[i].q));
    buckets_.erase(buckets_.begin(), buckets_.begin() + static_cast<std::ptrdiff_t>(k));
    first_ = 0;
    std::fill(std::begin(hint_), std::end(hint_), kNoHint);
  }
  // Index of the bucket of (cls, prio), created if missing.
  size_t BucketFor(uint8_t cls, int32_t prio) {
    // A direct-mapped hint per (class, priority) slot. A hint is kNoHint or
    // a valid bucket index (every insert and drop resets them all), so only
    // its bucket's (class, priority) is checked: a colliding slot costs the
    // search below.
    const uint8_t guess = hint_[HintSlot(cls, prio)];
    if (guess != kNoHint && buckets_[guess].cls == cls && buckets_[guess].prio == prio) return guess;
    return FindOrAddBucket(cls, prio);
  }
  // True when the bucket of (cls, prio) comes after that of (cls2, prio2).
  static bool After(uint8_t cls, int32_t prio, uint8_t cls2, int32_t prio2) {
    return cls > cls2 || (cls == cls2 && prio < prio2);
  }
  static size_t HintSlot(uint8_t cls, int32_t prio) {
    return (static_cast<size_t>(cls) * 8 + static_cast<uint32_t>(prio)) % kHintSlots;
  }
  size_t FindOrAddBucket(uint8_t cls, int32_t prio) {
    // Buckets stay ordered by (class, -priority). Usually a handful, but one
    // per instance in flight under first-come first-served priorities (a
    // thousand with every request queued at once, where the direct-mapped
    // hints collide): a binary search.
    const auto it = std::lower_bound(buckets_.begin(), buckets_.end(), std::pair{cls, prio},
                                     [](const Bucket& b, const std::pair<uint8_t, int32_t>& key) {
                                       return After(key.first, key.second, b.cls, b.prio);
                                     });
    const size_t i = static_cast<size_t>(it - buckets_.begin());
    if (it != buckets_.end() && it->cls == cls && it->prio == prio) {
      if (i < kNoHint) hint_[HintSlot(cls, prio)] = static_cast<uint8_t>(i);
      return i;
    }
    Bucket nb;
    nb.cls = cls;
    nb.prio = prio;
    if (!spare_.empty()) {
      nb.q = std::move(spare_.back());
      spare_.pop_back();
    }
    buckets_.insert(buckets_.begin() + static_cast<std::ptrdiff_t>(i), std::move(nb));
    // The insert shifted every later bucket: the hints are refilled lazily.
    std::fill(std::begin(hint_), std::end(hint_), kNoHint);
    if (i < kNoHint) hint_[HintSlot(cls, prio)] = static_cast<uint8_t>(i);
    // A bucket inserted at or before first_ is the one being pushed to, and
    // Push lowers first_ to it.
    return i;
  }

  static constexpr size_t kHintSlots = 32;
  static constexpr uint8_t kNoHint = 0xff;
  static constexpr size_t kCompactAfter = 32;  // popped entries before a bucket is compacted
  std::vector<Bucket> buckets_;
  std::vector<std::vector<Entry>> spare_;  // emptied vectors of dropped buckets
  size_t size_ = 0;
  uint8_t hint_[kHintSlots] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                               0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};  // kNoHint, or a bucket
  size_t first_ = 0;  // no bucket before this one holds an entry
};

}  // namespace slicesched
