// Errors: one exception type for everything a user can cause (bad files, bad flags, budgets that
// do not fit). Messages say what was wrong and, where possible, what to do about it.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace lode {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A VRAM budget that cannot hold what was asked (the memory plan's refusal, an allocation past the
// budget): a caller may offer another way, such as more GPUs.
class BudgetShortfall : public Error {
public:
  using Error::Error;
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
[[noreturn]] void fail_budget(fmt::format_string<Args...> format, Args&&... args) {
  throw BudgetShortfall(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace lode
