// A plan: the batches of one round, in order, with the row order of each batch
// and how each batched input is obtained (a view when the rows are already in
// place, else one gather). Everything the executor needs is decided here, on the
// host, before the first launch; all indices live in one buffer that goes to
// the device in one copy.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../dsl/op_list.h"
#include "../tracer/node_store.h"
#include "round.h"
#include "strategy.h"

namespace sheaf {

// Rows [start, start + len) of an earlier batch's output, or, when index >= 0,
// the rows listed at plan.indices[index .. index + len) of it.
struct ArgPart {
  uint32_t batch;
  uint32_t start;
  uint32_t len;
  int64_t index = -1;
};

struct BatchArg {
  enum Kind : uint8_t {
    kShared,  // the shared tensor itself (parts: one, the whole batch_out entry)
    kView,    // one part that is a range: a view, no copy
    kGather,  // parts concatenated in order, then permuted by `perm` if perm >= 0
  };
  Kind kind;
  uint32_t parts_begin, parts_end;
  int64_t perm = -1;  // offset in plan.indices of n entries
};

struct PlannedBatch {
  OpCode op;
  uint32_t sig;
  bool shared;          // computes one shared value: inputs get a leading axis of 1
  uint32_t out;         // index in NodeStore::batch_out this batch writes
  uint32_t nodes_begin; // plan.nodes[nodes_begin .. + n): row i is node i
  uint32_t n;
  uint32_t args_begin;  // plan.args[args_begin .. + arity)
  uint32_t arity;       // for segmented ops: 1 (the flattened list)
  int64_t payload;      // offset in plan.indices of n payloads
  int64_t segments = -1;  // segmented ops: offset of `total` segment ids,
  int64_t counts = -1;    // then of n list lengths
  uint32_t total = 0;
};

struct Plan {
  std::string strategy;
  std::vector<PlannedBatch> batches;
  std::vector<NodeId> nodes;
  std::vector<BatchArg> args;
  std::vector<ArgPart> parts;
  std::vector<int64_t> indices;  // gathers, payloads and segment ids for the whole round

  std::string str() const;
};

// Orders rows, assigns every node its (batch, row), and plans every input.
// Writes value_batch/value_row for the round's nodes.
Plan make_plan(NodeStore& store, const RoundDag& dag, const Batches& batches, std::string_view strategy);

}  // namespace sheaf
