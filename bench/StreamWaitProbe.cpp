//===- StreamWaitProbe.cpp - Which stream waits a GPU releases ------------===//
//
// kvc-stream-wait-probe: each way of holding a CUDA stream on a 32-bit word
// (cuStreamWaitValue32) and raising the word, tried in a child process of
// its own that is killed after 4 s, so that a stream that never passes
// cannot hang the probe or the machine's later work. The runtime's stream
// waits (WaitWords in CudaDeviceImpl.h) are the first way; the others say
// which alternative a GPU would take where that one fails. Then the device
// attributes that bear on it. Exits 77 where CUDA finds no GPU, 1 when the
// runtime's way fails, else 0 (scripts/gpu-check.sh runs it before the
// tests).
//
//===----------------------------------------------------------------------===//

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace {

enum class Word { HostAlloc, HostRegister, Device };
enum class Raise { HostStore, StreamWrite, Memcpy };

struct Way {
  const char *name;
  Word word;
  Raise raise;
  /// The waiting stream synchronizes with the legacy default stream.
  bool blocking;
};

constexpr Way kWays[] = {
    {"mapped pinned word, the host's store (the runtime's way)",
     Word::HostAlloc, Raise::HostStore, false},
    {"the same on a blocking stream", Word::HostAlloc, Raise::HostStore, true},
    {"registered host memory, the host's store", Word::HostRegister,
     Raise::HostStore, false},
    {"mapped pinned word, cuStreamWriteValue32 on another stream",
     Word::HostAlloc, Raise::StreamWrite, false},
    {"device word, cuStreamWriteValue32 on another stream", Word::Device,
     Raise::StreamWrite, false},
    {"device word, cudaMemcpyAsync on another stream", Word::Device,
     Raise::Memcpy, false},
};

// A child's exit codes.
constexpr int kWorks = 0, kPassedEarly = 20, kNeverPassed = 30;

bool passedWithin(cudaEvent_t event, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  do {
    if (cudaEventQuery(event) == cudaSuccess)
      return true;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

int tryWay(const Way &way) {
  cudaStream_t waiting = nullptr, raising = nullptr;
  if (cudaStreamCreateWithFlags(
          &waiting, way.blocking ? cudaStreamDefault : cudaStreamNonBlocking) ||
      cudaStreamCreateWithFlags(&raising, cudaStreamNonBlocking))
    return 10;
  cudaEvent_t passed = nullptr;
  if (cudaEventCreateWithFlags(&passed, cudaEventDisableTiming))
    return 10;
  volatile uint32_t *host = nullptr;
  void *device = nullptr;
  if (way.word == Word::Device) {
    if (cudaMalloc(&device, 64) || cudaMemset(device, 0, 64))
      return 11;
  } else {
    void *memory = nullptr;
    if (way.word == Word::HostAlloc) {
      if (cudaHostAlloc(&memory, 64,
                        cudaHostAllocMapped | cudaHostAllocPortable))
        return 11;
    } else {
      memory = std::aligned_alloc(4096, 4096);
      if (!memory ||
          cudaHostRegister(memory, 4096,
                           cudaHostRegisterMapped | cudaHostRegisterPortable))
        return 11;
    }
    if (cudaHostGetDevicePointer(&device, memory, 0))
      return 11;
    host = static_cast<volatile uint32_t *>(memory);
    __atomic_store_n(host, 0u, __ATOMIC_SEQ_CST);
  }
  const CUdeviceptr word = reinterpret_cast<CUdeviceptr>(device);
  if (cuStreamWaitValue32(reinterpret_cast<CUstream>(waiting), word, 1,
                          CU_STREAM_WAIT_VALUE_GEQ) != CUDA_SUCCESS ||
      cudaEventRecord(passed, waiting))
    return 12;
  using namespace std::chrono_literals;
  if (passedWithin(passed, 50ms))
    return kPassedEarly;
  static const uint32_t one = 1;
  switch (way.raise) {
  case Raise::HostStore:
    __atomic_store_n(host, 1u, __ATOMIC_SEQ_CST);
    break;
  case Raise::StreamWrite:
    if (cuStreamWriteValue32(reinterpret_cast<CUstream>(raising), word, 1, 0) !=
        CUDA_SUCCESS)
      return 13;
    break;
  case Raise::Memcpy:
    if (cudaMemcpyAsync(device, &one, sizeof(one), cudaMemcpyHostToDevice,
                        raising))
      return 13;
    break;
  }
  return passedWithin(passed, 1500ms) ? kWorks : kNeverPassed;
}

const char *verdict(int code) {
  switch (code) {
  case kWorks:
    return "works";
  case kPassedEarly:
    return "passed before the word was raised";
  case kNeverPassed:
    return "never passed after the word was raised";
  default:
    return "a CUDA call failed";
  }
}

} // namespace

int main() {
  // The children start CUDA each on their own: the parent touches it only
  // once they are done (a forked child cannot use a parent's CUDA).
  int status = 0;
  for (const Way &way : kWays) {
    const bool runtimes = &way == &kWays[0];
    const pid_t child = fork();
    if (child == 0) {
      alarm(4);
      _exit(tryWay(way));
    }
    int how = 0;
    if (child < 0 || waitpid(child, &how, 0) != child) {
      std::perror("kvc-stream-wait-probe: fork");
      return 1;
    }
    if (runtimes && WIFEXITED(how) && WEXITSTATUS(how) == 10) {
      std::printf("kvc-stream-wait-probe: CUDA finds no GPU\n");
      return 77;
    }
    if (WIFEXITED(how))
      std::printf("%-62s %s\n", way.name, verdict(WEXITSTATUS(how)));
    else
      std::printf("%-62s hung: killed by signal %d\n", way.name, WTERMSIG(how));
    if (runtimes && !(WIFEXITED(how) && WEXITSTATUS(how) == kWorks))
      status = 1;
    std::fflush(stdout);
  }
  struct Attribute {
    CUdevice_attribute attribute;
    const char *name;
  };
  constexpr Attribute kAttributes[] = {
      {CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
       "host pointers for registered memory"},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
       "64-bit stream memory operations"},
      {CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR, "waits on NOR"},
      {CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, "flushes remote writes"},
      {CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS, "pageable memory access"},
  };
  CUdevice device = 0;
  if (cuInit(0) == CUDA_SUCCESS && cuDeviceGet(&device, 0) == CUDA_SUCCESS)
    for (const Attribute &a : kAttributes) {
      int value = -1;
      cuDeviceGetAttribute(&value, a.attribute, device);
      std::printf("attribute: %s: %d\n", a.name, value);
    }
  return status;
}
