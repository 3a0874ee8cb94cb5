// The weight types the CUDA backend reads, one row each, and which of its kernels read them. Every
// list of types on the CUDA side (each kernel family's instantiations and launch switch, has_*())
// comes from this table, so a new type is its row here plus its units in the files a column names;
// a column marked true for a type without its unit does not compile. Host and device code (C++17,
// no CUDA types) include it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>

#include "core/quant/types.h"

namespace lode::cuda {

// The kernel families that read weights as stored.
enum class WeightKernel {
  expand,  // Expand<T>::unit (expand_units.cuh): 32 values to floats, for the prompt's products
  dot,     // Unit<T>::dot (matvec_kernels.cu): a 32-value unit dotted with float x (decode)
  q8,      // Slice<T> (matvec_q8_kernels.cu): dotted in integers with x rounded to 8 bits (decode)
};

struct CudaWeightType {
  GgmlType type;
  bool expand, dot, q8;
  bool plain;  // values stored as floats: rows of any length (the others are whole 32-value units)
  bool grids;  // its units read the i-quant grid codebooks, uploaded once per process (matvec.cpp)

  constexpr bool read_by(WeightKernel k) const {
    return k == WeightKernel::expand ? expand : k == WeightKernel::dot ? dot : q8;
  }
};

inline constexpr CudaWeightType kCudaWeightTypes[] = {
    //                expand  dot    q8     plain  grids
    {GgmlType::F32,     true,  true,  false, true,  false},
    {GgmlType::F16,     true,  true,  false, true,  false},
    {GgmlType::BF16,    true,  true,  false, true,  false},
    {GgmlType::Q8_0,    true,  true,  true,  false, false},
    {GgmlType::Q4_0,    true,  true,  false, false, false},
    {GgmlType::Q5_0,    true,  true,  true,  false, false},
    {GgmlType::Q4_K,    true,  true,  true,  false, false},
    {GgmlType::Q5_K,    true,  true,  true,  false, false},
    {GgmlType::Q6_K,    true,  true,  true,  false, false},
    {GgmlType::IQ4_NL,  true,  true,  false, false, false},
    {GgmlType::IQ4_XS,  true,  true,  false, false, false},
    {GgmlType::MXFP4,   true,  true,  false, false, false},
    {GgmlType::IQ2_XXS, false, true,  false, false, true},
    {GgmlType::IQ2_XS,  false, true,  false, false, true},
    {GgmlType::IQ2_S,   false, true,  false, false, true},
    {GgmlType::IQ3_XXS, false, true,  false, false, true},
    {GgmlType::IQ3_S,   false, true,  false, false, true},
    {GgmlType::IQ1_S,   false, true,  false, false, true},
    {GgmlType::IQ1_M,   false, true,  false, false, true},
};

// The row of a type, or null when the CUDA backend reads no weights of it.
constexpr const CudaWeightType* cuda_weight_type(GgmlType type) {
  for (const CudaWeightType& row : kCudaWeightTypes)
    if (row.type == type) return &row;
  return nullptr;
}

constexpr bool read_by(GgmlType type, WeightKernel k) {
  const CudaWeightType* row = cuda_weight_type(type);
  return row && row->read_by(k);
}

// Whether the GPU expands a matrix of this type and width to floats (cuda::dequantize, the prompt's
// products): whole 32-value units of a type with an expansion kernel. Also whether a verify step can
// look the embedding table's rows up by token on the device (the memory plan counts the table then).
constexpr bool expandable(GgmlType type, int64_t cols) { return cols % 32 == 0 && read_by(type, WeightKernel::expand); }

namespace weight_types_detail {

template <WeightKernel K, size_t I, class F>
bool call_if(GgmlType type, F& f) {
  constexpr CudaWeightType row = kCudaWeightTypes[I];
  if constexpr (row.read_by(K)) {
    if (type == row.type) {
      f(std::integral_constant<GgmlType, row.type>{});
      return true;
    }
  }
  return false;
}

template <WeightKernel K, class F, size_t... I>
bool dispatch(GgmlType type, F& f, std::index_sequence<I...>) {
  return (call_if<K, I>(type, f) || ...);
}

}  // namespace weight_types_detail

// f(std::integral_constant<GgmlType, type>{}) when kernel family K reads `type` (then true), else
// false: the one switch from a type known at run time to the kernel instantiated for it.
template <WeightKernel K, class F>
bool for_weight_type(GgmlType type, F&& f) {
  return weight_types_detail::dispatch<K>(type, f, std::make_index_sequence<std::size(kCudaWeightTypes)>{});
}

}  // namespace lode::cuda
