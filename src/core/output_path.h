// A command's output path, checked before any work is done so that writing it cannot destroy
// something. Outputs are written to PATH.partial and renamed into place (a failure never leaves a
// half-written file under the final name), which would replace whatever PATH is: so a directory,
// a device or pipe (`-o /dev/null` became an ordinary file), and any of the command's own inputs (a
// model overwritten while it is read) are refused, naming them; a symbolic link is followed, its
// target written and the link kept; a directory that does not exist is named.
#pragma once
#include <filesystem>
#include <initializer_list>
#include <span>

namespace lode {

// The path to write: `path`, or the file a symbolic link at `path` points to.
std::filesystem::path checked_output_path(const std::filesystem::path& path,
                                          std::span<const std::filesystem::path> inputs);
inline std::filesystem::path checked_output_path(const std::filesystem::path& path,
                                                 std::initializer_list<std::filesystem::path> inputs = {}) {
  return checked_output_path(path, std::span<const std::filesystem::path>(inputs.begin(), inputs.size()));
}

// Moves a finished PATH.partial into place, as a lode::Error naming both when the file system refuses.
void put_in_place(const std::filesystem::path& partial, const std::filesystem::path& path);

}  // namespace lode
