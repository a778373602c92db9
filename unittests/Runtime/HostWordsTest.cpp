//===- HostWordsTest.cpp - Host memory a device uploads from --------------===//

#include "kvc/Runtime/Device/HostWords.h"

#include <gtest/gtest.h>

#include <map>
#include <numeric>

namespace kvc {
namespace {

/// Heap memory that records its live blocks, or refuses every request.
class RecordingMemory final : public HostMemory {
public:
  explicit RecordingMemory(bool refuse = false) : refuse_(refuse) {}
  ~RecordingMemory() override { EXPECT_TRUE(live.empty()); }
  void *allocate(std::size_t bytes) override {
    if (refuse_)
      return nullptr;
    void *block = heapMemory().allocate(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % 64, 0u);
    live[block] = bytes;
    return block;
  }
  void deallocate(void *block, std::size_t bytes) override {
    auto it = live.find(block);
    ASSERT_NE(it, live.end()) << "a block given back to the wrong memory";
    EXPECT_EQ(it->second, bytes);
    live.erase(it);
    heapMemory().deallocate(block, bytes);
  }
  std::map<void *, std::size_t> live;

private:
  bool refuse_;
};

TEST(HostWordsTest, GrowsInItsMemoryKeepingItsWords) {
  RecordingMemory memory;
  {
    HostWords words(&memory);
    EXPECT_EQ(words.owner(), nullptr);
    words.resize(3);
    EXPECT_EQ(std::vector<uint16_t>(words.begin(), words.end()),
              (std::vector<uint16_t>{0, 0, 0}));
    std::iota(words.begin(), words.end(), uint16_t(7));
    words.resize(1000); // Grows: the first words move along, the rest 0.
    EXPECT_EQ(words.owner(), &memory);
    EXPECT_EQ(memory.live.size(), 1u);
    EXPECT_EQ(words[0], 7);
    EXPECT_EQ(words[2], 9);
    EXPECT_EQ(words[3], 0);
    EXPECT_EQ(words[999], 0);
    const uint16_t *block = words.data();
    words.resize(10); // Shrinks in place.
    words.resizeForOverwrite(1000);
    EXPECT_EQ(words.data(), block);
    EXPECT_EQ(words[2], 9);
    words.clear();
    EXPECT_TRUE(words.empty());
    EXPECT_EQ(words.capacity(), 1000u);
    const uint16_t from[] = {1, 2};
    words.assign(from, 2);
    EXPECT_EQ(std::vector<uint16_t>(words.begin(), words.end()),
              (std::vector<uint16_t>{1, 2}));
  }
  EXPECT_TRUE(memory.live.empty());
}

// Blocks travel with the memory that gave them: swapped, moved or released,
// each goes back to its own.
TEST(HostWordsTest, EveryBlockGoesBackToItsOwnMemory) {
  RecordingMemory device;
  HostWords pinned(&device), heap;
  pinned.resize(64);
  heap.resize(32);
  pinned[0] = 1;
  heap[0] = 2;
  pinned.swap(heap);
  EXPECT_EQ(heap.owner(), &device);
  EXPECT_EQ(heap.memory(), &device);
  EXPECT_EQ(pinned.owner(), &heapMemory());
  EXPECT_EQ(heap[0], 1);
  EXPECT_EQ(pinned[0], 2);
  HostWords moved(std::move(heap));
  EXPECT_EQ(moved.owner(), &device);
  EXPECT_EQ(heap.data(), nullptr);
  moved = std::move(pinned); // Gives the device's block back.
  EXPECT_TRUE(device.live.empty());
  EXPECT_EQ(moved.owner(), &heapMemory());
  EXPECT_EQ(moved[0], 2);
  HostWords again(&device);
  again.resize(8);
  again.release();
  EXPECT_EQ(again.size(), 0u);
  EXPECT_EQ(again.memory(), &device);
  EXPECT_TRUE(device.live.empty());
}

// A device out of its memory leaves the words on the heap: uploaded as any
// other, never lost.
TEST(HostWordsTest, FallsBackToTheHeapWhenItsMemoryRefuses) {
  RecordingMemory full(/*refuse=*/true);
  HostWords words(&full);
  words.resize(100);
  EXPECT_EQ(words.owner(), &heapMemory());
  EXPECT_EQ(words.memory(), &full);
  words[99] = 5;
  words.resize(200);
  EXPECT_EQ(words[99], 5);
}

// Blocks given back are kept by size class and handed to the next request
// of the class (or of one up to twice the size), up to the bound; beyond it
// they go back to where they came from.
TEST(KeptHostMemoryTest, KeepsBlocksForTheNextRequestOfTheirSize) {
  KeptHostMemory memory(/*keptBytes=*/size_t(3) << 20);
  void *a = memory.allocate(1000); // The 4 KiB class.
  memory.deallocate(a, 1000);
  EXPECT_EQ(memory.keptBytes(), 4096u);
  EXPECT_EQ(memory.allocate(4096), a);
  EXPECT_EQ(memory.obtained(), 1);
  void *big = memory.allocate((size_t(1) << 20) + 1); // 2 MiB.
  memory.deallocate(big, (size_t(1) << 20) + 1);
  EXPECT_EQ(memory.allocate(size_t(1) << 20), big); // 1 MiB: twice fits.
  memory.deallocate(big, size_t(1) << 20);
  void *small = memory.allocate(100);
  EXPECT_NE(small, big); // 2 MiB is more than twice 4 KiB.
  EXPECT_EQ(memory.obtained(), 3);
  void *c = memory.allocate(size_t(2) << 20); // The kept 2 MiB block.
  EXPECT_EQ(c, big);
  void *d = memory.allocate(size_t(2) << 20);
  memory.deallocate(c, size_t(2) << 20);
  memory.deallocate(d, size_t(2) << 20); // Past the 3 MiB bound: freed.
  EXPECT_EQ(memory.keptBytes(), size_t(2) << 20);
  memory.deallocate(a, 4096);
  memory.deallocate(small, 100);
  EXPECT_EQ(memory.keptBytes(), (size_t(2) << 20) + 2 * 4096);
}

} // namespace
} // namespace kvc
