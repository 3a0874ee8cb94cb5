#include "server/peer_watch.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace lode::server {

namespace {

constexpr std::string_view kEstablished = "01";  // the kernel's TCP_ESTABLISHED, in hex

// The port of "ADDRESS:PORT" (both hex), or -1.
int port_of(std::string_view endpoint) {
  const size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos) return -1;
  return int(std::strtol(std::string(endpoint.substr(colon + 1)).c_str(), nullptr, 16));
}

}  // namespace

bool table_has_established(std::string_view table, int local_port, int remote_port) {
  std::istringstream lines{std::string(table)};
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state;
    if (!(fields >> slot >> local >> remote >> state)) continue;
    if (port_of(local) == local_port && port_of(remote) == remote_port && state == kEstablished) return true;
  }
  return false;
}

bool connection_established(int local_port, int remote_port) {
  bool readable = false;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    if (!in) continue;
    readable = true;
    const std::string table{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    if (table_has_established(table, local_port, remote_port)) return true;
  }
  return !readable;
}

}  // namespace lode::server
