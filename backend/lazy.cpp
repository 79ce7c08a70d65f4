#include "lazy.h"

#include <sheaf/core/error.h>

#include "row_gather.h"


namespace sheaf {

void LazyValues::add(uint32_t first, std::shared_ptr<const FusedProgram> program, std::vector<FusedInput> inputs,
                     int64_t n, const Site& site) {
  const auto count = static_cast<uint32_t>(program->code.size());
  if (record_of_slot_.size() < first + count) record_of_slot_.resize(first + count, -1);
  for (uint32_t k = 0; k < count; ++k) record_of_slot_[first + k] = static_cast<int32_t>(records_.size());
  std::vector<int64_t> versions;
  versions.reserve(inputs.size());
  for (const FusedInput& in : inputs) versions.push_back(version_of(in.tensor));
  records_.push_back(Record{first, std::move(program), std::move(inputs), n, std::move(versions), site});
}

const at::Tensor& LazyValues::get(NodeStore& store, uint32_t slot) {
  at::Tensor& value = store.batch_out[slot];
  if (value.defined()) return value;
  SHEAF_ASSERT(slot < record_of_slot_.size() && record_of_slot_[slot] >= 0, "batch ", slot, " has no value");
  const Record& r = records_[static_cast<size_t>(record_of_slot_[slot])];
  // Computed now, but as it was at forward(): not from inputs changed since.
  constexpr std::string_view by = "a value its fused kernel kept inside, computed when read,";
  for (size_t k = 0; k < r.inputs.size(); ++k) {
    const FusedInput& in = r.inputs[k];
    if (in.rows) in.rows->check_unchanged(by);
    check_version(r.site, by, in.tensor, r.versions[k]);
  }
  r.program->read_later[slot - r.first] = 1;  // keep it in this pattern's next batches
  std::vector<at::Tensor> values = run_fused(r.program, r.inputs, r.n);
  ++remade_;
  for (size_t k = 0; k < values.size(); ++k)
    if (!store.batch_out[r.first + k].defined()) store.batch_out[r.first + k] = std::move(values[k]);
  return value;
}

void LazyValues::clear() {
  records_.clear();
  record_of_slot_.clear();
  remade_ = 0;
}

}  // namespace sheaf
