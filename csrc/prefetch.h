// Software prefetch in the kernels' loops.
//
// On Intel Sapphire Rapids one core's stream of loads leaves the memory idle
// part of the time: a float32 loop issues ~16 instructions per 64-byte line
// (widening to float64, multiply-adding), so the reorder buffer holds only ~30
// lines, and the hardware prefetchers alone do not keep enough of them in
// flight (12 GB/s from DRAM against 17 GB/s for a plain float32 sum, one core).
// Asking for the line prefetch_bytes() ahead of each block brings the loop to
// that plain read's speed (docs/design.md, "Where the cycles go"). The loops
// prefetch only lines of their own piece: the next task may be another
// thread's.
//
// The distance is a runtime setting (fastnorm.h: prefetch_bytes), 0 for none;
// whatever it is, the same elements go to the same lanes in the same order,
// so the bits never depend on it.
#pragma once

#include <cstdint>

#include "fastnorm.h"

namespace fastnorm {

// Hints the lines of `Bytes` bytes (a block of a loop) `ahead` bytes past x.
template <int Bytes>
FASTNORM_INLINE void prefetch_ahead(const void* x, int64_t ahead) {
  const char* p = static_cast<const char*>(x) + ahead;
  for (int c = 0; c < Bytes; c += 64) FASTNORM_PREFETCH(p + c);
}

// Where a loop over n elements of type T stops prefetching: a block [i, i + B)
// with i + B <= the result has the lines `ahead` bytes on inside the piece. 0
// (no prefetching block) when ahead is 0.
template <class T>
FASTNORM_INLINE int64_t prefetch_stop(int64_t n, int64_t ahead) {
  return ahead > 0 ? n - ahead / int64_t(sizeof(T)) : 0;
}

}  // namespace fastnorm
