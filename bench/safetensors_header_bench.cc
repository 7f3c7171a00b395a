// Parsing a safetensors header of n tensors: this build's ParseSafetensorsHeader against the
// one of bc42780 (nlohmann::ordered_json, whose key lookup is linear), interleaved, medians of
// three. Built and run by bench/safetensors_header.sh, which compiles the old parser beside it.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>
#include "ckpt/safetensors.h"
namespace zinf::ckpt_old {
StatusOr<std::vector<zinf::ckpt::SafetensorsTensor>> ParseSafetensorsHeader(std::string_view,
                                                                            uint64_t,
                                                                            std::string_view);
}
int main() {
  for (int n : {40000, 100000, 300000}) {
    std::string h = "{";
    for (int i = 0; i < n; ++i)
      h += (i ? ",\"t" : "\"t") + std::to_string(i) +
           R"(": {"dtype": "F32", "shape": [1], "data_offsets": [)" + std::to_string(4 * i) + ", " +
           std::to_string(4 * i + 4) + "]}";
    h += "}";
    std::vector<double> olds, news;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      if (n <= 100000) {
        auto r = zinf::ckpt_old::ParseSafetensorsHeader(h, 4ull * n, "x");
        if (!r.ok()) return 1;
      }  // the old one: under 30 s only
      auto t1 = std::chrono::steady_clock::now();
      auto r2 = zinf::ckpt::ParseSafetensorsHeader(h, 4ull * n, "x");
      if (!r2.ok()) return 1;
      auto t2 = std::chrono::steady_clock::now();
      olds.push_back(std::chrono::duration<double>(t1 - t0).count());
      news.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    std::sort(olds.begin(), olds.end());
    std::sort(news.begin(), news.end());
    if (n <= 100000) {
      std::printf("%d tensors: old %.3f s, new %.3f s, old/new %.1fx (medians of 3, interleaved)\n",
                  n, olds[1], news[1], olds[1] / news[1]);
    } else {
      std::printf("%d tensors: new %.3f s (median of 3; the old parser is not run: over 30 s)\n", n,
                  news[1]);
    }
  }
}
