// How the CPU engine computes: threads, and what happens to activations entering a matrix product.
#pragma once

namespace lode::cpu {

enum class Activations {
  // float32 throughout: each product is the exact float dot of the activations with the weights'
  // dequantized values (lode's default; what transformers computes on the same weights).
  f32,
  // Each activation row is first rounded to the 8-bit block format ggml's CPU path pairs with the
  // weight's type (Q8_0 for the legacy quants, Q8_K for K- and I-quants, fp16/bf16 for half
  // weights; F32 weights untouched), as llama.cpp's CPU backend does before its integer dot
  // products. Same products up to float summation order: for comparisons with llama.cpp.
  q8,
};

struct Compute {
  int threads = 0;  // OpenMP threads; 0: OpenMP's default
  Activations activations = Activations::f32;

  int resolved_threads() const;  // threads, or OpenMP's default when 0
};

}  // namespace lode::cpu
