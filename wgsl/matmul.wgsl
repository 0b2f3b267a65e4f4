// Dense layers, written to compute every element with the operations and the
// order of c/sdk/weei_nn.c (weei_dense_forward / weei_dense_backward), so
// that on a device without fused multiply-adds the bits equal the CPU's.
// One invocation per output element; rows beyond step[0] (this step's
// example count) are left alone.
//
// Layout: weights and gradients live in one buffer each, at element offsets
// W_OFF (in*out, row-major [in][out]) and B_OFF (out), as in the model's
// float32 weight vector.

override IN: u32;
override OUT: u32;
override W_OFF: u32 = 0u;
override B_OFF: u32 = 0u;
// forward: 0 = identity, 1 = ReLU, 2 = tanh (weei_tanhf). input_grad: 1 = mask
// by mask[] > 0 (ReLU backward), 2 = times 1 - mask^2 (tanh backward, mask = the
// tanh output).
override ACT: u32 = 0u;

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;
@group(0) @binding(4) var<storage, read> mask: array<f32>;

// weei_expf and weei_tanhf of c/sdk/weei_math.h, operation by operation
// (constants are the bits of the C float literals; weei_expf as in
// softmax_xent.wgsl).
fn weei_expf(x_in: f32) -> f32 {
    var x = x_in;
    if (x > 88.0) { x = 88.0; }
    if (x < -87.0) { x = -87.0; }
    let fn_ = x * bitcast<f32>(0x3fb8aa3bu);
    let n = i32(select(fn_ + 0.5, fn_ - 0.5, fn_ < 0.0));
    var r = x - f32(n) * bitcast<f32>(0x3f317200u);
    r = r - f32(n) * bitcast<f32>(0x35bfbe8eu);
    let p = 1.0 + r * (1.0 + r * (0.5 + r * (bitcast<f32>(0x3e2aaaabu) + r * (bitcast<f32>(0x3d2aaaabu)
        + r * (bitcast<f32>(0x3c088889u) + r * bitcast<f32>(0x3ab60b61u))))));
    return p * bitcast<f32>(u32(n + 127) << 23u);
}

fn weei_tanhf(x: f32) -> f32 {
    let a = abs(x);
    var t: f32;
    if (a < bitcast<f32>(0x3c23d70au)) {
        t = a - a * a * a * bitcast<f32>(0x3eaaaaabu);
    } else if (a > 9.0) {
        t = 1.0;
    } else {
        t = 1.0 - 2.0 / (weei_expf(2.0 * a) + 1.0);
    }
    return select(t, -t, x < 0.0);
}

// +0.0, the start of every sum, read from the step buffer (its row count is
// below 2^31, so the masked sign bit is 0) instead of written as a literal.
// With a literal the shader compiler folds 0.0 + p to p, and Mesa's NIR
// (lavapipe) then rewrites (p + q) + c, p and q products, as (p + c) + q
// ("reassociate add chains for more FMA-friendly code"), which changes the
// bits: a value it cannot see keeps every sum in the written order.
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

// out[r][o] = bias[o] + sum_i x[r][i] * W[i][o], i ascending from the bias
// (a = x, b = weights, out = y).
@compute @workgroup_size(64)
fn forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * OUT) { return; }
    let r = k / OUT;
    let o = k % OUT;
    var acc = b[B_OFF + o];
    for (var i = 0u; i < IN; i = i + 1u) {
        acc = acc + a[r * IN + i] * b[W_OFF + i * OUT + o];
    }
    if (ACT == 1u) { acc = select(0.0, acc, acc > 0.0); }
    if (ACT == 2u) { acc = weei_tanhf(acc); }
    out[k] = acc;
}

// dW[i][o] = sum_r x[r][i] * dy[r][o], r ascending from +0.0
// (a = x, b = dy, out = gradient buffer at W_OFF).
@compute @workgroup_size(64)
fn weight_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= IN * OUT) { return; }
    let i = k / OUT;
    let o = k % OUT;
    let rows = step[0];
    var acc = opaque_zero();
    for (var r = 0u; r < rows; r = r + 1u) {
        acc = acc + a[r * IN + i] * b[r * OUT + o];
    }
    out[W_OFF + k] = acc;
}

// dx[r][i] = sum_o W[i][o] * dy[r][o] in the CPU's lane order: lane l sums
// o = l, l+4, ... below OUT & ~3 from +0.0, lanes combine as (l0 + l1) +
// (l2 + l3), then the remaining o one by one. ACT 1 then keeps dx only
// where mask (the layer input's activation) is > 0, else +0.0; ACT 2
// multiplies by 1 - mask^2 (weei_tanh_backward) (a = dy, b = weights, out = dx, mask = activation).
@compute @workgroup_size(64)
fn input_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * IN) { return; }
    let r = k / IN;
    let i = k % IN;
    let w = W_OFF + i * OUT;
    let d = r * OUT;
    let o4 = OUT & ~3u;
    let zero = opaque_zero();
    var s0 = zero;
    var s1 = zero;
    var s2 = zero;
    var s3 = zero;
    for (var o = 0u; o < o4; o = o + 4u) {
        s0 = s0 + b[w + o] * a[d + o];
        s1 = s1 + b[w + o + 1u] * a[d + o + 1u];
        s2 = s2 + b[w + o + 2u] * a[d + o + 2u];
        s3 = s3 + b[w + o + 3u] * a[d + o + 3u];
    }
    var s = (s0 + s1) + (s2 + s3);
    for (var o = o4; o < OUT; o = o + 1u) {
        s = s + b[w + o] * a[d + o];
    }
    if (ACT == 1u) { s = select(0.0, s, mask[k] > 0.0); }
    if (ACT == 2u) { s = s * (1.0 - mask[k] * mask[k]); }
    out[k] = s;
}
