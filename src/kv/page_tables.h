// The bookkeeping of a paged K/V cache shared by several sequences (no cells here: cuda/kv_cache.h
// moves them). Each sequence's page table maps every one of its logical pages (position / page
// size) to a physical page, at all times, so writing needs nothing first unless the page is
// shared. Pages get shared two ways: holds (a prefix of a sequence kept for later, on the pages it
// already lies in, nothing copied) and adoption (a sequence taking a hold's pages as its own
// prefix: going back to its own checkpoint, or starting from another sequence's). A shared page is
// read-only: a sequence about to write into it first takes a free page of its own (copy on write
// of the rows before the write).
//
// With sequences x pages_per_sequence pages, tables alone never run short: a shared page means two
// table entries on one page, so some page is free or held only by holds. A cache that needs a free
// page gives up holds for it (cuda/kv_cache.h moves their cells to host memory first).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

namespace lode::kv {

class PageTables {
 public:
  // page_order: the physical page of each logical page within a sequence's initial pages (a
  // permutation of [0, pages_per_sequence)); sequence s starts on pages s P + page_order[p].
  PageTables(int64_t sequences, std::vector<int32_t> page_order, int64_t page_positions);

  int64_t sequences() const { return sequences_; }
  int64_t pages_per_sequence() const { return pages_per_sequence_; }
  int64_t page_positions() const { return page_positions_; }
  int64_t pages() const { return int64_t(table_refs_.size()); }
  std::span<const int32_t> table(int64_t sequence) const;
  int64_t free_pages() const { return int64_t(free_.size()); }
  bool shared(int32_t page) const { return table_refs_[size_t(page)] + hold_refs_[size_t(page)] > 1; }

  // The first logical page of the sequence that holds positions [first, end) and is shared, or -1.
  int64_t first_shared(int64_t sequence, int64_t first, int64_t end) const;
  // Gives the sequence's logical page a free page of its own in place of the shared one it maps
  // (free_pages() must be > 0): the cells of the rows that must survive move from `from` to `to`.
  struct Move {
    int32_t from = -1, to = -1;
  };
  Move own_page(int64_t sequence, int64_t logical);

  // A hold on the pages of a sequence's positions [0, positions): they stay as they are until
  // released. Returns its id (ids only grow: a smaller one is an older hold).
  int64_t hold(int64_t sequence, int64_t positions);
  std::span<const int32_t> held(int64_t id) const;  // its pages, by logical page
  void release(int64_t id);
  int64_t holds() const { return int64_t(holds_.size()); }
  // The hold to give up for a free page: the oldest one whose release frees a page (one no table
  // maps and no other hold holds), else the oldest one on a page no table maps (other holds share
  // it: one fewer), else the oldest one on `page` (its release unshares it), else -1.
  int64_t hold_to_give_up(int32_t page) const;
  // The sequence's first pages become the hold's (shared with it); the pages they mapped are let go.
  void adopt(int64_t sequence, int64_t id);

  // Makes positions [first, end) of the sequence writable: each shared page among them replaced by a
  // free page of its own, holds given up while no page is free (hold_to_give_up's). give_up(id)
  // keeps what the hold's pages hold elsewhere and releases it; copy(move, rows) copies the first
  // `rows` positions of move.from to move.to (the rows before `first` on its page: the sequence's
  // rows end at `first`). Returns whether the table changed.
  bool make_writable(int64_t sequence, int64_t first, int64_t end, const std::function<void(int64_t id)>& give_up,
                     const std::function<void(Move, int64_t rows)>& copy);

  // Pages no table maps and some hold does: what the holds keep beyond the sequences.
  int64_t held_only_pages() const;

 private:
  void check_sequence(int64_t sequence) const;
  void let_go(int32_t page);  // free it when nothing refers to it any more

  int64_t sequences_, pages_per_sequence_, page_positions_;
  std::vector<int32_t> tables_;      // [sequence][logical page]
  std::vector<int32_t> table_refs_;  // [page]: table entries on it
  std::vector<int32_t> hold_refs_;   // [page]: holds on it
  std::vector<int32_t> free_;        // pages nothing refers to
  std::map<int64_t, std::vector<int32_t>> holds_;  // by id, oldest first
  int64_t next_hold_ = 0;
};

}  // namespace lode::kv
