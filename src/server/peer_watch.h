// Whether a client is still connected, for a request that writes nothing until its reply is whole
// (cpp-httplib 0.11 gives such a handler no way to see the connection): the kernel's own table of
// TCP connections, read from /proc/net/tcp and /proc/net/tcp6 (Linux).
#pragma once
#include <string_view>

namespace lode::server {

// Whether the kernel holds an established TCP connection between local_port (the server's) and
// remote_port (the client's). A client that closed its end leaves ours in CLOSE_WAIT, one that
// reset it leaves none: both are "no". True when the table cannot be read (never a false hang-up).
bool connection_established(int local_port, int remote_port);

// The same test on the text of one /proc/net/tcp or tcp6 table.
bool table_has_established(std::string_view table, int local_port, int remote_port);

}  // namespace lode::server
