// The CPU runner of Plugin nodes (ir/plugin.h): before every execution the plugin
// infers the output types from the actual input shapes, kiln allocates the outputs
// and calls the plugin's execute_cpu with dense row-major tensor views. A plugin
// without a CPU callback, a failing callback, or an answer that contradicts the graph
// is a kiln::Error naming the node, the op and the plugin. Tested in
// tests/plugins/plugin_test.cpp.
#include <memory>

#include "backends/cpu/cpu_ops.h"
#include "core/status.h"
#include "ir/plugin.h"

namespace kiln::cpu {

namespace {

struct PluginState {
  explicit PluginState(const ir::Node& n) : node(n), attrs(node) {}
  ir::Node node;  // a copy: attrs points into it
  ir::PluginAttrs attrs;
  const ir::PluginOp* op = nullptr;
  std::vector<DType> out_dtypes;  // as the graph was built
};

// Dense row-major views of tensors for the ABI (dims and strides live in `shapes`).
struct Views {
  std::vector<kiln_plugin_tensor> t;
  std::vector<std::vector<int64_t>> shapes, strides;
  void add(const Tensor* x) {
    kiln_plugin_tensor v{};
    shapes.emplace_back(x ? x->shape() : std::vector<int64_t>{});
    std::vector<int64_t> st(shapes.back().size());
    int64_t s = 1;
    for (size_t d = st.size(); d-- > 0;) {
      st[d] = s;
      s *= shapes.back()[d];
    }
    strides.push_back(std::move(st));
    v.data = x ? const_cast<void*>(x->data()) : nullptr;  // inputs: read-only by contract
    v.dtype = x ? ir::plugin_dtype(x->dtype()) : KILN_PLUGIN_ABSENT;
    v.rank = uint32_t(shapes.back().size());
    t.push_back(v);
  }
  // Pointers are taken once every vector has its final size.
  void finish() {
    for (size_t i = 0; i < t.size(); ++i) {
      t[i].dims = shapes[i].data();
      t[i].strides = strides[i].data();
    }
  }
};

}  // namespace

OpRun prepare_plugin(const ir::Node& n, const ir::Graph& g, const CompileOptions&) {
  auto st = std::make_shared<PluginState>(n);
  st->op = &ir::plugin_op_of(n);
  if (!st->op->table.execute_cpu)
    throw_error(ErrorCode::kUnsupported, "cpu backend cannot run node '", n.name, "' (Plugin ",
                st->op->qualified_name(), " of plugin ", st->op->origin(),
                "): the plugin has no CPU implementation (its execute_cpu callback is NULL); run the model on a "
                "backend the plugin implements");
  for (ir::ValueId o : n.outputs) st->out_dtypes.push_back(g.value(o).dtype);
  return [st](OpContext& ctx) {
    const ir::PluginOp& op = *st->op;
    std::vector<std::optional<ir::PluginTensorType>> in_types;
    Views in, out;
    for (const Tensor* x : ctx.inputs) {
      in_types.push_back(x ? std::optional<ir::PluginTensorType>(ir::PluginTensorType{x->dtype(), x->shape()})
                           : std::nullopt);
      in.add(x);
    }
    std::vector<ir::PluginTensorType> types = ir::plugin_infer_concrete(op, st->node, st->attrs, in_types);
    for (size_t o = 0; o < types.size(); ++o) {
      if (types[o].dtype != st->out_dtypes[o])
        throw_error(ErrorCode::kInvalidArgument, "node '", st->node.name, "' (Plugin ", op.qualified_name(),
                    " of plugin ", op.origin(), "): output ", o, " is ", dtype_name(types[o].dtype),
                    " at run time but was ", dtype_name(st->out_dtypes[o]), " when the graph was built (a plugin bug)");
      out.add(&ctx.out(o, types[o].dims, types[o].dtype));
    }
    in.finish();
    out.finish();
    char err[1024] = {};
    const int32_t status = op.table.execute_cpu(op.table.user, in.t.empty() ? nullptr : in.t.data(),
                                                int32_t(in.t.size()), st->attrs.get(), out.t.data(),
                                                int32_t(out.t.size()), err, sizeof err);
    err[sizeof err - 1] = '\0';
    if (status != KILN_PLUGIN_OK) ir::plugin_callback_failed(op, st->node, "cpu execution", status, err);
  };
}

}  // namespace kiln::cpu
