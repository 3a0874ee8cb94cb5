#include "core/output_path.h"

#include "core/error.h"

namespace lode {

namespace fs = std::filesystem;

namespace {

// The file a chain of symbolic links at `path` ends in (which need not exist yet), or `path`.
fs::path link_target(const fs::path& path) {
  fs::path at = path;
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) return at;
    const fs::path to = fs::read_symlink(at, ec);
    if (ec) fail("{}: cannot read the link: {}", at.string(), ec.message());
    at = to.is_absolute() ? to : at.parent_path() / to;
  }
  fail("{}: too many levels of symbolic links", path.string());
}

}  // namespace

fs::path checked_output_path(const fs::path& path, std::span<const fs::path> inputs) {
  if (path == "-") fail("-: this command writes a file (it cannot go to standard output); give a file path");
  const fs::path target = link_target(path);
  std::error_code ec;
  const fs::file_status status = fs::status(target, ec);
  if (fs::is_directory(status)) fail("{} is a directory: give the output a file name", path.string());
  if (fs::exists(status) && !fs::is_regular_file(status))
    fail("{} is not a regular file (a device or a pipe): lode writes its output to a new file and renames it into "
         "place, which would replace it; give a file path", path.string());
  for (const fs::path& input : inputs)
    if (fs::exists(status) && fs::exists(input, ec) && fs::equivalent(target, input, ec))
      fail("{} is {}, which this command reads: writing it would destroy its own input; give another output path",
           path.string(), input.string());
  const fs::path parent = target.parent_path();
  if (!parent.empty() && !fs::is_directory(parent, ec))
    fail("{}: the directory {} does not exist", path.string(), parent.string());
  return target;
}

void put_in_place(const fs::path& partial, const fs::path& path) {
  std::error_code ec, ignored;
  fs::rename(partial, path, ec);
  if (!ec) return;
  fs::remove(partial, ignored);
  fail("{}: cannot move the finished {} into place: {}", path.string(), partial.string(), ec.message());
}

}  // namespace lode
