// The experts' matrix products of a prompt chunk on tensor cores (tf32 operands, float32 sums),
// read straight from the experts' stored bytes: each block expands its tile of weights into shared
// memory as it goes, so no expert is ever written out in float32. The rows routed to one expert
// are cut into tiles of at most kExpertTileRows; a tile's values depend only on its rows and its
// matrix, never on the other tiles of the launch, so how the experts are grouped into launches
// (by the staging of absent ones, which follows the VRAM budget) cannot change the rounding.
// No CUDA types here, so host C++ compiled by g++ can call it.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"

namespace lode::cuda {

constexpr int64_t kExpertTileRows = 128;

// Rows [first_row, first_row + rows) of x times the launch's matrix number `matrix` (rows <=
// kExpertTileRows).
struct ExpertTile {
  int32_t matrix = 0, first_row = 0, rows = 0;
  int32_t padding = 0;  // 16 bytes a tile: one load
};

// The fewest and the most rows of a launch's tiles, as the caller counted them: tiles of a few rows
// (a short prompt's experts) go to a form of the kernel that holds fewer x rows in shared memory and
// so keeps more blocks in flight. Where `most` sends every tile there, a larger one makes it trap.
struct TileRows {
  int32_t fewest = 1, most = int32_t(kExpertTileRows);
};

// Which forms of the k-quants' kernel take a launch's tiles: by their rows (expert_products'
// choice), or all through one (the tests' check that both give a row the same bits; the small
// form takes tiles of at most 32 rows).
enum class ExpertTileForms { by_rows, small, large };

// Whether expert_products multiplies matrices of this type with `cols` columns (types with an
// expansion unit, cols a multiple of 64).
bool has_expert_products(GgmlType type, int64_t cols);

// The shared memory a block needs for this type (dynamic and static): the device must offer it.
size_t expert_products_shared_bytes(GgmlType type);

// Whether the kernel reads matrices of this type that start `offset` bytes past a 16-byte boundary,
// rows row_bytes apart: types whose stages are whole 16-byte pieces (Q4_K, Q5_K, the float types)
// need both to be multiples of 16, Q8_0 multiples of 4; the others take any.
bool expert_products_aligned(GgmlType type, size_t offset, size_t row_bytes);

// For each of the n_tiles tiles (device memory; `rows`: their row counts' range): y rows
// [first_row, first_row + rows), columns [0, n) = the same x rows times W^T, where W stacks `parts`
// matrices of part_rows rows each (n = parts * part_rows): the p-th is at table[matrix * parts +
// p], its rows row_bytes apart, `cols` values each, its start and row_bytes as
// expert_products_aligned asks (the kernel traps otherwise). x starts on a 16-byte boundary, its
// rows ldx floats apart (a multiple of 4), already rounded to tf32 (kernels::gather_rows does;
// given other floats the tensor cores drop their low bits); y rows are ldy floats apart. Returns
// null when queued, else what was wrong.
const char* expert_products(GgmlType type, const ExpertTile* tiles, int64_t n_tiles, TileRows rows,
                            const void* const* table, int64_t parts, int64_t part_rows, int64_t cols,
                            size_t row_bytes, const float* x, int64_t ldx, float* y, int64_t ldy, void* stream,
                            ExpertTileForms forms = ExpertTileForms::by_rows);

}  // namespace lode::cuda
