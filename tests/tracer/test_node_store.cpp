// NodeStore's argument and attribute lists: buffers that only grow and are
// written by count (their vectors' sizes are capacities, not list ends), so
// each node's lists must read back exactly across growth and clear().
#include <cstdint>
#include <source_location>
#include <vector>

#include <sheaf/tracer/node_store.h>

#include "../support.h"

using namespace sheaf;

namespace {

// Node k's lists: k % 23 arguments and k % 13 attributes, each value naming
// (round, node, position), so a list read from the wrong place shows.
std::vector<NodeId> args_for(uint32_t round, uint32_t k) {
  std::vector<NodeId> a(k % 23);
  for (uint32_t i = 0; i < a.size(); ++i) a[i] = round * 1000003u + k * 31u + i;
  return a;
}
std::vector<int64_t> attrs_for(uint32_t round, uint32_t k) {
  std::vector<int64_t> a(k % 13);
  for (uint32_t i = 0; i < a.size(); ++i) a[i] = -static_cast<int64_t>(round * 1000003u + k * 17u + i) - 1;
  return a;
}

void fill(NodeStore& s, uint32_t round, uint32_t nodes) {
  for (uint32_t k = 0; k < nodes; ++k) {
    const std::vector<NodeId> a = args_for(round, k);
    const std::vector<int64_t> t = attrs_for(round, k);
    REQUIRE(s.append(0, 0, a, t, k, 0, std::source_location::current(), 0) == k);
    // The lists end within their buffers (a buffer that grew too little
    // would have taken writes past its end).
    REQUIRE(s.arg_begin[s.size()] <= s.args.size());
    REQUIRE(s.attr_begin[s.size()] <= s.attrs.size());
  }
}

void check(const NodeStore& s, uint32_t round, uint32_t nodes) {
  REQUIRE(s.size() == nodes);
  for (uint32_t k = 0; k < nodes; ++k) {
    const std::vector<NodeId> a = args_for(round, k);
    const std::vector<int64_t> t = attrs_for(round, k);
    const auto got_a = s.args_of(k);
    const auto got_t = s.attrs_of(k);
    REQUIRE(std::vector<NodeId>(got_a.begin(), got_a.end()) == a);
    REQUIRE(std::vector<int64_t>(got_t.begin(), got_t.end()) == t);
    REQUIRE(s.payload[k] == k);
  }
}

}  // namespace

TEST_CASE("node store: argument and attribute lists read back across growth and clear", "[tracer]") {
  NodeStore s;
  // Past the lists' first buffers (256 entries) and the columns' (1024 nodes) several times over.
  fill(s, 1, 5000);
  check(s, 1, 5000);
  // After clear() the buffers keep their size: a smaller graph, then a larger
  // one that grows them again, each reading only its own lists.
  s.clear();
  const NodeId* const kept = s.args.data();
  fill(s, 2, 700);
  check(s, 2, 700);
  CHECK(s.args.data() == kept);  // a smaller graph reuses the buffers
  s.clear();
  fill(s, 3, 12000);
  check(s, 3, 12000);
  // A node with no lists between nodes with long ones.
  s.clear();
  const std::vector<NodeId> many(40, 7);
  const std::vector<int64_t> none;
  s.append(0, 0, many, none, 0, 0, std::source_location::current(), 0);
  s.append(0, 0, {}, none, 0, 0, std::source_location::current(), 0);
  s.append(0, 0, many, std::vector<int64_t>(9, 3), 0, 0, std::source_location::current(), 0);
  CHECK(s.args_of(0).size() == 40);
  CHECK(s.args_of(0)[39] == 7);
  CHECK(s.args_of(1).empty());
  CHECK(s.attrs_of(1).empty());
  CHECK(s.args_of(2).size() == 40);
  CHECK(s.args_of(2)[39] == 7);
  CHECK(s.attrs_of(2).size() == 9);
  CHECK(s.attrs_of(2)[8] == 3);
}

TEST_CASE("node store: one node's lists longer than the buffers grow at once", "[tracer]") {
  // A fresh store: the first list longer than a first buffer (256), then one
  // longer than twice the buffer, so the size asked for decides the growth.
  NodeStore s;
  for (size_t len : {300, 3000}) {
    std::vector<NodeId> a(len);
    std::vector<int64_t> t(len);
    for (size_t i = 0; i < len; ++i) {
      a[i] = static_cast<NodeId>(len + i);
      t[i] = -static_cast<int64_t>(len + i);
    }
    const NodeId n = s.append(0, 0, a, t, 0, 0, std::source_location::current(), 0);
    REQUIRE(s.arg_begin[s.size()] <= s.args.size());
    REQUIRE(s.attr_begin[s.size()] <= s.attrs.size());
    const auto got_a = s.args_of(n);
    const auto got_t = s.attrs_of(n);
    CHECK(std::vector<NodeId>(got_a.begin(), got_a.end()) == a);
    CHECK(std::vector<int64_t>(got_t.begin(), got_t.end()) == t);
  }
  CHECK(s.args_of(0).size() == 300);
  CHECK(s.args_of(0)[299] == 599);
}
