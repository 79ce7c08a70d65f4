#include "node_store.h"

#include <algorithm>
#include <cstdint>

#include <sheaf/core/error.h>
#include <sheaf/core/hash.h>

namespace sheaf {

ShapeId ShapeTable::intern_slow(const Shape& s) {
  const auto fresh = static_cast<ShapeId>(shapes_.size());
  uint32_t id = index_.find_or_insert(hash_words(s.dims()), fresh, [&](uint32_t k) { return shapes_[k] == s; });
  if (id != FlatIndex::kEmpty) return id;
  shapes_.push_back(s);
  return fresh;
}

SigId SigTable::intern(std::span<const int64_t> key) {
  const auto fresh = static_cast<SigId>(begin_.size());
  uint32_t id = index_.find_or_insert(hash_words(key), fresh, [&](uint32_t k) {
    if (len_[k] != key.size()) return false;
    const int64_t* have = keys_.data() + begin_[k];
    for (size_t i = 0; i < key.size(); ++i)  // keys are a handful of words: no memcmp call
      if (have[i] != key[i]) return false;
    return true;
  });
  if (id != FlatIndex::kEmpty) return id;
  begin_.push_back(static_cast<uint32_t>(keys_.size()));
  len_.push_back(static_cast<uint32_t>(key.size()));
  keys_.insert(keys_.end(), key.begin(), key.end());
  return fresh;
}

void SigTable::clear() {
  keys_.clear();
  begin_.clear();
  len_.clear();
  index_.clear();
}

void NodeStore::grow() {
  capacity_ = capacity_ == 0 ? 1024 : 2 * capacity_;
  op.resize(capacity_);
  shape.resize(capacity_);
  arg_begin.resize(capacity_ + 1);
  attr_begin.resize(capacity_ + 1);
  payload.resize(capacity_);
  example.resize(capacity_);
  loc.resize(capacity_);
  sig.resize(capacity_);
  flags.resize(capacity_);
  alias.resize(capacity_);
  value_at.resize(capacity_);
}

void NodeStore::grow_lists(size_t more_args, size_t more_attrs) {
  const size_t need_args = arg_begin[size_] + more_args, need_attrs = attr_begin[size_] + more_attrs;
  // (The lists' offsets are 32-bit: past that they would wrap onto earlier lists.)
  if (need_args > UINT32_MAX || need_attrs > UINT32_MAX)
    throw_internal("a graph's argument or attribute lists outgrew 2^32 entries");
  if (need_args > args.size()) args.resize(std::max<size_t>({need_args, 2 * args.size(), 256}));
  if (need_attrs > attrs.size()) attrs.resize(std::max<size_t>({need_attrs, 2 * attrs.size(), 256}));
}

void NodeStore::clear() {
  size_ = 0;  // (arg_begin[0] and attr_begin[0] stay 0; the lists' buffers stay)
  batch_out.clear();
  batch_rows.clear();
  user_tensors.clear();
  sigs.clear();
  // Shapes stay interned: the same model uses the same few shapes batch after batch.
}

}  // namespace sheaf
