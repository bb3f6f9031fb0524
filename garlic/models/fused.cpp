// Fused CPU kernels for two layers of GARLIC whose PyTorch forms spend their time on per-operation overhead and
// passes over memory rather than on arithmetic: a GRU layer (its backward pass step by step) and a layer norm over a
// few features. garlic/models/fused.py wraps them as autograd functions and says when they are used; the formulas
// are in its docstrings. Tensors arrive contiguous (the wrappers make them so), float32 or float64.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

namespace {

// The kernels index raw pointers by the sizes they are given, so each first checks that every tensor is what its
// sizes promise (the Python layers send anything else to PyTorch's own; these guard other callers of the module).
void check_tensor(const char* kernel, const char* name, const at::Tensor& tensor, at::IntArrayRef sizes,
                  const at::Tensor& like) {
  TORCH_CHECK(tensor.sizes() == sizes, kernel, ": ", name, " has size ", tensor.sizes(), ", expected ", sizes);
  TORCH_CHECK(tensor.scalar_type() == like.scalar_type(), kernel, ": ", name, " is ", tensor.scalar_type(),
              ", expected ", like.scalar_type());
  TORCH_CHECK(tensor.device().is_cpu() && tensor.is_contiguous(), kernel, ": ", name,
              " must be a contiguous CPU tensor");
}

// One GRU layer over T steps, batch-major, with the input products precomputed for every step:
//   gi [B, T, 3H] = x W_ih^T + b_ih (gates r, z, n), h0 [B, H], w_hh [3H, H], b_hh [3H]
// -> out [B, T, H], and (keep_gates) gates [B, T, 4H]: r, z, n and the hidden part of n, W_hn h + b_hn, at every
// step, which the backward pass reads. Each step runs the operations of PyTorch's CPU GRU cell in its order, so the
// outputs equal nn.GRU's (to the last bit where the products round alike, as at GARLIC's sizes).
std::vector<at::Tensor> gru_layer_forward(const at::Tensor& gi, const at::Tensor& h0, const at::Tensor& w_hh,
                                          const at::Tensor& b_hh, bool keep_gates) {
  TORCH_CHECK(gi.dim() == 3 && h0.dim() == 2, "gru_layer_forward: gi must be [B, T, 3H] and h0 [B, H]; got ",
              gi.sizes(), " and ", h0.sizes());
  const int64_t B = gi.size(0), T = gi.size(1), H = h0.size(1);
  check_tensor("gru_layer_forward", "gi", gi, {B, T, 3 * H}, gi);
  check_tensor("gru_layer_forward", "h0", h0, {B, H}, gi);
  check_tensor("gru_layer_forward", "w_hh", w_hh, {3 * H, H}, gi);
  check_tensor("gru_layer_forward", "b_hh", b_hh, {3 * H}, gi);
  auto out = at::empty({B, T, H}, gi.options());
  auto gates = at::empty({keep_gates ? B : 0, T, 4 * H}, gi.options());
  auto hidden = at::empty({B, 3 * H}, gi.options());  // W_hh h at this step
  auto reset_update = at::empty({B, 2 * H}, gi.options());
  auto candidate = at::empty({B, H}, gi.options());
  const auto w_hh_t = w_hh.t();
  AT_DISPATCH_FLOATING_TYPES(gi.scalar_type(), "gru_layer_forward", [&] {
    const scalar_t* gi_p = gi.data_ptr<scalar_t>();
    const scalar_t* hidden_p = hidden.data_ptr<scalar_t>();
    const scalar_t* b_p = b_hh.data_ptr<scalar_t>();
    scalar_t* rz_p = reset_update.data_ptr<scalar_t>();
    scalar_t* n_p = candidate.data_ptr<scalar_t>();
    scalar_t* out_p = out.data_ptr<scalar_t>();
    scalar_t* gates_p = gates.data_ptr<scalar_t>();
    for (int64_t t = 0; t < T; ++t) {
      const at::Tensor previous = t == 0 ? h0 : out.select(1, t - 1);
      at::mm_out(hidden, previous, w_hh_t);  // the bias is added below: addmm would first copy it into hidden
      const scalar_t* prev_p = previous.data_ptr<scalar_t>();
      const int64_t prev_stride = previous.stride(0);
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t* gi_row = gi_p + (b * T + t) * 3 * H;
        const scalar_t* hidden_row = hidden_p + b * 3 * H;
        scalar_t* rz_row = rz_p + b * 2 * H;
        for (int64_t j = 0; j < 2 * H; ++j) rz_row[j] = gi_row[j] + (hidden_row[j] + b_p[j]);
      }
      reset_update.sigmoid_();
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t* gi_row = gi_p + (b * T + t) * 3 * H;
        const scalar_t* hidden_row = hidden_p + b * 3 * H;
        const scalar_t* rz_row = rz_p + b * 2 * H;
        scalar_t* n_row = n_p + b * H;
        for (int64_t j = 0; j < H; ++j) {
          n_row[j] = gi_row[2 * H + j] + rz_row[j] * (hidden_row[2 * H + j] + b_p[2 * H + j]);
        }
      }
      candidate.tanh_();
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t* rz_row = rz_p + b * 2 * H;
        const scalar_t* n_row = n_p + b * H;
        const scalar_t* prev_row = prev_p + b * prev_stride;
        scalar_t* out_row = out_p + (b * T + t) * H;
        for (int64_t j = 0; j < H; ++j) out_row[j] = (prev_row[j] - n_row[j]) * rz_row[H + j] + n_row[j];
        if (keep_gates) {
          const scalar_t* hidden_row = hidden_p + b * 3 * H;
          scalar_t* gates_row = gates_p + (b * T + t) * 4 * H;
          for (int64_t j = 0; j < 2 * H; ++j) gates_row[j] = rz_row[j];
          for (int64_t j = 0; j < H; ++j) gates_row[2 * H + j] = n_row[j];
          for (int64_t j = 0; j < H; ++j) gates_row[3 * H + j] = hidden_row[2 * H + j] + b_p[2 * H + j];
        }
      }
    }
  });
  return {out, gates};
}

// The gradients of gru_layer_forward, from d_out [B, T, H] (the loss's gradient at every step's output):
// -> d_gi [B, T, 3H], d_h0 [B, H], d_w_hh [3H, H], d_b_hh [3H]. Back through time one step at a time, as autograd
// would, but with each step's elementwise work in one loop and the weight gradients in one product over all steps.
std::vector<at::Tensor> gru_layer_backward(const at::Tensor& d_out, const at::Tensor& h0, const at::Tensor& w_hh,
                                           const at::Tensor& out, const at::Tensor& gates) {
  TORCH_CHECK(out.dim() == 3 && out.size(1) > 0, "gru_layer_backward: out must be [B, T, H] with T > 0; got ",
              out.sizes());
  const int64_t B = out.size(0), T = out.size(1), H = out.size(2);
  check_tensor("gru_layer_backward", "out", out, {B, T, H}, out);
  check_tensor("gru_layer_backward", "d_out", d_out, {B, T, H}, out);
  check_tensor("gru_layer_backward", "h0", h0, {B, H}, out);
  check_tensor("gru_layer_backward", "w_hh", w_hh, {3 * H, H}, out);
  check_tensor("gru_layer_backward", "gates", gates, {B, T, 4 * H}, out);
  auto d_gi = at::empty({B, T, 3 * H}, out.options());
  auto d_hidden = at::empty({B, T, 3 * H}, out.options());  // the gradient at W_hh h + b_hh
  // The gradient reaching h_t from the later steps, in two parts: through W_hh, and past the update gate (d z).
  auto through_weights = at::zeros({B, H}, out.options());
  auto through_update = at::zeros({B, H}, out.options());
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "gru_layer_backward", [&] {
    const scalar_t* d_out_p = d_out.data_ptr<scalar_t>();
    const scalar_t* out_p = out.data_ptr<scalar_t>();
    const scalar_t* h0_p = h0.data_ptr<scalar_t>();
    const scalar_t* gates_p = gates.data_ptr<scalar_t>();
    scalar_t* d_gi_p = d_gi.data_ptr<scalar_t>();
    scalar_t* d_hidden_p = d_hidden.data_ptr<scalar_t>();
    const scalar_t* weights_p = through_weights.data_ptr<scalar_t>();
    scalar_t* through_p = through_update.data_ptr<scalar_t>();
    for (int64_t t = T - 1; t >= 0; --t) {
      for (int64_t b = 0; b < B; ++b) {
        const scalar_t* g = gates_p + (b * T + t) * 4 * H;
        const scalar_t* prev = t == 0 ? h0_p + b * H : out_p + (b * T + t - 1) * H;
        const scalar_t* d_out_row = d_out_p + (b * T + t) * H;
        scalar_t* d_gi_row = d_gi_p + (b * T + t) * 3 * H;
        scalar_t* d_hidden_row = d_hidden_p + (b * T + t) * 3 * H;
        for (int64_t j = 0; j < H; ++j) {
          const scalar_t r = g[j], z = g[H + j], n = g[2 * H + j], hidden_n = g[3 * H + j];
          const scalar_t d = weights_p[b * H + j] + through_p[b * H + j] + d_out_row[j];
          const scalar_t d_n = d * (1 - z) * (1 - n * n);
          const scalar_t d_z = d * (prev[j] - n) * z * (1 - z);
          const scalar_t d_r = d_n * hidden_n * r * (1 - r);
          d_gi_row[j] = d_r;
          d_gi_row[H + j] = d_z;
          d_gi_row[2 * H + j] = d_n;
          d_hidden_row[j] = d_r;
          d_hidden_row[H + j] = d_z;
          d_hidden_row[2 * H + j] = d_n * r;
          through_p[b * H + j] = d * z;
        }
      }
      at::mm_out(through_weights, d_hidden.select(1, t), w_hh);  // addmm would first copy through_update
    }
  });
  const auto previous = at::cat({h0.unsqueeze(1), out.narrow(1, 0, T - 1)}, 1);
  auto d_w_hh = at::mm(d_hidden.view({B * T, 3 * H}).t(), previous.reshape({B * T, H}));
  auto d_b_hh = d_hidden.sum({0, 1});
  return {d_gi, through_weights + through_update, d_w_hh, d_b_hh};
}

// Layer norm over the last axis of x [N, F]: y = (x - mean) / sqrt(var + eps) * w + b, one row at a time.
// -> y [N, F], statistics [N, 2] (mean and 1 / sqrt(var + eps) per row, for the backward pass).
std::vector<at::Tensor> layer_norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                                           double eps) {
  TORCH_CHECK(x.dim() > 0 && x.numel() > 0, "layer_norm_forward: x must have a last axis and elements; got ",
              x.sizes());
  const int64_t F = x.size(-1), N = x.numel() / F;
  check_tensor("layer_norm_forward", "x", x, x.sizes(), x);
  check_tensor("layer_norm_forward", "w", w, {F}, x);
  check_tensor("layer_norm_forward", "b", b, {F}, x);
  auto y = at::empty_like(x);
  auto statistics = at::empty({N, 2}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_forward", [&] {
    const scalar_t* x_p = x.data_ptr<scalar_t>();
    const scalar_t* w_p = w.data_ptr<scalar_t>();
    const scalar_t* b_p = b.data_ptr<scalar_t>();
    scalar_t* y_p = y.data_ptr<scalar_t>();
    scalar_t* s_p = statistics.data_ptr<scalar_t>();
    at::parallel_for(0, N, 2048, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = x_p + i * F;
        scalar_t mean = 0, var = 0;
        for (int64_t f = 0; f < F; ++f) mean += row[f];
        mean /= F;
        for (int64_t f = 0; f < F; ++f) var += (row[f] - mean) * (row[f] - mean);
        const scalar_t inv_std = 1 / std::sqrt(var / F + static_cast<scalar_t>(eps));
        for (int64_t f = 0; f < F; ++f) y_p[i * F + f] = (row[f] - mean) * inv_std * w_p[f] + b_p[f];
        s_p[2 * i] = mean;
        s_p[2 * i + 1] = inv_std;
      }
    });
  });
  return {y, statistics};
}

// The gradients of layer_norm_forward from d_y [N, F]: with x^ = (x - mean) inv_std and g = d_y w,
//   d_x = inv_std (g - mean_f(g) - x^ mean_f(g x^)),  d_w = sum_rows d_y x^,  d_b = sum_rows d_y
// -> d_x [N, F], d_w [F], d_b [F]. The row sums are summed per thread, then across threads.
std::vector<at::Tensor> layer_norm_backward(const at::Tensor& d_y, const at::Tensor& x, const at::Tensor& w,
                                            const at::Tensor& statistics) {
  TORCH_CHECK(x.dim() > 0 && x.numel() > 0, "layer_norm_backward: x must have a last axis and elements; got ",
              x.sizes());
  const int64_t F = x.size(-1), N = x.numel() / F;
  check_tensor("layer_norm_backward", "x", x, x.sizes(), x);
  check_tensor("layer_norm_backward", "d_y", d_y, x.sizes(), x);
  check_tensor("layer_norm_backward", "w", w, {F}, x);
  check_tensor("layer_norm_backward", "statistics", statistics, {N, 2}, x);
  auto d_x = at::empty_like(x);
  auto partial = at::zeros({at::get_num_threads(), 2, F}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "layer_norm_backward", [&] {
    const scalar_t* d_y_p = d_y.data_ptr<scalar_t>();
    const scalar_t* x_p = x.data_ptr<scalar_t>();
    const scalar_t* w_p = w.data_ptr<scalar_t>();
    const scalar_t* s_p = statistics.data_ptr<scalar_t>();
    scalar_t* d_x_p = d_x.data_ptr<scalar_t>();
    scalar_t* partial_p = partial.data_ptr<scalar_t>();
    at::parallel_for(0, N, 2048, [&](int64_t begin, int64_t end) {
      scalar_t* d_w_sum = partial_p + at::get_thread_num() * 2 * F;
      scalar_t* d_b_sum = d_w_sum + F;
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* row = x_p + i * F;
        const scalar_t* d_row = d_y_p + i * F;
        const scalar_t mean = s_p[2 * i], inv_std = s_p[2 * i + 1];
        scalar_t g_mean = 0, gx_mean = 0;
        for (int64_t f = 0; f < F; ++f) {
          const scalar_t x_hat = (row[f] - mean) * inv_std, g = d_row[f] * w_p[f];
          g_mean += g;
          gx_mean += g * x_hat;
          d_w_sum[f] += d_row[f] * x_hat;
          d_b_sum[f] += d_row[f];
        }
        g_mean /= F;
        gx_mean /= F;
        for (int64_t f = 0; f < F; ++f) {
          const scalar_t x_hat = (row[f] - mean) * inv_std;
          d_x_p[i * F + f] = inv_std * (d_row[f] * w_p[f] - g_mean - x_hat * gx_mean);
        }
      }
    });
  });
  const auto sums = partial.sum(0);
  return {d_x, sums[0], sums[1]};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gru_layer_forward", &gru_layer_forward);
  m.def("gru_layer_backward", &gru_layer_backward);
  m.def("layer_norm_forward", &layer_norm_forward);
  m.def("layer_norm_backward", &layer_norm_backward);
}
