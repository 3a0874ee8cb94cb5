// The paged K/V cache's bookkeeping (kv/page_tables.h), on cells simulated in host memory: every
// sequence reads back what it wrote, every kept prefix what it held when it was taken, whatever
// mix of writes, holds, adoptions, rewinds, releases and pages given up came between; pages are
// shared rather than copied, and none is lost.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/page_tables.h"

namespace lode::kv {
namespace {

constexpr int64_t kPage = 4;  // positions per page

// Cells in "device" pages, what each sequence should read, what each hold should keep: the way
// cuda/kv_cache.h drives PageTables, with ints for cells.
struct Simulated {
  PageTables tables;
  std::vector<std::vector<int>> device;     // [page][position in page]
  std::vector<std::vector<int>> sequences;  // what each sequence holds, position by position
  struct Kept {
    int64_t id = -1;                 // the hold while on pages, -1 once given up
    std::vector<int> cells;          // what it keeps
    std::optional<std::vector<int>> host;  // its cells once given up (moved to the "host")
  };
  std::map<int64_t, Kept> kept;  // by the number the test gave it
  int64_t given_up = 0, copied_rows = 0;

  Simulated(int64_t n, std::vector<int32_t> order, int64_t pool = 0)
      : tables(n, std::move(order), kPage, pool),
        device(size_t(tables.pages()), std::vector<int>(kPage, -1)),
        sequences(size_t(n)) {}

  int cell(int64_t sequence, int64_t position) const {
    const int32_t page = tables.table(sequence)[size_t(position / kPage)];
    return device[size_t(page)][size_t(position % kPage)];
  }
  void give_up(int64_t id) {
    for (auto& [name, k] : kept) {
      if (k.id != id) continue;
      std::vector<int> host;
      const std::span<const int32_t> pages = tables.held(id);
      for (size_t p = 0; p < k.cells.size(); ++p) host.push_back(device[size_t(pages[p / kPage])][p % kPage]);
      k.host = host, k.id = -1;
    }
    tables.release(id);
    ++given_up;
  }
  void make_writable(int64_t s, int64_t first, int64_t end) {
    tables.make_writable(
        s, first, end, [&](int64_t id) { give_up(id); },
        [&](PageTables::Move move, int64_t rows) {
          for (int64_t r = 0; r < rows; ++r) device[size_t(move.to)][size_t(r)] = device[size_t(move.from)][size_t(r)];
          copied_rows += rows;
        });
  }
  void write(int64_t s, std::span<const int> values) {
    const int64_t first = int64_t(sequences[size_t(s)].size()), end = first + int64_t(values.size());
    make_writable(s, first, end);
    for (int64_t p = first; p < end; ++p) {
      const int32_t page = tables.table(s)[size_t(p / kPage)];
      device[size_t(page)][size_t(p % kPage)] = values[size_t(p - first)];
      sequences[size_t(s)].push_back(values[size_t(p - first)]);
    }
  }
  void keep(int64_t name, int64_t s) {
    kept[name] = {tables.hold(s, int64_t(sequences[size_t(s)].size())), sequences[size_t(s)], std::nullopt};
  }
  void release(int64_t name) {
    if (kept[name].id >= 0) tables.release(kept[name].id);
    kept.erase(name);
  }
  // The sequence becomes the kept prefix: its pages adopted, or its cells written back from the host.
  void resume(int64_t s, int64_t name) {
    const Kept& k = kept.at(name);
    if (k.id >= 0) {
      tables.adopt(s, k.id);
    } else {
      tables.trim(s, int64_t(k.cells.size()));
      make_writable(s, 0, int64_t(k.cells.size()));
      for (size_t p = 0; p < k.host->size(); ++p)
        device[size_t(tables.table(s)[p / kPage])][p % kPage] = (*k.host)[p];
    }
    sequences[size_t(s)] = k.cells;
  }
  // Cut back to its first n positions; with `trim`, its pages past them given back.
  void cut(int64_t s, int64_t n, bool trim) {
    sequences[size_t(s)].resize(size_t(n));
    if (trim) tables.trim(s, n);
  }

  // Everything reads back, and the page counts add up.
  void check() const {
    for (int64_t s = 0; s < tables.sequences(); ++s)
      for (size_t p = 0; p < sequences[size_t(s)].size(); ++p)
        ASSERT_EQ(cell(s, int64_t(p)), sequences[size_t(s)][p]) << "sequence " << s << " position " << p;
    std::set<int32_t> referenced;
    for (int64_t s = 0; s < tables.sequences(); ++s)
      for (int32_t page : tables.table(s))
        if (page != PageTables::kUnmapped) referenced.insert(page);
    for (const auto& [name, k] : kept) {
      if (k.id < 0) {
        ASSERT_EQ(*k.host, k.cells) << "kept " << name << " (given up)";
        continue;
      }
      const std::span<const int32_t> pages = tables.held(k.id);
      for (size_t p = 0; p < k.cells.size(); ++p)
        ASSERT_EQ(device[size_t(pages[p / kPage])][p % kPage], k.cells[p]) << "kept " << name << " position " << p;
      referenced.insert(pages.begin(), pages.end());
    }
    ASSERT_EQ(tables.free_pages() + int64_t(referenced.size()), tables.pages());
    ASSERT_LE(tables.committed(), tables.pages());
  }
};

// Whether `write` fails saying the sequence wrote past what it reserved.
template <class Write>
bool test_fails_with_reserve_message(Write&& write) {
  try {
    write();
  } catch (const Error& e) {
    return std::string(e.what()).find("reserved") != std::string::npos;
  }
  return false;
}

std::vector<int> values(int first, int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[size_t(i)] = first + i;
  return v;
}

TEST(KvPages, APrefixIsSharedNotCopiedAndTheLastPartialPageIsCopiedOnWrite) {
  Simulated sim(2, {1, 0, 3, 2});
  sim.write(0, values(100, 6));  // a page and a half
  sim.keep(1, 0);
  sim.resume(1, 1);  // sequence 1 starts from sequence 0's six positions
  EXPECT_EQ(sim.tables.table(1)[0], sim.tables.table(0)[0]);
  EXPECT_EQ(sim.tables.table(1)[1], sim.tables.table(0)[1]);
  EXPECT_EQ(sim.copied_rows, 0);
  sim.check();
  // Both go on differently: each first takes its own copy of the half page (its two rows), and the
  // whole first page stays shared.
  sim.write(0, values(200, 3));
  sim.write(1, values(300, 3));
  EXPECT_EQ(sim.copied_rows, 4);
  EXPECT_EQ(sim.tables.table(1)[0], sim.tables.table(0)[0]);
  EXPECT_NE(sim.tables.table(1)[1], sim.tables.table(0)[1]);
  EXPECT_EQ(sim.given_up, 0);
  sim.check();
  // Back to the kept prefix and on again: the kept half page is unchanged.
  sim.resume(0, 1);
  sim.write(0, values(400, 5));
  sim.check();
}

TEST(KvPages, WhenNoPageIsFreeTheHoldOnThePageWrittenIsGivenUp) {
  Simulated sim(1, {0, 1, 2});
  sim.write(0, values(0, 9));
  sim.keep(1, 0);  // all three pages held, and the sequence's: no page free
  EXPECT_EQ(sim.tables.free_pages(), 0);
  // A new text from position 0: the hold on the page it writes into is given up (no other page is
  // free), its cells kept on the host, and the sequence writes in place.
  sim.sequences[0].clear();
  sim.write(0, values(50, 2));
  EXPECT_EQ(sim.given_up, 1);
  EXPECT_EQ(sim.copied_rows, 0);
  sim.check();
  // The given-up prefix still resumes, from the host.
  sim.resume(0, 1);
  sim.write(0, values(90, 1));
  sim.check();
}

// Nested prefixes of one text, on pages no sequence maps any more: a page is freed by giving up the
// longest alone (the only one holding its last page), not the older ones, whose pages it shares.
TEST(KvPages, TheHoldGivenUpIsOneWhoseReleaseFreesAPage) {
  Simulated sim(2, {0, 1, 2});
  sim.write(1, values(500, 12));
  sim.keep(9, 1);
  for (int64_t name = 1; name <= 3; ++name) {  // prefixes of one, two and three pages
    sim.write(0, values(int(10 * name), 4));
    sim.keep(name, 0);
  }
  sim.resume(0, 9);  // sequence 0 leaves its pages to the three prefixes
  EXPECT_EQ(sim.tables.free_pages(), 0);
  sim.sequences[1].resize(10);
  sim.write(1, values(900, 2));  // into a shared page: needs a free one
  EXPECT_EQ(sim.given_up, 1);
  EXPECT_EQ(sim.kept[3].id, -1);  // the longest, the only one on its last page
  sim.check();
}

// Random mixes of writes, holds, releases, resumes and cuts, in pools of every sequence's whole
// context and in smaller ones, where a sequence writes only what it could reserve first.
TEST(KvPages, RandomMixesReadBackWhatWasWritten) {
  int64_t refused_in_small_pools = 0;
  for (int seed = 0; seed < 60; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng{uint32_t(seed)};
    const int64_t n = 1 + seed % 3, per_sequence = 5;
    const int64_t pool = seed % 2 ? 0 : n * per_sequence - 1 - seed % 3;  // 0: the whole context each
    std::vector<int32_t> order(per_sequence);
    for (int32_t p = 0; p < int32_t(per_sequence); ++p) order[size_t(p)] = p;
    std::shuffle(order.begin(), order.end(), rng);
    Simulated sim(n, order, pool);
    int next_value = 0;
    int64_t next_name = 0, refused = 0;
    const auto pick = [&](int64_t below) { return int64_t(rng() % uint64_t(below)); };
    for (int op = 0; op < 300; ++op) {
      const int64_t s = pick(n), held = int64_t(sim.sequences[size_t(s)].size());
      const int64_t room = per_sequence * kPage - held;
      switch (pick(7)) {
        case 0:
        case 1:
          if (room > 0) {
            const int count = int(1 + pick(std::min<int64_t>(room, 7)));
            if (!sim.tables.reserve(s, held + count)) {
              ++refused;
              break;
            }
            sim.write(s, values(next_value += 10, count));
          }
          break;
        case 2:
          if (sim.kept.size() < 6) sim.keep(next_name++, s);
          break;
        case 3:
          if (!sim.kept.empty()) sim.release(std::next(sim.kept.begin(), pick(int64_t(sim.kept.size())))->first);
          break;
        case 4:
          if (!sim.kept.empty()) {
            const int64_t name = std::next(sim.kept.begin(), pick(int64_t(sim.kept.size())))->first;
            if (sim.tables.reserve(s, int64_t(sim.kept[name].cells.size()))) sim.resume(s, name);
          }
          break;
        case 5:
          sim.cut(s, pick(held + 1), pick(2) == 0);
          break;
        case 6:
          sim.cut(s, 0, true), sim.tables.reserve(s, 0);  // a sequence done with
          break;
      }
      sim.check();
      if (::testing::Test::HasFatalFailure()) return;
    }
    EXPECT_GT(sim.given_up + sim.copied_rows, 0);  // the mixes did reach the sharing paths
    if (pool > 0) refused_in_small_pools += refused;
  }
  EXPECT_GT(refused_in_small_pools, 0);  // and the small pools their limit
}

// A pool smaller than every sequence's whole context promises room while it has it; a sequence
// cut short gives its pages back; one that writes past its promise into a full pool is refused,
// saying why.
TEST(KvPages, ReservationsPromiseNoMoreThanThePool) {
  Simulated sim(2, {0, 1, 2}, 4);  // room for 16 positions, 24 wanted
  EXPECT_TRUE(sim.tables.reserve(0, 10));  // three pages
  EXPECT_FALSE(sim.tables.reserve(1, 8));  // two more do not fit
  EXPECT_TRUE(sim.tables.reserve(1, 4));
  sim.write(0, values(0, 10));
  sim.write(1, values(100, 4));
  EXPECT_EQ(sim.tables.free_pages(), 0);
  EXPECT_EQ(sim.tables.committed(), 4);
  sim.cut(0, 3, true);  // back to one page
  EXPECT_TRUE(sim.tables.reserve(0, 3));
  EXPECT_EQ(sim.tables.free_pages(), 2);
  EXPECT_TRUE(sim.tables.reserve(1, 12));
  sim.write(1, values(200, 8));
  sim.check();
  EXPECT_TRUE(test_fails_with_reserve_message([&] { sim.write(0, values(300, 2)); }));

  // Free pages promised to a sequence that has not written yet are not another's to take.
  Simulated promised(2, {0, 1, 2}, 4);
  EXPECT_TRUE(promised.tables.reserve(1, 12));
  EXPECT_TRUE(promised.tables.reserve(0, 4));
  EXPECT_TRUE(test_fails_with_reserve_message([&] { promised.write(0, values(0, 6)); }));
  EXPECT_EQ(promised.tables.free_pages(), 3);
  promised.sequences[0].clear();
  promised.tables.trim(0, 0);
  promised.write(1, values(100, 12));
  promised.check();

  // Nor may a sequence without a promise take a kept prefix's pages over the pool (shared pages
  // count for each sequence that maps them).
  Simulated adopting(2, {0, 1, 2, 3}, 4);
  EXPECT_TRUE(adopting.tables.reserve(0, 16));  // the whole pool, half of it written
  adopting.write(0, values(0, 8));
  adopting.keep(1, 0);
  EXPECT_THROW(adopting.resume(1, 1), Error);
  EXPECT_EQ(adopting.tables.mapped(1), 0);  // unchanged
  adopting.resume(0, 1);  // its own prefix, within its promise
  adopting.check();
}

TEST(KvPages, BadUseFailsSayingWhy) {
  EXPECT_THROW(PageTables(1, {0, 0}, kPage), Error);
  EXPECT_THROW(PageTables(0, {0}, kPage), Error);
  EXPECT_THROW(PageTables(1, {0, 1}, kPage, 3), Error);  // a pool larger than the whole context
  PageTables tables(1, {0, 1}, kPage);
  EXPECT_THROW(tables.hold(0, kPage), Error);  // not written yet
  tables.own_page(0, 0);
  EXPECT_THROW(tables.own_page(0, 0), Error);  // its own already
  EXPECT_THROW(tables.reserve(0, 3 * kPage), Error);
  EXPECT_THROW(tables.hold(0, 3 * kPage), Error);
  EXPECT_THROW(tables.release(7), Error);
  EXPECT_THROW(tables.table(1), Error);
}

}  // namespace
}  // namespace lode::kv
