#include "function.h"

#include <atomic>

#include <c10/util/SmallVector.h>

#include <sheaf/engine/engine.h>

namespace sheaf {

namespace {
std::atomic<uint64_t> g_next_function{1};
}

Function::Function(std::string name, size_t arity, Body body, std::source_location loc) {
  if (arity == 0) throw_user_at(loc, "function '", name, "' takes no arguments: a call records on its arguments' graph");
  if (!body) throw_user_at(loc, "function '", name, "' has no body");
  auto def = std::make_shared<detail::FunctionDef>();
  def->id = g_next_function.fetch_add(1);
  def->name = std::move(name);
  def->arity = arity;
  def->body = std::move(body);
  def->defined_at = loc;
  def_ = std::move(def);
}

const std::string& Function::name() const { return def_->name; }
size_t Function::arity() const { return def_->arity; }

std::vector<Expr> Function::call(std::span<const Operand> args, std::source_location loc) const {
  std::vector<Expr> results;
  call_into(args, results, loc);
  return results;
}

void Function::call_into(std::span<const Operand> args, std::vector<Expr>& results, std::source_location loc) const {
  call_into(args, results, 0, loc);
}

bool Function::call_usual(std::span<const Expr> args, std::span<Expr> results, std::source_location loc) const {
  if (args.empty() || args.size() > 8) return false;
  detail::Engine* g = detail::Engine::find(args[0]);
  if (g == nullptr) return false;
  std::array<NodeId, 8> ids;
  for (size_t i = 0; i < args.size(); ++i)
    if ((ids[i] = g->node_or_none(args[i])) == kNoNode) return false;  // (call_into says what is wrong)
  return g->call_usual(*def_, std::span(ids.data(), args.size()), results, loc);
}

void Function::call_into(std::span<const Operand> args, std::vector<Expr>& results, size_t expected,
                         std::source_location loc) const {
  const Site site{def_->name, kSharedExample, loc};
  detail::Engine* g = nullptr;
  for (const Operand& a : args) {
    if (!a.is_expr()) continue;
    g = detail::Engine::find(a.expr());
    if (g == nullptr) throw_user(site, detail::Engine::unusable(a.expr(), "an argument"));
    break;
  }
  if (g == nullptr)
    throw_user(site, "every argument is a tensor, so there is no graph to record on; make one of them an Expr with "
                     "g.param(tensor)");
  // On the stack for the usual few (not a thread_local: a body may call functions while this call records it).
  c10::SmallVector<NodeId, 8> ids;
  g->expect_open(def_->name, loc);  // before a tensor argument becomes a shared node of a frozen body
  for (const Operand& a : args)
    ids.push_back(a.is_expr() ? g->node_of(a.expr(), def_->name, loc) : g->trace().param(a.tensor(), loc));
  g->call(def_, ids, expected, results, loc);
}

}  // namespace sheaf
