// The bookkeeping of a paged K/V cache shared by several sequences (no cells here: cuda/kv_cache.h
// moves them). One pool of physical pages serves all sequences; a sequence's page table maps each
// logical page it has written (position / page size) to a physical page, taken from the pool when
// the sequence first writes there and given back when it is cut short (trim). Pages also get
// shared: holds (a prefix of a sequence kept for later, on the pages it already lies in, nothing
// copied) and adoption (a sequence taking a hold's pages as its own prefix: going back to its own
// checkpoint, or starting from another sequence's). A shared page is read-only: a sequence about
// to write into it first takes a free page of its own (copy on write of the rows before the write).
//
// Room is promised by reservation: a sequence reserves the positions it may fill (its prompt and
// the most tokens it may generate), and the promises together, counting for each sequence the
// larger of its promise and the pages it maps, never exceed the pool. Holds are not promised
// anything: a write that finds no free page gives up holds (cuda/kv_cache.h moves their cells to
// host memory first), and a sequence that stays within its promise always finds one that way. A
// pool of sequences x pages_per_sequence pages promises every sequence its whole context.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <vector>

namespace lode::kv {

class PageTables {
 public:
  // `pages` physical pages (0: sequences x pages_per_sequence) for `sequences` sequences of
  // page_order.size() logical pages each. page_order (a permutation of [0, pages_per_sequence))
  // sets the order free pages are handed out in: a first sequence writing from position 0 gets
  // pages page_order[0], page_order[1], ..., then P + page_order[0], ... (tests scramble it to show
  // nothing depends on the order).
  PageTables(int64_t sequences, std::vector<int32_t> page_order, int64_t page_positions, int64_t pages = 0);

  static constexpr int32_t kUnmapped = -1;  // a table entry no page backs yet

  int64_t sequences() const { return sequences_; }
  int64_t pages_per_sequence() const { return pages_per_sequence_; }
  int64_t page_positions() const { return page_positions_; }
  int64_t pages() const { return int64_t(table_refs_.size()); }
  std::span<const int32_t> table(int64_t sequence) const;  // entries kUnmapped where not yet written
  int64_t free_pages() const { return int64_t(free_.size()); }
  bool shared(int32_t page) const { return table_refs_[size_t(page)] + hold_refs_[size_t(page)] > 1; }
  int64_t mapped(int64_t sequence) const { return mapped_[size_t(sequence)]; }  // its table's mapped entries

  // Promises the sequence room for `positions` positions (replacing its promise; 0 lets it go).
  // False, changing nothing, when the pool cannot promise that beside the other sequences.
  bool reserve(int64_t sequence, int64_t positions);
  int64_t reserved(int64_t sequence) const;  // pages promised
  // Pages promised or mapped: for each sequence the larger of the two, summed.
  int64_t committed() const;

  // The first logical page of the sequence that holds positions [first, end) and cannot be written
  // as it stands (shared, or not mapped yet), or -1.
  int64_t first_unwritable(int64_t sequence, int64_t first, int64_t end) const;
  // Gives the sequence's logical page a free page of its own (free_pages() must be > 0), in place of
  // the shared one it maps (the cells of the rows that must survive move from `from` to `to`) or
  // of none (`from` kUnmapped).
  struct Move {
    int32_t from = kUnmapped, to = kUnmapped;
  };
  Move own_page(int64_t sequence, int64_t logical);
  // Unmaps the sequence's logical pages past its first `positions` positions (they go back to the
  // pool unless something else holds them).
  void trim(int64_t sequence, int64_t positions);

  // A hold on the pages of a sequence's positions [0, positions) (all written): they stay as they
  // are until released. Returns its id (ids only grow: a smaller one is an older hold).
  int64_t hold(int64_t sequence, int64_t positions);
  std::span<const int32_t> held(int64_t id) const;  // its pages, by logical page
  void release(int64_t id);
  int64_t holds() const { return int64_t(holds_.size()); }
  // The hold to give up for a free page: the oldest one whose release frees a page (one no table
  // maps and no other hold holds), else the oldest one on a page no table maps (other holds share
  // it: one fewer), else the oldest one on `page` (its release unshares it), else -1.
  int64_t hold_to_give_up(int32_t page) const;
  // The sequence's pages become the hold's (shared with it), and only those: the pages it mapped
  // are let go. Fails, changing nothing, where that would take it past its promise while the
  // pool's pages are all promised or mapped.
  void adopt(int64_t sequence, int64_t id);

  // Makes positions [first, end) of the sequence writable: each page among them that is shared or
  // not mapped replaced by a free page of its own, holds given up while no page is free
  // (hold_to_give_up's). give_up(id) keeps what the hold's pages hold elsewhere and releases it;
  // copy(move, rows) copies the first `rows` positions of move.from to move.to (the rows before
  // `first` on a shared page: the sequence's rows end at `first`). Returns whether the table
  // changed. Fails, changing nothing more, when the sequence would map a page past its promise and
  // the pool's pages are all promised or mapped (so the promises to others always hold).
  bool make_writable(int64_t sequence, int64_t first, int64_t end, const std::function<void(int64_t id)>& give_up,
                     const std::function<void(Move, int64_t rows)>& copy);

  // Pages no table maps and some hold does: what the holds keep beyond the sequences.
  int64_t held_only_pages() const;

 private:
  void check_sequence(int64_t sequence) const;
  void let_go(int32_t page);  // free it when nothing refers to it any more
  int32_t& entry(int64_t sequence, int64_t logical) { return tables_[size_t(sequence * pages_per_sequence_ + logical)]; }

  int64_t sequences_, pages_per_sequence_, page_positions_;
  std::vector<int32_t> tables_;      // [sequence][logical page], kUnmapped where none
  std::vector<int32_t> table_refs_;  // [page]: table entries on it
  std::vector<int32_t> hold_refs_;   // [page]: holds on it
  std::vector<int32_t> free_;        // pages nothing refers to (handed out from the back)
  std::vector<int64_t> reserved_;    // [sequence]: pages promised
  std::vector<int64_t> mapped_;      // [sequence]: its table's mapped entries
  std::map<int64_t, std::vector<int32_t>> holds_;  // by id, oldest first
  int64_t next_hold_ = 0;
};

}  // namespace lode::kv
