// Graph and Expr: the public facade over the engine.
#include "graph.h"

#include <ATen/ops/from_blob.h>

#include <sstream>

#include "engine.h"
#include "handles.h"
#include "scopes.h"

namespace sheaf {

namespace detail {
Engine& engine_of(Graph& g) { return *g.engine_; }
}  // namespace detail

Graph::Graph(GraphOptions options) : engine_(std::make_unique<detail::Engine>(*this, options)) {}
Graph::~Graph() {
  // Inside its own forward() (a callback or a kernel destroys it): that
  // forward still runs on the engine, which keeps itself until the forward
  // ends (Engine::orphan). Its Exprs go stale now, and say their graph was
  // destroyed: none reaches the freed Graph through Expr::graph() meanwhile.
  if (engine_ && (engine_->delivering_now() || engine_->executing_now())) {
    engine_->retire();
    detail::disown(engine_->slot());
    engine_->orphan(std::move(engine_));
  }
}

Expr Graph::input(const at::Tensor& x, Loc loc) {
  engine_->note_recording("input", loc);
  return engine_->expr(engine_->trace().input(x, loc));
}
Expr Graph::param(const at::Tensor& w, Loc loc) {
  engine_->note_recording("param", loc);
  return engine_->expr(engine_->trace().param(w, loc));
}
Expr Graph::constant(Shape shape, double value, Loc loc) {
  engine_->note_recording("constant", loc);
  return engine_->expr(engine_->trace().constant(shape, value, loc));
}
Expr Graph::lookup(const at::Tensor& table, std::span<const int64_t> ids, bool sparse_grad, Loc loc) {
  engine_->note_recording("lookup", loc);
  return engine_->expr(engine_->trace().lookup(table, ids, sparse_grad, loc));
}
Expr Graph::lookup(const at::Tensor& table, int64_t id, bool sparse_grad, Loc loc) {
  engine_->note_recording("lookup", loc);
  return engine_->expr(engine_->trace().lookup(table, id, sparse_grad, loc));
}

// Listed on the thread (engine/scopes.h): a task that suspends under it resumes under it.
Graph::ExampleScope::ExampleScope(Graph& g, int64_t id)
    : thread_(detail::this_thread_tag()), token_(detail::enter_scope(*g.engine_, id)) {}
Graph::ExampleScope::~ExampleScope() {
  if (thread_ == detail::this_thread_tag()) detail::leave_scope(token_);
}
Graph::ExampleScope Graph::example(int64_t id, Loc loc) {
  if (id < 0) throw_user_at(loc, "example ids are >= 0, got ", id);
  return ExampleScope(*this, id);
}
int64_t Graph::current_example() const { return engine_->trace().current_example(); }

void Graph::forward(std::span<const Expr> targets, const ForwardOptions& options, Loc loc) {
  engine_->forward(targets, options, loc);
}
void Graph::prepare(std::span<const Expr> targets, const ForwardOptions& options, Loc loc) {
  engine_->prepare(targets, options, loc);
}
void Graph::clear(Loc loc) {
  engine_->expect_can_clear(loc);
  engine_->clear();
}

void Graph::set_strategy(const Strategy& s) { engine_->options().strategy = &s; }
const GraphOptions& Graph::options() const { return engine_->options(); }
void Graph::set_train(bool train) { engine_->options().train = train; }
const Stats& Graph::stats() const { return engine_->stats(); }
size_t Graph::size() const { return engine_->trace().size(); }
std::string Graph::dump() const { return engine_->trace().dump(); }
std::string Graph::plan_str() const {
  const Plan* p = engine_->last_plan();
  return p ? p->str() : std::string();
}

// ---------------------------------------------------------------------------
// Expr.

Graph& Expr::graph(Loc loc) const { return detail::Engine::of(*this, loc).graph(); }

Shape Expr::shape(Loc loc) const {
  const detail::Engine& e = detail::Engine::of(*this, loc);
  e.trace().expect_known_shape(node_, "the shape", loc);
  return e.store().shape_of(node_);
}
int64_t Expr::example(Loc loc) const { return detail::Engine::of(*this, loc).store().example[node_]; }
at::Tensor Expr::value(Loc loc) const { return detail::Engine::of(*this, loc).value(node_, loc); }
double Expr::item(Loc loc) const {
  const detail::Engine& e = detail::Engine::of(*this, loc);
  at::Tensor v = value(loc);
  if (v.numel() != 1) {
    const Site site = e.trace().site_of(node_);
    throw_user_at(loc, "item() of a value with ", v.numel(), " elements (op '", site.op, "', example ", site.example,
                  ", recorded at ", detail::format_loc(site.loc), "); it needs a scalar");
  }
  return v.item<double>();
}

// ---------------------------------------------------------------------------

at::Tensor HostValue::tensor() const {
  const auto dims = shape.dims();
  return at::from_blob(const_cast<float*>(data), std::vector<int64_t>(dims.begin(), dims.end()),
                       at::TensorOptions().dtype(at::kFloat))
      .clone();
}

std::string Stats::str() const {
  std::ostringstream os;
  os << "nodes " << nodes << ", batches " << batches << ", rounds " << rounds << ", inputs zero-copy "
     << zero_copy_inputs << " / gathered " << gathered_inputs << " (" << gather_launches << " launches, "
     << gathered_bytes / 1024 << " KiB) / read in place " << in_place_inputs << ", fetches " << fetches << "; ms: trace " << trace_ms << ", schedule "
     << schedule_ms << ", execute " << execute_ms << ", fetch " << fetch_ms;
  if (gather_ms > 0 || op_ms > 0) os << " (profiled: gathers " << gather_ms << ", ops " << op_ms << ")";
  if (split_shared > 0) os << "; " << split_shared << " batches split by distinct shared operands";
  if (deferred > 0) os << "; " << deferred << " nodes deferred until needed";
  if (replans > 0) os << "; " << replans << " prepared rounds planned again";
  if (!strategy_used.empty()) os << "; schedule " << strategy_used;
  if (!compared.empty()) os << " (compared: " << describe(compared) << ")";
  return os.str();
}

}  // namespace sheaf
