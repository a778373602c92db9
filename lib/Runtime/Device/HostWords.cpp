//===- HostWords.cpp - Host memory a device uploads from ------------------===//

#include "kvc/Runtime/Device/HostWords.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <utility>

namespace kvc {

namespace {

constexpr std::align_val_t kAlignment{64};

class Heap final : public HostMemory {
public:
  void *allocate(std::size_t bytes) override {
    return ::operator new(bytes, kAlignment, std::nothrow);
  }
  void deallocate(void *block, std::size_t) override {
    ::operator delete(block, kAlignment);
  }
};

} // namespace

HostMemory &heapMemory() {
  static Heap heap;
  return heap;
}

KeptHostMemory::~KeptHostMemory() { disposeKept(); }

void KeptHostMemory::disposeKept() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto &[bytes, block] : kept_)
    dispose(block, bytes);
  kept_.clear();
  keptNow_ = 0;
}

std::size_t KeptHostMemory::sizeClass(std::size_t bytes) {
  constexpr std::size_t kMiB = std::size_t(1) << 20;
  if (bytes > kMiB)
    return (bytes + kMiB - 1) / kMiB * kMiB;
  std::size_t size = 4096;
  while (size < bytes)
    size *= 2;
  return size;
}

void *KeptHostMemory::allocate(std::size_t bytes) {
  const std::size_t size = sizeClass(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  // A kept block of the class, or of a larger one up to twice the size (a
  // buffer half again as large as before).
  auto it = kept_.lower_bound(size);
  if (it != kept_.end() && it->first <= 2 * size) {
    void *block = it->second;
    keptNow_ -= it->first;
    live_[block] = it->first;
    kept_.erase(it);
    return block;
  }
  void *block = obtain(size);
  if (block) {
    live_[block] = size;
    ++obtained_;
  }
  return block;
}

void KeptHostMemory::deallocate(void *block, std::size_t) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(block);
  if (it == live_.end())
    return; // Not given out here.
  const std::size_t size = it->second;
  live_.erase(it);
  if (keptNow_ + size > keptBytes_) {
    dispose(block, size);
    return;
  }
  keptNow_ += size;
  kept_.emplace(size, block);
}

std::size_t KeptHostMemory::keptBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return keptNow_;
}

int64_t KeptHostMemory::obtained() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return obtained_;
}

void *KeptHostMemory::obtain(std::size_t bytes) {
  return heapMemory().allocate(bytes);
}

void KeptHostMemory::dispose(void *block, std::size_t bytes) {
  heapMemory().deallocate(block, bytes);
}

HostMemory &keptHeapMemory() {
  // Never destroyed: buffers of static objects may come back at exit.
  static KeptHostMemory &memory = *new KeptHostMemory();
  return memory;
}

HostWords::HostWords(HostWords &&other) noexcept : memory_(other.memory_) {
  swap(other);
}

HostWords &HostWords::operator=(HostWords &&other) noexcept {
  if (this != &other) {
    release();
    memory_ = other.memory_;
    swap(other);
  }
  return *this;
}

HostWords::~HostWords() { release(); }

void HostWords::reserve(std::size_t n) {
  if (n <= capacity_)
    return;
  // Half again as much: a buffer filled object by object grows a few times.
  const std::size_t capacity = std::max(n, capacity_ + capacity_ / 2);
  const std::size_t bytes = capacity * sizeof(uint16_t);
  HostMemory *owner = memory_;
  void *block = owner->allocate(bytes);
  if (!block && owner != &heapMemory()) {
    // A device out of (pinned) memory: the heap's, uploaded as any other.
    owner = &heapMemory();
    block = owner->allocate(bytes);
  }
  if (!block)
    throw std::bad_alloc();
  if (size_)
    std::memcpy(block, words_, size_ * sizeof(uint16_t));
  const std::size_t size = size_;
  release();
  words_ = static_cast<uint16_t *>(block);
  owner_ = owner;
  capacity_ = capacity;
  size_ = size;
}

void HostWords::resize(std::size_t n) {
  const std::size_t old = size_;
  resizeForOverwrite(n);
  if (n > old)
    std::memset(words_ + old, 0, (n - old) * sizeof(uint16_t));
}

void HostWords::resizeForOverwrite(std::size_t n) {
  reserve(n);
  size_ = n;
}

void HostWords::assign(const uint16_t *from, std::size_t n) {
  clear();
  resizeForOverwrite(n);
  if (n)
    std::memcpy(words_, from, n * sizeof(uint16_t));
}

void HostWords::release() {
  if (words_)
    owner_->deallocate(words_, capacity_ * sizeof(uint16_t));
  words_ = nullptr;
  owner_ = nullptr;
  size_ = capacity_ = 0;
}

void HostWords::swap(HostWords &other) noexcept {
  std::swap(memory_, other.memory_);
  std::swap(owner_, other.owner_);
  std::swap(words_, other.words_);
  std::swap(size_, other.size_);
  std::swap(capacity_, other.capacity_);
}

} // namespace kvc
