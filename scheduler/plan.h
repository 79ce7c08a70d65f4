// A plan: the batches of one round, in order, with the row order of each batch
// and how each batched input is obtained (a view when the rows are already in
// place, else gathered). Everything the executor needs is decided here, on the
// host, before the first launch; all indices live in one buffer that goes to
// the device in one copy.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <sheaf/core/column.h>
#include <sheaf/tracer/node_store.h>

#include "batches.h"
#include "fusion.h"
#include "round.h"

namespace sheaf {

// Rows of an earlier batch's output: [start, start + len), or, when index >= 0,
// the rows listed at plan.indices[index .. index + len).
struct Read {
  uint32_t batch;
  uint32_t start;
  uint32_t len;
  int64_t index = -1;
  // >= 0: one of several partial reads of the same batch, all served by ONE gather
  // node whose backward accumulates into a single gradient of that batch. Separate
  // index_select/narrow calls would each zero-fill a gradient the size of the whole
  // batch: a batch read by many later levels would cost levels x size.
  int32_t group = -1;
  // >= 0: one of several reads of disjoint row ranges of the same batch, all
  // served by ONE split of it (plan.splits[split], piece `slot`): views, whose
  // backward is one concatenation of the pieces' gradients.
  int32_t split = -1;
  uint32_t slot = 0;  // this read's output within its group or split
  // Rows of one row of the batch's values: the batch [n, L, S...] read as
  // [n * L, S...] (a packed batch's input from a batch that is not packed).
  bool flatten = false;
};

struct BatchArg {
  enum Kind : uint8_t {
    kShared,  // the shared tensor itself (one read: the whole batch_out entry)
    kView,    // one contiguous read: the batch itself or a narrow view of it
    kGather,  // reads concatenated in order, then permuted by `perm` if perm >= 0
  };
  Kind kind;
  uint32_t reads_begin, reads_end;
  int64_t perm = -1;  // offset in plan.indices of n entries
  // Not kNone32: the reads are rows of packed values (each value's L rows in
  // turn), viewed as [-1, shapes[unpack]...] for a batch that is not packed.
  uint32_t unpack = kNone32;
};

struct PlannedBatch {
  OpCode op;            // for a fused batch: its last member's op (for messages)
  bool shared;          // computes one shared value: inputs get a leading axis of 1
  uint32_t out;         // index in NodeStore::batch_out this batch writes (the first of `outputs`)
  uint32_t nodes_begin; // plan.nodes[nodes_begin .. + n): row i is node i (fused: n per member, member-major)
  uint32_t n;
  // > 0: a packed batch (OpTraits::rowwise): its nodes' values lie end to end,
  // `rows` rows of their shape less its first axis (the nodes' lengths summed).
  uint32_t rows = 0;
  // A fused batch (scheduler/fusion.h): n regions of one pattern, one kernel.
  // Its args are the program's inputs; member k's rows are batch_out[out + k].
  std::shared_ptr<const FusedProgram> program;
  uint32_t outputs = 1;
  uint32_t keep_begin = 0;  // plan.keep[keep_begin .. + outputs): members whose values leave the kernel
  uint32_t args_begin;  // plan.args[args_begin .. + arity)
  uint32_t arity;       // inputs; 1 for segmented ops (the flattened list) and stacked ones
  bool stacked = false; // all arguments in one input, node-major (OpTraits::stackable)
  int32_t split = -1;   // >= 0: a slice of plan.splits[split]: one split for all its slices
  uint32_t piece = 0;
  int64_t payload;      // offset in plan.indices of n payloads; -1: none (the op reads none: OpTraits::reads_payload)
  int64_t segments = -1;  // segmented ops: offset of `total` segment ids,
  int64_t counts = -1;    // then of n list lengths
  int64_t own_counts = -1;  // OpTraits::own_rows: offset of n lengths of those arguments
  uint32_t total = 0;
};

// Slice batches that cut one batch's rows in place, along one axis, into
// disjoint ranges, or reads of disjoint row ranges of one batch (axis 0): run
// as ONE split_with_sizes (one autograd node) instead of a narrow each, whose
// backward would each zero-fill the whole source.
struct SplitGroup {
  uint32_t batch;  // the source
  int64_t axis;    // batched axis (0: rows)
  // Pieces covering the axis (gaps included): plan.split_sizes[sizes_begin .. + sizes_len)
  // (one buffer for the round: planning allocates nothing once warm).
  uint32_t sizes_begin = 0, sizes_len = 0;
  // >= 0: the source is not a batch but the input of plan.batches[gathered]
  // (a slice), gathered once for every slice that reads the same rows.
  int32_t gathered = -1;
};

struct Plan {
  std::string strategy;
  std::vector<PlannedBatch> batches;
  Column<NodeId> nodes;  // (Columns: grown without zero-filling, written in full)
  std::vector<BatchArg> args;
  std::vector<Read> reads;
  Batches groups;  // reads served together, all of one batch (lists of read indices, one buffer)
  std::vector<SplitGroup> splits;
  std::vector<int64_t> split_sizes;
  Column<int64_t> indices;  // gathers, payloads and segment ids for the whole round
  std::vector<uint8_t> keep;     // fused batches: per member, whether anything outside its region reads it
  // Lookups whose value_at is a row of their table (no gradient goes to it):
  // computed without a launch (table_batch).
  std::vector<NodeId> placed;
  bool grad = false;  // autograd was on when planned (placed depends on it: Scheduler::replan)
  uint32_t base = 0;  // NodeStore::batch_out's size when planned: the first batch's output slot
  // Bytes of the rows that are not read as views (float rows): what the
  // round's gathers copy at most (a CPU fused kernel reads gathered rows in
  // place; splits serve some reads without copies). For scheduler/cost.h.
  uint64_t gathered_bytes = 0;
  uint32_t gathers = 0;  // inputs with such rows

  std::span<const int64_t> sizes_of(const SplitGroup& g) const { return {split_sizes.data() + g.sizes_begin, g.sizes_len}; }
  std::string str() const;
};

// Where a lookup (op::Lookup) is read from its table instead of launched
// (Plan::placed): the table's batch, when no gradient goes to the table now
// (autograd off, or a frozen table) and its value is computed; else kNone32.
uint32_t table_batch(const NodeStore& s, NodeId lookup);

// Orders the rows of every batch, assigns every node of the round its (batch,
// row) (value_at in the store) and plans every input. `plan` is
// overwritten; its buffers are reused.
// With fusion, `fuser` knows the round's regions (dag.region).
void make_plan(NodeStore& store, const RoundDag& dag, const Batches& batches, std::string_view strategy, Plan& plan,
               const Fuser* fuser = nullptr);

}  // namespace sheaf
