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

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace lode
