// A hostile local process in a thread: floods a TcpStore's port with what Note [TcpStore
// admission] defends against (connect/close cycles, headers announcing huge keys and values,
// garbage, wrong secrets, connections that say nothing), and /proc readings of what that
// costs the server's process. Shared by the store and communicator tests.
#ifndef ZINF_TESTS_COMM_STORE_FLOOD_H_
#define ZINF_TESTS_COMM_STORE_FLOOD_H_

#include <unistd.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace zinf::testing {

// Open descriptors of this process.
inline int OpenFdCount() {
  int n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Resident memory of this process in bytes.
inline uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// Header of a request frame: [op][u32 key length].
inline std::vector<uint8_t> FloodHeader(uint8_t op, uint32_t key_bytes) {
  return {op, static_cast<uint8_t>(key_bytes), static_cast<uint8_t>(key_bytes >> 8),
          static_cast<uint8_t>(key_bytes >> 16), static_cast<uint8_t>(key_bytes >> 24)};
}

// Runs one round of attack `kind` against 127.0.0.1:port; false when nobody accepted the
// connection. Connections that the attack keeps open go to `held` (at most `max_held`, oldest
// closed first).
inline bool FloodOnce(int kind, uint16_t port, std::mt19937_64& rng,
                      std::deque<boost::asio::ip::tcp::socket>& held, size_t max_held,
                      boost::asio::io_context& io) {
  namespace asio = boost::asio;
  asio::ip::tcp::socket s(io);
  boost::system::error_code ec;
  s.connect({asio::ip::make_address("127.0.0.1"), port}, ec);
  if (ec) return false;
  std::vector<uint8_t> bytes;
  bool hold = false;
  switch (kind % 6) {
    case 0:  // connect and close
      break;
    case 1:  // a 64 MiB key announced, nothing sent
      bytes = FloodHeader(1, 64u << 20);
      hold = true;
      break;
    case 2: {  // an auth frame announcing a 4 GiB value, then silence
      bytes = FloodHeader(5, 0);
      for (int i = 0; i < 4; ++i) bytes.push_back(0xff);
      hold = true;
      break;
    }
    case 3:  // garbage
      bytes.resize(1 + rng() % 200);
      for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
      break;
    case 4: {  // a wrong secret, then a request as if it had worked
      const std::string guess = "guess" + std::to_string(rng() % 1000);
      bytes = FloodHeader(5, static_cast<uint32_t>(guess.size()));
      bytes.insert(bytes.end(), guess.begin(), guess.end());
      bytes.insert(bytes.end(), {0, 0, 0, 0});
      const std::vector<uint8_t> set = FloodHeader(1, 1);
      bytes.insert(bytes.end(), set.begin(), set.end());
      bytes.insert(bytes.end(), {'k', 0, 0, 0, 0});
      break;
    }
    case 5:  // connect and say nothing
      hold = true;
      break;
  }
  if (!bytes.empty()) asio::write(s, asio::buffer(bytes), ec);
  if (hold) {
    held.push_back(std::move(s));
    while (held.size() > max_held) held.pop_front();
  }
  return true;
}

// Floods 127.0.0.1:port from a thread until destroyed, keeping up to `max_held` connections
// open at once.
class StoreFlooder {
 public:
  explicit StoreFlooder(uint16_t port, size_t max_held = 100) {
    thread_ = std::thread([this, port, max_held] {
      boost::asio::io_context io;
      std::deque<boost::asio::ip::tcp::socket> held;
      std::mt19937_64 rng(42);
      for (int i = 0; !stop_.load(); ++i) {
        if (FloodOnce(i, port, rng, held, max_held, io)) {
          rounds_.fetch_add(1);
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));  // not listening yet
        }
      }
    });
  }
  ~StoreFlooder() {
    stop_.store(true);
    thread_.join();
  }
  StoreFlooder(const StoreFlooder&) = delete;
  StoreFlooder& operator=(const StoreFlooder&) = delete;
  // Rounds whose connection was accepted.
  int64_t rounds() const { return rounds_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> rounds_{0};
  std::thread thread_;
};

}  // namespace zinf::testing

#endif  // ZINF_TESTS_COMM_STORE_FLOOD_H_
