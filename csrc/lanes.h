// The lane layout every instruction set shares, so that they all give the same
// bits.
//
// A sum of |x| or |x|^2 runs on kLanes = 32 float64 accumulators. A piece is
// read in blocks of 32 elements; element e of a block goes to lane lane_of(e)
// and each lane adds its elements block after block, in order. The lanes are 8
// groups G0..G7 of 4 (G_k holds lanes 4k..4k+3): one AVX2 register per group,
// two groups per AVX-512 register, four plain doubles each in the portable
// loops. At the end the lanes are folded in one fixed tree:
//
//   H_k = G_k + G_{k+4} (k < 4),  I_k = H_k + H_{k+2} (k < 2),  J = I_0 + I_1,
//   result = (J_0 + J_2) + (J_1 + J_3).
//
// Where an element goes follows how it is widened to float64, so that every
// conversion fills a whole group:
//   float32, float64, float16: element e goes to lane e;
//   bfloat16 (read as the upper halves of float32 words, isa_avx2.h: the odd
//     elements from the words at the block, the even ones from the words one
//     element earlier): e = 8q + 2j + k goes to lane 8q + 4k + j.
//
// 32 lanes keep 8 AVX2 or 4 AVX-512 fused multiply-adds in flight, enough to
// hide their 4-cycle latency at the memory's pace; adding more would only make
// the fold of the many tensors of a few elements dearer.
//
// Padding a block with zeros changes no lane (x + 0 is x for the non-negative
// sums here), so a piece's last, partial block may be read through a mask or
// from a zero-filled copy, whichever the instruction set does best.
#pragma once

#include <cstdint>

namespace fastnorm {

constexpr int kLanes = 32;
constexpr int kGroups = 8;
constexpr int kGroupWidth = 4;

// The fold above, on lanes held as plain doubles.
inline double fold_lanes(const double (&lane)[kLanes]) {
  double h[4][kGroupWidth], i[2][kGroupWidth], j[kGroupWidth];
  for (int k = 0; k < 4; ++k)
    for (int p = 0; p < kGroupWidth; ++p) h[k][p] = lane[4 * k + p] + lane[4 * (k + 4) + p];
  for (int k = 0; k < 2; ++k)
    for (int p = 0; p < kGroupWidth; ++p) i[k][p] = h[k][p] + h[k + 2][p];
  for (int p = 0; p < kGroupWidth; ++p) j[p] = i[0][p] + i[1][p];
  return (j[0] + j[2]) + (j[1] + j[3]);
}

}  // namespace fastnorm
