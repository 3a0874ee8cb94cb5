// How activations enter a matrix product with quantized weights, shared by every engine (the CPU
// engine's products, the GPU's decode products, the CPU's computation of experts the GPU misses).
#pragma once

namespace lode::model {

enum class Activations {
  // float32 throughout: each product is the exact float dot of the activations with the weights'
  // dequantized values (the CPU engine's default; what transformers computes on the same weights).
  f32,
  // Each activation row is first rounded to the 8-bit block format ggml's CPU path pairs with the
  // weight's type (Q8_0 for the legacy quants, Q8_K for K- and I-quants, fp16/bf16 for half
  // weights; F32 weights untouched), as llama.cpp's CPU backend does before its integer dot
  // products. Same products up to float summation order: for comparisons with llama.cpp (and the
  // GPU's default).
  q8,
};

}  // namespace lode::model
