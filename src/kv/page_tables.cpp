#include "kv/page_tables.h"

#include <algorithm>

#include "core/error.h"

namespace lode::kv {

PageTables::PageTables(int64_t sequences, std::vector<int32_t> page_order, int64_t page_positions, int64_t pages)
    : sequences_(sequences), pages_per_sequence_(int64_t(page_order.size())), page_positions_(page_positions) {
  if (sequences < 1) fail("K/V pages: room for {} sequences", sequences);
  if (page_positions < 1) fail("K/V pages: pages of {} positions", page_positions);
  std::vector<int32_t> sorted = page_order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t p = 0; p < int64_t(sorted.size()); ++p)
    if (sorted[size_t(p)] != p) fail("K/V pages: the page order must be a permutation of the {} pages", sorted.size());
  const int64_t whole = sequences * pages_per_sequence_;
  if (pages == 0) pages = whole;
  if (pages < 0 || pages > whole)
    fail("K/V pages: a pool of {} pages for {} sequences of {} pages (at most {})", pages, sequences,
         pages_per_sequence_, whole);
  tables_.assign(size_t(whole), kUnmapped);
  table_refs_.assign(size_t(pages), 0);
  hold_refs_.assign(size_t(pages), 0);
  reserved_.assign(size_t(sequences), 0);
  mapped_.assign(size_t(sequences), 0);
  // Handed out from the back: page_order's pages first, run after run of pages_per_sequence.
  for (int64_t run = 0; run < sequences; ++run)
    for (int32_t p : page_order)
      if (run * pages_per_sequence_ + p < pages) free_.push_back(int32_t(run * pages_per_sequence_ + p));
  std::reverse(free_.begin(), free_.end());
}

void PageTables::check_sequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequences_)
    fail("K/V pages: sequence {} of a cache of {} sequences", sequence, sequences_);
}

std::span<const int32_t> PageTables::table(int64_t sequence) const {
  check_sequence(sequence);
  return std::span(tables_).subspan(size_t(sequence * pages_per_sequence_), size_t(pages_per_sequence_));
}

int64_t PageTables::reserved(int64_t sequence) const {
  check_sequence(sequence);
  return reserved_[size_t(sequence)];
}

int64_t PageTables::committed() const {
  int64_t total = 0;
  for (int64_t s = 0; s < sequences_; ++s) total += std::max(reserved_[size_t(s)], mapped(s));
  return total;
}

bool PageTables::reserve(int64_t sequence, int64_t positions) {
  check_sequence(sequence);
  if (positions < 0 || positions > pages_per_sequence_ * page_positions_)
    fail("K/V pages: room for {} positions of a sequence of {}", positions, pages_per_sequence_ * page_positions_);
  const int64_t want = (positions + page_positions_ - 1) / page_positions_, own = mapped(sequence);
  const int64_t others = committed() - std::max(reserved_[size_t(sequence)], own);
  if (others + std::max(want, own) > pages()) return false;
  reserved_[size_t(sequence)] = want;
  return true;
}

int64_t PageTables::first_unwritable(int64_t sequence, int64_t first, int64_t end) const {
  const std::span<const int32_t> own = table(sequence);
  if (first < 0 || end > pages_per_sequence_ * page_positions_)
    fail("K/V pages: positions {}..{} of a sequence of {}", first, end, pages_per_sequence_ * page_positions_);
  if (end <= first) return -1;
  for (int64_t p = first / page_positions_; p <= (end - 1) / page_positions_; ++p)
    if (own[size_t(p)] == kUnmapped || shared(own[size_t(p)])) return p;
  return -1;
}

void PageTables::let_go(int32_t page) {
  if (table_refs_[size_t(page)] == 0 && hold_refs_[size_t(page)] == 0) free_.push_back(page);
}

PageTables::Move PageTables::own_page(int64_t sequence, int64_t logical) {
  check_sequence(sequence);
  if (logical < 0 || logical >= pages_per_sequence_) fail("K/V pages: logical page {} of {}", logical, pages_per_sequence_);
  int32_t& at = entry(sequence, logical);
  if (at != kUnmapped && !shared(at)) fail("K/V pages: sequence {}'s page {} is already its own", sequence, logical);
  if (free_.empty()) fail("K/V pages: no free page (give up a hold first)");
  const Move move{at, free_.back()};
  free_.pop_back();
  if (at != kUnmapped) --table_refs_[size_t(at)];  // (still referred to: it was shared)
  else ++mapped_[size_t(sequence)];
  ++table_refs_[size_t(move.to)];
  at = move.to;
  return move;
}

void PageTables::trim(int64_t sequence, int64_t positions) {
  check_sequence(sequence);
  for (int64_t p = (std::max<int64_t>(positions, 0) + page_positions_ - 1) / page_positions_; p < pages_per_sequence_; ++p) {
    int32_t& at = entry(sequence, p);
    if (at == kUnmapped) continue;
    --table_refs_[size_t(at)];
    let_go(at);
    at = kUnmapped;
    --mapped_[size_t(sequence)];
  }
}

int64_t PageTables::hold(int64_t sequence, int64_t positions) {
  const std::span<const int32_t> own = table(sequence);
  if (positions < 0 || positions > pages_per_sequence_ * page_positions_)
    fail("K/V pages: a hold on {} positions of a sequence of {}", positions, pages_per_sequence_ * page_positions_);
  const int64_t n = (positions + page_positions_ - 1) / page_positions_;
  std::vector<int32_t> pages(own.begin(), own.begin() + n);
  if (std::count(pages.begin(), pages.end(), kUnmapped) > 0)
    fail("K/V pages: a hold on {} positions of sequence {}, which has not written them all", positions, sequence);
  for (int32_t page : pages) ++hold_refs_[size_t(page)];
  holds_.emplace(next_hold_, std::move(pages));
  return next_hold_++;
}

std::span<const int32_t> PageTables::held(int64_t id) const {
  const auto it = holds_.find(id);
  if (it == holds_.end()) fail("K/V pages: no hold {}", id);
  return it->second;
}

void PageTables::release(int64_t id) {
  const auto it = holds_.find(id);
  if (it == holds_.end()) fail("K/V pages: no hold {}", id);
  for (int32_t page : it->second) {
    --hold_refs_[size_t(page)];
    let_go(page);
  }
  holds_.erase(it);
}

int64_t PageTables::hold_to_give_up(int32_t page) const {
  // Each pass takes the oldest hold that does what it asks, if any.
  const auto oldest = [&](auto&& does) {
    for (const auto& [id, pages] : holds_)
      for (int32_t p : pages)
        if (does(p)) return id;
    return int64_t(-1);
  };
  const auto frees = [&](int32_t p) { return table_refs_[size_t(p)] == 0 && hold_refs_[size_t(p)] == 1; };
  const auto untabled = [&](int32_t p) { return table_refs_[size_t(p)] == 0; };
  for (const int64_t id : {oldest(frees), oldest(untabled), oldest([&](int32_t p) { return p == page; })})
    if (id >= 0) return id;
  return -1;
}

void PageTables::adopt(int64_t sequence, int64_t id) {
  check_sequence(sequence);
  const std::span<const int32_t> pages = held(id);
  // Afterwards it maps exactly the hold's pages: within its promise, or within what nobody else is
  // promised.
  const int64_t n = int64_t(pages.size()), was = std::max(reserved_[size_t(sequence)], mapped(sequence));
  if (n > reserved_[size_t(sequence)] && committed() - was + n > this->pages())
    fail("K/V pages: sequence {} would map the {} pages of a kept prefix, past the {} it reserved, and the pool's "
         "{} pages are promised or in use; reserve room for the positions first", sequence, n,
         reserved_[size_t(sequence)], this->pages());
  trim(sequence, n * page_positions_);
  for (size_t p = 0; p < pages.size(); ++p) {
    int32_t& at = entry(sequence, int64_t(p));
    if (at == pages[p]) continue;
    ++table_refs_[size_t(pages[p])];
    if (at != kUnmapped) {
      --table_refs_[size_t(at)];
      let_go(at);
    } else {
      ++mapped_[size_t(sequence)];
    }
    at = pages[p];
  }
}

bool PageTables::make_writable(int64_t sequence, int64_t first, int64_t end,
                               const std::function<void(int64_t id)>& give_up,
                               const std::function<void(Move, int64_t rows)>& copy) {
  bool changed = false;
  // Each round unshares a page or ends a hold, so this ends.
  for (int64_t logical; (logical = first_unwritable(sequence, first, end)) >= 0;) {
    const bool new_page = table(sequence)[size_t(logical)] == kUnmapped;
    if (new_page && mapped(sequence) >= reserved_[size_t(sequence)] && committed() >= pages())
      fail("K/V pages: sequence {} would take a page past the {} it reserved, and all {} pages of {} positions are "
           "promised or in use; reserve room for the positions first", sequence, reserved_[size_t(sequence)], pages(),
           page_positions_);
    if (free_.empty()) {
      const int64_t id = hold_to_give_up(table(sequence)[size_t(logical)]);
      if (id < 0) fail("K/V pages: no free page and no hold to give up (a bookkeeping error)");
      give_up(id);
      if (holds_.count(id)) fail("K/V pages: hold {} was given up but not released", id);
      continue;
    }
    const Move move = own_page(sequence, logical);
    const int64_t rows = std::clamp<int64_t>(first - logical * page_positions_, 0, page_positions_);
    if (rows > 0 && move.from != kUnmapped) copy(move, rows);
    changed = true;
  }
  return changed;
}

int64_t PageTables::held_only_pages() const {
  int64_t n = 0;
  for (size_t p = 0; p < table_refs_.size(); ++p) n += table_refs_[p] == 0 && hold_refs_[p] > 0;
  return n;
}

}  // namespace lode::kv
