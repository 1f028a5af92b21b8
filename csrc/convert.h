// Branch-free conversions between IEEE half / bfloat16 bit patterns and float.
//
// Written with integer and float arithmetic only, so that the compiler
// vectorizes the loops that call them on every target (no F16C or AVX512-FP16
// needed) and the results round exactly like c10::Half and c10::BFloat16
// (round to nearest, ties to even), which keeps clipping bitwise equal to torch.
#pragma once

#include <cstdint>
#include <cstring>

namespace fastnorm {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// bfloat16 is the upper half of a float32.
inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }

// All-ones where cond holds: selects written as masks stay vectorizable.
inline uint32_t mask_if(bool cond) { return 0u - uint32_t(cond); }

inline uint32_t select(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return uint16_t(select(mask_if(f != f), 0x7FC0u, rounded));
}

// Half to float. Normal halves: move the exponent/mantissa into float position
// (offset 13 bits) and rebias the exponent with one multiply by 2^-112, which
// also turns the half's all-ones exponent into float inf/NaN. Subnormal halves:
// place the mantissa under a float with exponent 2^-1 (126) and subtract 0.5,
// which renormalizes exactly.
inline float half_to_float(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;  // drops the sign bit
  const float normalized = bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t magnitude =
      select(mask_if(two_w < (1u << 27)), float_to_bits(subnormal), float_to_bits(normalized));
  return bits_to_float(sign | magnitude);
}

// Float to half, round to nearest even. The first two multiplies push values
// beyond the half range to inf and let the float adder do the rounding: adding
// a power of two aligned to the half's unit in the last place rounds the
// mantissa as the hardware does.
inline uint16_t float_to_half(float f) {
  const uint32_t w = float_to_bits(f);
  const uint32_t sign = w & 0x80000000u;
  const uint32_t shl1_w = w + w;
  float base = (bits_to_float(shl1_w >> 1) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = bits_to_float((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = float_to_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return uint16_t((sign >> 16) | select(mask_if(shl1_w > 0xFF000000u), 0x7E00u, nonsign));
}

}  // namespace fastnorm
