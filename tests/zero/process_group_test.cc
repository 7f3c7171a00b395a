// ResolveProcessPlace: ranks and data-parallel groups from the options, with clear errors.
#include "zero/process_group.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace zinf {
namespace {

using ::testing::HasSubstr;

TEST(ProcessPlaceTest, DataParallelGroupsAreNamedByTheirRanks) {
  auto place = ResolveProcessPlace({.rank = 3, .world_size = 4, .data_parallel_ranks = {1, 3}});
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->rank, 1);
  EXPECT_EQ(place->size, 2);
  EXPECT_EQ(place->global_rank, 3);
  EXPECT_EQ(place->name, "dp-1-3");
  place = ResolveProcessPlace({.rank = 2, .world_size = 4});
  ASSERT_TRUE(place.ok()) << place.status();
  EXPECT_EQ(place->rank, 2);
  EXPECT_EQ(place->size, 4);
  EXPECT_EQ(place->name, "world");
}

TEST(ProcessPlaceTest, BadPlacesAreRefusedSayingWhy) {
  auto place = ResolveProcessPlace({.rank = 4, .world_size = 4});
  EXPECT_EQ(place.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(place.status().message(), HasSubstr("world_size=4"));
  place = ResolveProcessPlace({.rank = 0, .world_size = 4, .data_parallel_ranks = {1, 1}});
  EXPECT_THAT(place.status().message(), HasSubstr("distinct"));
  place = ResolveProcessPlace({.rank = 0, .world_size = 4, .data_parallel_ranks = {1, 2}});
  EXPECT_THAT(place.status().message(), HasSubstr("does not hold this rank (0)"));
}

}  // namespace
}  // namespace zinf
