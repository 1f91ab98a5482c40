// 2-D convolution for training through oneDNN (the library bundled in the paddle wheel).
//
// Why: Paddle's CPU convolution in the dynamic graph is im2col + GEMM, forward and backward; PyTorch
// runs the same layers through oneDNN's direct (JIT) kernels and is about twice as fast on the 3x3
// convolutions of a ResNet (reference/platform.md "CPU speed"; benchmarks/peers.py). Float32, NCHW
// activations and OIHW weights in Paddle's layout; oneDNN picks its own (blocked) layouts inside and
// we reorder at the boundary, as PyTorch does for NCHW tensors. groups 1, symmetric zero padding,
// any stride and dilation. The primitive descriptors are built once per shape and kept.
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

// The library is the paddle wheel's (oneDNN 3.6, built without the experimental sparse API); the
// headers come from an older 3.x package whose config turns that API on: turn it off before the
// C++ API is read (the config header is include-guarded), so no call into it is compiled.
#include "oneapi/dnnl/dnnl_config.h"
#undef DNNL_EXPERIMENTAL_SPARSE
#include "oneapi/dnnl/dnnl.hpp"
#include "paddle/extension.h"

namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

dnnl::engine& cpu() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

struct ConvPlan {
  memory::desc x, w, y;   // paddle's layouts
  dnnl::convolution_forward::primitive_desc fwd;
  dnnl::convolution_backward_data::primitive_desc bwd_data;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights;
  dnnl::convolution_forward fwd_prim;
  dnnl::convolution_backward_data bwd_data_prim;
  dnnl::convolution_backward_weights bwd_weights_prim;
};

using Key = std::vector<int64_t>;

const ConvPlan& plan_for(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                         const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                         const std::vector<int64_t>& dilations) {
  static std::mutex mu;
  static std::map<Key, std::unique_ptr<ConvPlan>> plans;
  Key key(xs);
  key.insert(key.end(), ws.begin(), ws.end());
  key.insert(key.end(), strides.begin(), strides.end());
  key.insert(key.end(), pads.begin(), pads.end());
  key.insert(key.end(), dilations.begin(), dilations.end());
  std::lock_guard<std::mutex> lock(mu);
  auto it = plans.find(key);
  if (it != plans.end()) return *it->second;

  const memory::dims st{strides[0], strides[1]}, pd{pads[0], pads[1]};
  const memory::dims dl{dilations[0] - 1, dilations[1] - 1};   // oneDNN counts the gaps
  memory::dims ys{xs[0], ws[0], 0, 0};
  for (int i = 0; i < 2; ++i) {
    const int64_t span = dilations[i] * (ws[2 + i] - 1) + 1;
    ys[2 + i] = (xs[2 + i] + 2 * pads[i] - span) / strides[i] + 1;
  }
  auto p = std::make_unique<ConvPlan>();
  p->x = memory::desc(memory::dims(xs.begin(), xs.end()), Dt::f32, Tag::nchw);
  p->w = memory::desc(memory::dims(ws.begin(), ws.end()), Dt::f32, Tag::oihw);
  p->y = memory::desc(ys, Dt::f32, Tag::nchw);
  const memory::desc xa(p->x.get_dims(), Dt::f32, Tag::any), wa(p->w.get_dims(), Dt::f32, Tag::any);
  const memory::desc ya(ys, Dt::f32, Tag::any);
  const auto alg = dnnl::algorithm::convolution_direct;
  p->fwd = dnnl::convolution_forward::primitive_desc(cpu(), dnnl::prop_kind::forward_training, alg, xa, wa, ya,
                                                     st, dl, pd, pd);
  p->bwd_data = dnnl::convolution_backward_data::primitive_desc(cpu(), alg, xa, wa, ya, st, dl, pd, pd, p->fwd);
  p->bwd_weights =
      dnnl::convolution_backward_weights::primitive_desc(cpu(), alg, xa, wa, ya, st, dl, pd, pd, p->fwd);
  p->fwd_prim = dnnl::convolution_forward(p->fwd);
  p->bwd_data_prim = dnnl::convolution_backward_data(p->bwd_data);
  p->bwd_weights_prim = dnnl::convolution_backward_weights(p->bwd_weights);
  return *(plans[key] = std::move(p));
}

// `user` itself when it already has the layout the primitive wants, else a reordered copy
memory as(const memory& user, const memory::desc& want, dnnl::stream& s) {
  if (user.get_desc() == want) return user;
  memory m(want, cpu());
  dnnl::reorder(user, m).execute(s, const_cast<memory&>(user), m);
  return m;
}

// a buffer in the primitive's layout for an output, copied to `user` by `finish`
memory out_for(const memory& user, const memory::desc& got) {
  return user.get_desc() == got ? user : memory(got, cpu());
}

void finish(memory& m, memory& user, dnnl::stream& s) {
  if (m.get_data_handle() != user.get_data_handle()) dnnl::reorder(m, user).execute(s, m, user);
}

memory wrap(const memory::desc& d, const paddle::Tensor& t) {
  return memory(d, cpu(), const_cast<float*>(t.data<float>()));
}

}  // namespace

std::vector<paddle::Tensor> ConvForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                        const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                        const std::vector<int64_t>& dilations, bool need_dx) {
  const ConvPlan& p = plan_for(x.shape(), w.shape(), strides, pads, dilations);
  auto y = paddle::empty(p.y.get_dims(), x.dtype(), x.place());
  dnnl::stream s(cpu());
  memory xu = wrap(p.x, x), wu = wrap(p.w, w), yu = wrap(p.y, y);
  memory xm = as(xu, p.fwd.src_desc(), s), wm = as(wu, p.fwd.weights_desc(), s), ym = out_for(yu, p.fwd.dst_desc());
  p.fwd_prim.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DST, ym}});
  finish(ym, yu, s);
  s.wait();
  return {y};
}

std::vector<paddle::Tensor> ConvBackward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                         const std::vector<int64_t>& strides, const std::vector<int64_t>& pads,
                                         const std::vector<int64_t>& dilations, bool need_dx) {
  const ConvPlan& p = plan_for(x.shape(), w.shape(), strides, pads, dilations);
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());   // left unwritten when the input needs no grad
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  dnnl::stream s(cpu());
  memory xu = wrap(p.x, x), wu = wrap(p.w, w), dyu = wrap(p.y, dy), dxu = wrap(p.x, dx), dwu = wrap(p.w, dw);
  memory dy_w = as(dyu, p.bwd_weights.diff_dst_desc(), s);
  if (need_dx) {
    memory dy_d = p.bwd_data.diff_dst_desc() == dy_w.get_desc() ? dy_w : as(dyu, p.bwd_data.diff_dst_desc(), s);
    memory wm = as(wu, p.bwd_data.weights_desc(), s), dxm = out_for(dxu, p.bwd_data.diff_src_desc());
    p.bwd_data_prim.execute(s, {{DNNL_ARG_DIFF_DST, dy_d}, {DNNL_ARG_WEIGHTS, wm}, {DNNL_ARG_DIFF_SRC, dxm}});
    finish(dxm, dxu, s);
  }
  memory xm = as(xu, p.bwd_weights.src_desc(), s), dwm = out_for(dwu, p.bwd_weights.diff_weights_desc());
  p.bwd_weights_prim.execute(s, {{DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_DST, dy_w}, {DNNL_ARG_DIFF_WEIGHTS, dwm}});
  finish(dwm, dwu, s);
  s.wait();
  return {dx, dw};
}

PD_BUILD_OP(zoo_conv2d)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(ConvForward));
PD_BUILD_GRAD_OP(zoo_conv2d)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int64_t>", "pads: std::vector<int64_t>", "dilations: std::vector<int64_t>",
            "need_dx: bool"})
    .SetKernelFn(PD_KERNEL(ConvBackward));
