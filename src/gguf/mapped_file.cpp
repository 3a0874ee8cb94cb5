#include "gguf/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace lode::gguf {
namespace {

// Closes a descriptor on every path out of the constructor; the mapping outlives it.
struct Descriptor {
  int fd;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path) {
  Descriptor file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat info {};
  if (::fstat(file.fd, &info) != 0)
    fail("{}: cannot stat: {}", path.string(), std::strerror(errno));
  if (!S_ISREG(info.st_mode)) fail("{}: not a regular file", path.string());
  if (info.st_size == 0) fail("{}: the file is empty (0 bytes), not a GGUF file", path.string());
  size_ = size_t(info.st_size);
  void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd, 0);
  if (mapping == MAP_FAILED)
    fail("{}: cannot map {} bytes into memory: {}", path.string(), size_, std::strerror(errno));
  data_ = static_cast<const uint8_t*>(mapping);
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace lode::gguf
