// A training run on forked ranks whose rank 0 writes what the parent compares: every
// parameter's bytes to DIR/out.bin and a line per step to DIR/steps.txt (the bitwise tests of
// the overlapped step and of layer-major micro-batches compare two runs this way).
//
// Thread-safety: plain functions and values.
#ifndef ZINF_TESTS_TESTING_RANK_OUTCOME_H_
#define ZINF_TESTS_TESTING_RANK_OUTCOME_H_

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"

namespace zinf::testing {

struct RankOutcome {
  std::string params;              // out.bin: every parameter's bytes
  std::vector<std::string> steps;  // steps.txt, a line each
};

// Runs `train(rank, port, dir)` on `world` forked ranks, `dir` a fresh temporary directory
// named after `label`; expects every rank to return 0, and returns what rank 0 wrote there.
template <typename Train>
RankOutcome TrainRanks(int world, const std::string& label, Train train) {
  const TempDir tmp(label);
  const std::vector<int> codes =
      RunRanks(world, [&](int rank, int port) { return train(rank, port, tmp.path()); });
  EXPECT_EQ(codes, std::vector<int>(world, 0)) << label;
  RankOutcome o;
  std::ifstream in(tmp.path() + "/out.bin", std::ios::binary);
  o.params.assign(std::istreambuf_iterator<char>(in), {});
  std::ifstream steps(tmp.path() + "/steps.txt");
  for (std::string line; std::getline(steps, line);) o.steps.push_back(line);
  return o;
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_RANK_OUTCOME_H_
