//===- HostWords.h - Host memory a device uploads from ----------*- C++ -*-===//
//
// A chunk on its way to the device is checked and decoded into host memory,
// then uploaded. A device whose DMA reads only page-locked memory (CUDA)
// would copy each chunk once more, into pinned staging of its own, on the
// upload lane; instead it hands out that memory (Device::hostMemory) and
// the decoder writes the chunk where the DMA reads it.
//
//   HostMemory  where blocks of host memory come from: the heap (heapMemory)
//               or a device's; KeptHostMemory keeps the blocks it is given
//               back for the next request of their size, so that staging
//               buffers cost their first touch once a process, not once a
//               restore (a fresh page faults in at about the cost of
//               reading it, on a VM).
//   HostWords   a growable array of 16-bit words over one HostMemory: the
//               part of std::vector<uint16_t> the runtime uses, plus
//               resizeForOverwrite, which leaves new words unset for a
//               decoder about to write them all.
//
// A HostWords owns its block and remembers which memory gave it (a device
// that cannot allocate leaves it on the heap); a swap or a move carries the
// block with its owner and the memory it grows in, so every block goes back
// where it came from. Not thread-safe: one chunk's buffer is used by one
// step at a time.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_RUNTIME_DEVICE_HOSTWORDS_H
#define KVC_RUNTIME_DEVICE_HOSTWORDS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

namespace kvc {

class HostMemory {
public:
  virtual ~HostMemory() = default;
  /// `bytes` (> 0) of host memory aligned to 64 bytes, or null when none
  /// can be had.
  virtual void *allocate(std::size_t bytes) = 0;
  /// Gives back what allocate(`bytes`) returned.
  virtual void deallocate(void *block, std::size_t bytes) = 0;
};

/// The heap's memory (aligned operator new).
HostMemory &heapMemory();

/// Memory that keeps blocks given back, by size class (powers of two up to
/// 1 MiB, whole MiB above), up to `keptBytes` in all, and hands a kept
/// block of the class (or of the next, up to twice the size) to the next
/// request. Blocks come from obtain and go back through dispose: the
/// heap's by default, pinned memory on CUDA. Thread-safe.
class KeptHostMemory : public HostMemory {
public:
  explicit KeptHostMemory(std::size_t keptBytes = std::size_t(1) << 30)
      : keptBytes_(keptBytes) {}
  /// Disposes of the kept blocks; blocks still out must not come back.
  ~KeptHostMemory() override;
  void *allocate(std::size_t bytes) override;
  void deallocate(void *block, std::size_t bytes) override;
  /// Bytes kept now, and blocks obtained so far.
  std::size_t keptBytes() const;
  int64_t obtained() const;

protected:
  /// A new block of `bytes` (a size class), or null.
  virtual void *obtain(std::size_t bytes);
  virtual void dispose(void *block, std::size_t bytes);
  /// For a subclass's destructor: disposes of the kept blocks while its
  /// dispose is still its own.
  void disposeKept();

private:
  static std::size_t sizeClass(std::size_t bytes);

  const std::size_t keptBytes_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void *> kept_;
  std::map<void *, std::size_t> live_;
  std::size_t keptNow_ = 0;
  int64_t obtained_ = 0;
};

/// The process's kept heap memory: where a device without memory of its own
/// (the CPU's) has staging buffers decode.
HostMemory &keptHeapMemory();

class HostWords {
public:
  /// Empty, growing in `memory` (the heap's when null).
  explicit HostWords(HostMemory *memory = nullptr)
      : memory_(memory ? memory : &heapMemory()) {}
  HostWords(HostWords &&other) noexcept;
  HostWords &operator=(HostWords &&other) noexcept;
  HostWords(const HostWords &) = delete;
  HostWords &operator=(const HostWords &) = delete;
  ~HostWords();

  uint16_t *data() { return words_; }
  const uint16_t *data() const { return words_; }
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  bool empty() const { return size_ == 0; }
  uint16_t *begin() { return words_; }
  uint16_t *end() { return words_ + size_; }
  const uint16_t *begin() const { return words_; }
  const uint16_t *end() const { return words_ + size_; }
  uint16_t &operator[](std::size_t i) { return words_[i]; }
  const uint16_t &operator[](std::size_t i) const { return words_[i]; }

  /// `n` words: those kept keep their values, new ones are zero.
  void resize(std::size_t n);
  /// `n` words: those kept keep their values, new ones are unset.
  void resizeForOverwrite(std::size_t n);
  /// Room for `n` words without another allocation; keeps the values.
  void reserve(std::size_t n);
  /// Size 0; keeps the block.
  void clear() { size_ = 0; }
  /// `n` words copied from `from`.
  void assign(const uint16_t *from, std::size_t n);
  /// Frees the block (size and capacity 0).
  void release();
  void swap(HostWords &other) noexcept;

  /// The memory it grows in, and the one that gave its block (null while
  /// it holds none): a device uploads in place from blocks of its own.
  HostMemory *memory() const { return memory_; }
  HostMemory *owner() const { return owner_; }

private:
  HostMemory *memory_;
  HostMemory *owner_ = nullptr;
  uint16_t *words_ = nullptr;
  std::size_t size_ = 0, capacity_ = 0;
};

} // namespace kvc

#endif // KVC_RUNTIME_DEVICE_HOSTWORDS_H
