// Small deterministic hashes for seeded, reproducible draws that must not
// depend on the standard library's distributions (the same seed gives the
// same numbers with any compiler): FNV-1a over strings, the SplitMix64
// finaliser, and a uniform double in [0, 1) from a hash.
#pragma once

#include <cstdint>
#include <string_view>

namespace slicesched {

// FNV-1a of `s`, continuing from `h` (the FNV offset basis by default).
inline uint64_t Fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// SplitMix64's finaliser of x plus the golden-ratio increment.
inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) from the top 53 bits of Mix(h).
inline double Unit01(uint64_t h) { return static_cast<double>(Mix(h) >> 11) * 0x1.0p-53; }

}  // namespace slicesched
