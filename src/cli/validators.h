// Checks of command-line values whose messages say what was wanted. CLI11's own range checks print
// their bounds as doubles ("Value 0 not in range 0.000000 to 1797693134862315708...") and let NaN
// through; CLI11 reads "-1" into an unsigned option by wrapping it around.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>

namespace lode::cli {

// An integer of at least `lo`: "must be an integer of at least 1, got 0".
CLI::Validator integer_at_least(int64_t lo);

// A number in [lo, hi], not NaN.
CLI::Validator number_in(double lo, double hi);

// A number of at least `lo`, not NaN or infinite.
CLI::Validator number_at_least(double lo);

// A finite number (NaN and the infinities refused).
CLI::Validator finite_number();

// An unsigned 64-bit integer, written without a sign (seeds).
CLI::Validator unsigned_64();

// Text that is not empty ('' given for a choice read as "not given": --kv '' took the default).
CLI::Validator non_empty();

// --threads: 0 (every core) or up to 4 per hardware thread; more only keeps a spinning pool's
// threads waiting on each other (10,000 hung a run, 100 million crashed it).
CLI::Validator thread_count();

// A file to read, or "-" for standard input.
CLI::Validator file_or_stdin();

}  // namespace lode::cli
