#include "slicesched/comm/arbitration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>

namespace slicesched {
namespace {

TEST(ArbitrationTest, PriorityThenAgeThenSequence) {
  std::vector<TransferRequest> pending = {
      {1, 0, 1, 0, 5, 1}, {2, 0, 2, 3, 9, 2}, {3, 2, 3, 0, 1, 3}, {4, 1, 3, 0, 1, 4}};
  std::vector<uint8_t> busy(4, 0);
  std::vector<uint32_t> granted;
  ArbitrateTransfers(&pending, &busy, &granted);
  // 2 (prio 3) takes 0 and 2; then 4 (age 1, seq 4 after 3, but 3 conflicts on 2) takes 1 and 3.
  EXPECT_THAT(granted, ::testing::ElementsAre(2, 4));
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].id, 3u);
  EXPECT_EQ(pending[1].id, 1u);
  EXPECT_THAT(busy, ::testing::ElementsAre(1, 1, 1, 1));
}

// Requests queued after an arbitration (all older ones blocked): the new
// ones are granted by the rule among themselves, the blocked head is kept,
// and the result equals a full arbitration of everything.
TEST(ArbitrationTest, NewRequestsAfterAnArbitrationMatchTheFullRule) {
  // Device 0 busy: request 1 (0 -> 1) stays blocked. Then three requests out
  // of device 2, queued lowest priority first.
  const std::vector<TransferRequest> head = {{1, 0, 1, 9, 0, 1}};
  const std::vector<TransferRequest> fresh = {{2, 2, 3, 1, 5, 2}, {3, 2, 4, 7, 5, 3}, {4, 2, 5, 4, 5, 4}};
  std::vector<TransferRequest> pending = head;
  pending.insert(pending.end(), fresh.begin(), fresh.end());
  std::vector<TransferRequest> full = pending;
  std::vector<uint8_t> busy = {1, 0, 0, 0, 0, 0};
  std::vector<uint8_t> full_busy = busy;
  std::vector<uint32_t> granted, full_granted;
  ArbitrateNewTransfers(&pending, head.size(), &busy, &granted);
  ArbitrateTransfers(&full, &full_busy, &full_granted);
  EXPECT_THAT(granted, ::testing::ElementsAre(3));  // priority 7 first
  EXPECT_EQ(granted, full_granted);
  EXPECT_EQ(busy, full_busy);
  ASSERT_EQ(pending.size(), 3u);
  EXPECT_EQ(pending[0].id, 1u);  // the head is left in place
  EXPECT_EQ(pending[1].id, 4u);  // then the rest of the new ones, by the rule
  EXPECT_EQ(pending[2].id, 2u);
}

TEST(ArbitrationTest, NoDeviceInTwoTransfersAndEveryoneEventuallyGoes) {
  std::mt19937_64 rng(7);
  std::vector<TransferRequest> pending;
  for (uint32_t i = 0; i < 2000; ++i) {
    uint16_t src = rng() % 8, dst = rng() % 8;
    if (dst == src) dst = (dst + 1) % 8;
    pending.push_back({i, src, dst, static_cast<int32_t>(rng() % 4), static_cast<int64_t>(rng() % 100), i});
  }
  const std::vector<TransferRequest> all = pending;
  std::vector<uint8_t> busy(8, 0);
  size_t done = 0;
  int rounds = 0;
  while (!pending.empty()) {
    std::vector<uint32_t> granted;
    ArbitrateTransfers(&pending, &busy, &granted);
    ASSERT_FALSE(granted.empty());  // progress every round
    std::vector<int> uses(8, 0);
    for (uint32_t id : granted) {
      uses[all[id].src]++;
      uses[all[id].dst]++;
    }
    for (int d = 0; d < 8; ++d) EXPECT_LE(uses[d], 1);
    done += granted.size();
    std::fill(busy.begin(), busy.end(), 0);  // all granted transfers finish
    ++rounds;
  }
  EXPECT_EQ(done, 2000u);
  EXPECT_LE(rounds, 2000);
}

TEST(ArbitrationTest, OnlineOutranksOffline) {
  EXPECT_GT(TransferPriority(0, -100), TransferPriority(1, 100000));
  EXPECT_GT(TransferPriority(1, 2), TransferPriority(1, 1));
}

}  // namespace
}  // namespace slicesched
