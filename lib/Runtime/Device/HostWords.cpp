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
