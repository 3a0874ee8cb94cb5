// The CUDA backend's table of weight types (cuda/weight_types.h), which every CUDA kernel list is
// generated from: plain C++, so checked on any machine. Each row must be a type the host reads, a
// plain row must be floats, and the dispatcher must reach exactly the rows a kernel family reads.
#include <gtest/gtest.h>

#include <set>

#include "cuda/weight_types.h"

namespace {

using namespace lode;
using cuda::WeightKernel;

TEST(CudaWeightTypes, EveryRowIsATypeTheHostReadsOnce) {
  std::set<GgmlType> seen;
  for (const cuda::CudaWeightType& row : cuda::kCudaWeightTypes) {
    const TypeTraits& t = traits(row.type);
    EXPECT_NE(t.dequantize, nullptr) << t.name << ": the host must read what the GPU reads (the CPU is its reference)";
    EXPECT_TRUE(seen.insert(row.type).second) << t.name << " has two rows";
    EXPECT_EQ(row.plain, t.block_size == 1) << t.name;
    EXPECT_TRUE(row.dot) << t.name << ": decode reads every weight the backend accepts";
    EXPECT_TRUE(!row.q8 || row.expand) << t.name;
    if (!row.plain) EXPECT_EQ(t.block_size % 32, 0) << t.name << ": the units are 32 values";
  }
}

TEST(CudaWeightTypes, TheDispatcherReachesExactlyTheRowsOfAFamily) {
  for (const WeightKernel k : {WeightKernel::expand, WeightKernel::dot, WeightKernel::q8}) {
    size_t reached = 0, marked = 0;
    for (const cuda::CudaWeightType& row : cuda::kCudaWeightTypes) {
      GgmlType dispatched = GgmlType::I8;
      bool any = false;
      const auto record = [&](auto t) { dispatched = t.value; };
      switch (k) {
        case WeightKernel::expand: any = cuda::for_weight_type<WeightKernel::expand>(row.type, record); break;
        case WeightKernel::dot: any = cuda::for_weight_type<WeightKernel::dot>(row.type, record); break;
        case WeightKernel::q8: any = cuda::for_weight_type<WeightKernel::q8>(row.type, record); break;
      }
      EXPECT_EQ(any, row.read_by(k)) << traits(row.type).name;
      EXPECT_EQ(any, cuda::read_by(row.type, k)) << traits(row.type).name;
      if (any) EXPECT_EQ(dispatched, row.type) << traits(row.type).name;
      reached += any, marked += row.read_by(k);
    }
    EXPECT_EQ(reached, marked);
  }
  EXPECT_FALSE(cuda::for_weight_type<WeightKernel::dot>(GgmlType::TQ2_0, [](auto) {}));
  EXPECT_EQ(cuda::cuda_weight_type(GgmlType::Q4_1), nullptr);
}

}  // namespace
