//===- Mutations.h - Byte edits the fuzz drivers share ----------*- C++ -*-===//
//
// The drivers that run without libFuzzer mutate their seeds themselves;
// these are the edits that know nothing of the input's format.
//
//===----------------------------------------------------------------------===//

#ifndef KVC_FUZZ_MUTATIONS_H
#define KVC_FUZZ_MUTATIONS_H

#include <cstdint>
#include <cstdlib>
#include <random>
#include <string>

namespace kvc::fuzz {

/// The seed of a driver's mutations: KVC_FUZZ_SEED when set (a longer
/// exploration than the ctest's, on inputs of its own), else the driver's
/// fixed `ctestSeed`, so that the ctest tries the same inputs on every run.
inline uint64_t mutationSeed(uint64_t ctestSeed) {
  const char *seed = std::getenv("KVC_FUZZ_SEED");
  return seed && *seed ? std::strtoull(seed, nullptr, 10) : ctestSeed;
}

/// `input` with one to eight bytes flipped, cut short at a random length,
/// or grown by up to 64 random bytes.
inline void damage(std::string &input, std::mt19937_64 &rng) {
  switch (rng() % 3) {
  case 0:
    for (int f = 0, n = 1 + int(rng() % 8); f < n && !input.empty(); ++f)
      input[rng() % input.size()] ^= char(1 + rng() % 255);
    break;
  case 1:
    input.resize(rng() % (input.size() + 1));
    break;
  default:
    for (int f = 0, n = int(rng() % 64); f < n; ++f)
      input.push_back(char(rng()));
  }
}

} // namespace kvc::fuzz

#endif // KVC_FUZZ_MUTATIONS_H
