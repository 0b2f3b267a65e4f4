// The ONNX graph runtime's operators (c/onnx/runtime.c) that the dense
// kernels of matmul.wgsl do not cover, written to compute every element
// with the operations and the order of the runtime's C, so that a device
// without fused multiply-adds gives the CPU's bits (docs/gpu.md,
// "Imported ONNX graphs"). The program (c/onnx/gpu.inc) names a tensor by
// a buffer and an element offset; a tensor with a batch dimension (always
// its first) holds step[0] * PER values this step, one without PER.
//
// Gradients accumulate (grad += ...), as the runtime's do: the program
// clears every gradient at the start of a step.

override PER: u32 = 1u;        // values per example, or the whole tensor when BATCHED is 0
override BATCHED: u32 = 1u;
override OP: u32 = 0u;         // unary: 7 Relu, 8 Tanh, 9 Sigmoid, 12 copy, 19 LeakyRelu, 21 Gelu; binary: 3 Add, 4 Sub, 5 Mul, 6 Div; softmax: 10, 11 LogSoftmax
override ALPHA: f32 = 0.0;     // LeakyRelu's slope; LayerNormalization's epsilon
override APPROX: u32 = 0u;     // Gelu: 1 the tanh approximation
override LEN: u32 = 1u;        // Softmax / LayerNormalization: the row length (the last dims)
override HAS_BIAS: u32 = 0u;   // LayerNormalization
override A_OFF: u32 = 0u;
override B_OFF: u32 = 0u;
override O_OFF: u32 = 0u;
// MatMul [rows, K] x [K, N]: ROWS per example (or in all when BATCHED is 0)
override K: u32 = 1u;
override N: u32 = 1u;
// broadcasting (binary): the output's dims D0..D5 (D0 per example when
// BATCHED), the operands' element strides over them (0 where broadcast),
// and for binary_grad the operand whose gradient is summed (SIDE 0 = a, 1 = b)
override D0: u32 = 1u;
override D1: u32 = 1u;
override D2: u32 = 1u;
override D3: u32 = 1u;
override D4: u32 = 1u;
override D5: u32 = 1u;
override SA0: u32 = 0u;
override SA1: u32 = 0u;
override SA2: u32 = 0u;
override SA3: u32 = 0u;
override SA4: u32 = 0u;
override SA5: u32 = 0u;
override SB0: u32 = 0u;
override SB1: u32 = 0u;
override SB2: u32 = 0u;
override SB3: u32 = 0u;
override SB4: u32 = 0u;
override SB5: u32 = 0u;
override SIDE: u32 = 0u;
override TARGET: u32 = 1u;     // binary_grad: the operand's element count (per example when TB is 1)
override TB: u32 = 0u;

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;
@group(0) @binding(4) var<storage, read> c: array<f32>;

// weei_expf and weei_tanhf of c/sdk/weei_math.h (as in matmul.wgsl).
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
    let ax = abs(x);
    var t: f32;
    if (ax < bitcast<f32>(0x3c23d70au)) {
        t = ax - ax * ax * ax * bitcast<f32>(0x3eaaaaabu);
    } else if (ax > 9.0) {
        t = 1.0;
    } else {
        t = 1.0 - 2.0 / (weei_expf(2.0 * ax) + 1.0);
    }
    return select(t, -t, x < 0.0);
}

fn weei_logf(x_in: f32) -> f32 {
    var x = x_in;
    if (!(x > 0.0)) { return bitcast<f32>(0xf149f2cau); }
    var u = bitcast<u32>(x);
    var e = i32((u >> 23u) & 0xffu) - 127;
    if (e == -127) {
        x = x * bitcast<f32>(0x4b000000u);
        u = bitcast<u32>(x);
        e = i32((u >> 23u) & 0xffu) - 127 - 23;
    }
    var m = bitcast<f32>((u & 0x007fffffu) | 0x3f800000u);
    if (m > bitcast<f32>(0x3fb504f3u)) { m = m * 0.5; e = e + 1; }
    let f = m - 1.0;
    let s = f / (2.0 + f);
    let s2 = s * s;
    let poly = s * (2.0 + s2 * (bitcast<f32>(0x3f2aaaabu) + s2 * (bitcast<f32>(0x3ecccccdu)
        + s2 * (bitcast<f32>(0x3e924925u) + s2 * bitcast<f32>(0x3e638e39u)))));
    return poly + f32(e) * bitcast<f32>(0x3f317218u);
}

// runtime.c's erff_ (Numerical Recipes' erfc, Chebyshev fit), constants as the bits of its literals.
fn erff_(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * weei_expf(-z * z - bitcast<f32>(0x3fa1fc4eu) + t * (bitcast<f32>(0x3f8000c7u) + t * (bitcast<f32>(0x3ebf88fbu)
        + t * (bitcast<f32>(0x3dc636c9u) + t * (bitcast<f32>(0xbe3ec24cu) + t * (bitcast<f32>(0x3e8ec7ccu)
        + t * (bitcast<f32>(0xbf914e5du) + t * (bitcast<f32>(0x3fbe87b0u) + t * (bitcast<f32>(0xbf527892u)
        + t * bitcast<f32>(0x3e2ef945u))))))))));
    return select(r - 1.0, 1.0 - r, x >= 0.0);
}

const GELU_C: u32 = 0x3f4c422au;   // 0.7978845608f
const GELU_K: u32 = 0x3d372713u;   // 0.044715f
const GELU_R2: u32 = 0x3f3504f3u;  // 0.7071067812f
const GELU_RP: u32 = 0x3ecc422au;  // 0.3989422804f

fn gelu_tanh(x: f32) -> f32 {
    let k = bitcast<f32>(GELU_K);
    return weei_tanhf(bitcast<f32>(GELU_C) * (x + k * x * x * x));
}

// +0.0 the compiler cannot fold (matmul.wgsl's opaque_zero says why).
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

fn count(per: u32) -> u32 { return select(per, step[0] * per, BATCHED == 1u); }

// y = f(x) (a = x, out = y).
@compute @workgroup_size(64)
fn unary_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    let x = a[A_OFF + i];
    var y = x;
    if (OP == 7u) { y = select(0.0, x, x > 0.0); }
    if (OP == 8u) { y = weei_tanhf(x); }
    if (OP == 9u) { y = 1.0 / (1.0 + weei_expf(-x)); }
    if (OP == 19u) { y = select(ALPHA * x, x, x >= 0.0); }
    if (OP == 21u) {
        if (APPROX == 1u) { y = 0.5 * x * (1.0 + gelu_tanh(x)); }
        else { y = 0.5 * x * (1.0 + erff_(x * bitcast<f32>(GELU_R2))); }
    }
    out[O_OFF + i] = y;
}

// gx += dy f'(x) (a = x, b = dy, c = y, out = gx). Relu adds dy where
// x > 0, else +0.0 (the runtime's bitwise mask gives +0.0 too).
@compute @workgroup_size(64)
fn unary_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    let g = b[i];
    var d = g;
    if (OP == 7u) { d = select(0.0, g, a[A_OFF + i] > 0.0); }
    if (OP == 8u) { let y = c[i]; d = g * (1.0 - y * y); }
    if (OP == 9u) { let y = c[i]; d = g * y * (1.0 - y); }
    if (OP == 19u) { d = select(ALPHA * g, g, a[A_OFF + i] >= 0.0); }
    if (OP == 21u) {
        let x = a[A_OFF + i];
        if (APPROX == 1u) {
            let t = gelu_tanh(x);
            let k = bitcast<f32>(GELU_K);
            d = g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * bitcast<f32>(GELU_C) * (1.0 + 3.0 * k * x * x));
        } else {
            let e = erff_(x * bitcast<f32>(GELU_R2));
            d = g * (0.5 * (1.0 + e) + x * bitcast<f32>(GELU_RP) * weei_expf(-0.5 * x * x));
        }
    }
    out[O_OFF + i] = out[O_OFF + i] + d;
}

fn dims() -> array<u32, 6> {
    return array<u32, 6>(select(D0, step[0] * D0, BATCHED == 1u), D1, D2, D3, D4, D5);
}

// y = a op b with numpy broadcasting (out = y).
@compute @workgroup_size(64)
fn binary_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let d = dims();
    let total = d[0] * d[1] * d[2] * d[3] * d[4] * d[5];
    if (i >= total) { return; }
    let sa = array<u32, 6>(SA0, SA1, SA2, SA3, SA4, SA5);
    let sb = array<u32, 6>(SB0, SB1, SB2, SB3, SB4, SB5);
    var rest = i;
    var ia = A_OFF;
    var ib = B_OFF;
    for (var k = 5i; k >= 0; k = k - 1) {
        let q = rest % d[k];
        rest = rest / d[k];
        ia = ia + q * sa[k];
        ib = ib + q * sb[k];
    }
    let x = a[ia];
    let z = b[ib];
    var y = x + z;
    if (OP == 4u) { y = x - z; }
    if (OP == 5u) { y = x * z; }
    if (OP == 6u) { y = x / z; }
    out[i] = y;
}

// The gradient of one operand (SIDE), one invocation per its element: its
// gradient plus dy times the local derivative over every output element
// that read it, in ascending output order, as the runtime's loop adds them
// (a = a's value, b = b's value, c = dy, out = the operand's gradient at O_OFF).
@compute @workgroup_size(64)
fn binary_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    if (j >= select(TARGET, step[0] * TARGET, TB == 1u)) { return; }
    let d = dims();
    let sa = array<u32, 6>(SA0, SA1, SA2, SA3, SA4, SA5);
    let sb = array<u32, 6>(SB0, SB1, SB2, SB3, SB4, SB5);
    var st = sa;
    if (SIDE == 1u) { st = sb; }
    // the output index of j's first reader, and the broadcast dims' sizes and output strides
    var ys = array<u32, 6>(1u, 1u, 1u, 1u, 1u, 1u);
    for (var k = 4i; k >= 0; k = k - 1) { ys[k] = ys[k + 1] * d[k + 1]; }
    var base = 0u;
    var runs = 1u;
    for (var k = 0; k < 6; k = k + 1) {
        if (st[k] != 0u) { base = base + ((j / st[k]) % d[k]) * ys[k]; } else { runs = runs * d[k]; }
    }
    var acc = out[O_OFF + j];
    for (var r = 0u; r < runs; r = r + 1u) {
        // r's digits over the broadcast dims, row-major: ascending output order
        var rest = r;
        var i = base;
        for (var k = 5i; k >= 0; k = k - 1) {
            if (st[k] == 0u) { i = i + (rest % d[k]) * ys[k]; rest = rest / d[k]; }
        }
        var ia = A_OFF;
        var ib = B_OFF;
        var q = i;
        for (var k = 5i; k >= 0; k = k - 1) {
            let x = q % d[k];
            q = q / d[k];
            ia = ia + x * sa[k];
            ib = ib + x * sb[k];
        }
        let g = c[i];
        let x = a[ia];
        let z = b[ib];
        var dd = 1.0;
        if (SIDE == 0u) {
            if (OP == 5u) { dd = z; }
            if (OP == 6u) { dd = 1.0 / z; }
        } else {
            if (OP == 4u) { dd = -1.0; }
            if (OP == 5u) { dd = x; }
            if (OP == 6u) { dd = -x / (z * z); }
        }
        acc = acc + g * dd;
    }
    out[O_OFF + j] = acc;
}

// MatMul forward: out[r][n] = sum_k a[r][k] b[k][n], k ascending from +0.0
// (the runtime zeroes y, then mm_acc adds in the order of k).
@compute @workgroup_size(64)
fn mm_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * N) { return; }
    let r = e / N;
    let n = e % N;
    var acc = opaque_zero();
    for (var k = 0u; k < K; k = k + 1u) {
        acc = acc + a[A_OFF + r * K + k] * b[B_OFF + k * N + n];
    }
    out[O_OFF + e] = acc;
}

// dA[r][k] += sum_n dy[r][n] b[k][n], n ascending from dA (a = dy, b = B's value).
@compute @workgroup_size(64)
fn mm_grad_a(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * K) { return; }
    let r = e / K;
    let k = e % K;
    var acc = out[O_OFF + e];
    for (var n = 0u; n < N; n = n + 1u) {
        acc = acc + a[r * N + n] * b[B_OFF + k * N + n];
    }
    out[O_OFF + e] = acc;
}

// dB[k][n] += sum_r a[r][k] dy[r][n], r ascending from dB (a = A's value, b = dy).
@compute @workgroup_size(64)
fn mm_grad_b(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= K * N) { return; }
    let k = e / N;
    let n = e % N;
    let rows = count(PER);
    var acc = out[O_OFF + e];
    for (var r = 0u; r < rows; r = r + 1u) {
        acc = acc + a[A_OFF + r * K + k] * b[r * N + n];
    }
    out[O_OFF + e] = acc;
}

// AdamW's decoupled decay before the Adam step: w *= step[8] (1 - lr wd,
// computed in the WASM as the runtime does) over the PER trained weights.
@compute @workgroup_size(64)
fn decay(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= PER) { return; }
    out[i] = out[i] * bitcast<f32>(step[8]);
}

// Transpose: y[i] = x[sum_k idx_k SA_k], idx the output index over D0..D5 and
// SA_k the input stride of the input dim that output dim k is (a = x, out = y).
fn transposed(i: u32) -> u32 {
    let d = dims();
    let sa = array<u32, 6>(SA0, SA1, SA2, SA3, SA4, SA5);
    var rest = i;
    var off = 0u;
    for (var k = 5i; k >= 0; k = k - 1) {
        off = off + (rest % d[k]) * sa[k];
        rest = rest / d[k];
    }
    return off;
}

@compute @workgroup_size(64)
fn transpose_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    out[i] = a[A_OFF + transposed(i)];
}

// gx[off(i)] += dy[i]: every input element is one output element's (a = dy, out = gx).
@compute @workgroup_size(64)
fn transpose_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    let o = O_OFF + transposed(i);
    out[o] = out[o] + a[i];
}

// Softmax / LogSoftmax (OP 10 / 11) over rows of LEN values, one invocation a row, with
// runtime.c's operations; its sum is float64 there, float32 here (WGSL has no f64): within
// the gate's tolerance, not the same bits (a = x, out = y).
@compute @workgroup_size(64)
fn softmax_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= count(PER) / LEN) { return; }
    let base = r * LEN;
    var mx = a[A_OFF + base];
    for (var j = 1u; j < LEN; j = j + 1u) { mx = max(mx, a[A_OFF + base + j]); }
    var s = opaque_zero();
    for (var j = 0u; j < LEN; j = j + 1u) { s = s + weei_expf(a[A_OFF + base + j] - mx); }
    let ls = weei_logf(s);
    for (var j = 0u; j < LEN; j = j + 1u) {
        let x = a[A_OFF + base + j];
        out[base + j] = select(weei_expf(x - mx - ls), x - mx - ls, OP == 11u);
    }
}

// gx += y (dy - dot) (Softmax) or dy - exp(y) dot (LogSoftmax), dot = sum dy y or sum dy
// (a = y, b = dy, out = gx).
@compute @workgroup_size(64)
fn softmax_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= count(PER) / LEN) { return; }
    let base = r * LEN;
    var dot = opaque_zero();
    for (var j = 0u; j < LEN; j = j + 1u) {
        let g = b[base + j];
        dot = dot + select(g * a[base + j], g, OP == 11u);
    }
    for (var j = 0u; j < LEN; j = j + 1u) {
        let g = b[base + j];
        let y = a[base + j];
        let o = O_OFF + base + j;
        out[o] = out[o] + select(y * (g - dot), g - weei_expf(y) * dot, OP == 11u);
    }
}

// LayerNormalization's row statistics, as runtime.c's layernorm computes them (float64 sums
// there, float32 here): mean and 1 / sqrt(variance + epsilon).
fn ln_stats(base: u32) -> vec2<f32> {
    var s = opaque_zero();
    for (var j = 0u; j < LEN; j = j + 1u) { s = s + a[A_OFF + base + j]; }
    let mu = s / f32(LEN);
    var q = opaque_zero();
    for (var j = 0u; j < LEN; j = j + 1u) { let d = a[A_OFF + base + j] - mu; q = q + d * d; }
    return vec2<f32>(mu, 1.0 / sqrt(q / f32(LEN) + ALPHA));
}

// y = (x - mean) istd scale + bias, one invocation a row (a = x, b = weights: scale at
// B_OFF, bias at O_OFF when HAS_BIAS, out = y).
@compute @workgroup_size(64)
fn ln_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= count(PER) / LEN) { return; }
    let base = r * LEN;
    let st = ln_stats(base);
    for (var j = 0u; j < LEN; j = j + 1u) {
        let bias = select(0.0, b[O_OFF + j], HAS_BIAS == 1u);
        out[base + j] = (a[A_OFF + base + j] - st.x) * st.y * b[B_OFF + j] + bias;
    }
}

// gx += istd (dy scale - mean(dy scale) - xh mean(dy scale xh)), one invocation a row
// (a = x, b = weights (scale at B_OFF), c = dy, out = gx).
@compute @workgroup_size(64)
fn ln_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= count(PER) / LEN) { return; }
    let base = r * LEN;
    let st = ln_stats(base);
    var sd = opaque_zero();
    var sdx = opaque_zero();
    for (var j = 0u; j < LEN; j = j + 1u) {
        let xh = (a[A_OFF + base + j] - st.x) * st.y;
        let dxh = c[base + j] * b[B_OFF + j];
        sd = sd + dxh;
        sdx = sdx + dxh * xh;
    }
    let md = sd / f32(LEN);
    let mdx = sdx / f32(LEN);
    for (var j = 0u; j < LEN; j = j + 1u) {
        let xh = (a[A_OFF + base + j] - st.x) * st.y;
        let o = O_OFF + base + j;
        out[o] = out[o] + st.y * (c[base + j] * b[B_OFF + j] - md - xh * mdx);
    }
}

// The scale's (SIDE 0) or the bias's (SIDE 1) gradient at element j: += dy xh (or dy) over
// the rows in order (a = x, c = dy, out = grad at O_OFF).
@compute @workgroup_size(64)
fn ln_param_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = gid.x;
    if (j >= LEN) { return; }
    let rows = count(PER) / LEN;
    var acc = out[O_OFF + j];
    for (var r = 0u; r < rows; r = r + 1u) {
        let base = r * LEN;
        if (SIDE == 1u) { acc = acc + c[base + j]; continue; }
        let st = ln_stats(base);
        acc = acc + c[base + j] * ((a[A_OFF + base + j] - st.x) * st.y);
    }
    out[O_OFF + j] = acc;
}

// Batched MatMul (both operands batched, equal leading dims): matrices of M x K times
// K x N, PER matrices per example; the orders of mm_forward / mm_grad_a / mm_grad_b, per matrix.
override M: u32 = 1u;

@compute @workgroup_size(64)
fn bmm_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * M * N) { return; }
    let i = e / (M * N);
    let r = (e / N) % M;
    let n = e % N;
    var acc = opaque_zero();
    for (var k = 0u; k < K; k = k + 1u) {
        acc = acc + a[A_OFF + (i * M + r) * K + k] * b[B_OFF + (i * K + k) * N + n];
    }
    out[e] = acc;
}

// dA += dY B^T per matrix (a = dy, b = B's value).
@compute @workgroup_size(64)
fn bmm_grad_a(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * M * K) { return; }
    let i = e / (M * K);
    let r = (e / K) % M;
    let k = e % K;
    var acc = out[O_OFF + e];
    for (var n = 0u; n < N; n = n + 1u) {
        acc = acc + a[(i * M + r) * N + n] * b[B_OFF + (i * K + k) * N + n];
    }
    out[O_OFF + e] = acc;
}

// dB += A^T dY per matrix (a = A's value, b = dy).
@compute @workgroup_size(64)
fn bmm_grad_b(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * K * N) { return; }
    let i = e / (K * N);
    let k = (e / N) % K;
    let n = e % N;
    var acc = out[O_OFF + e];
    for (var r = 0u; r < M; r = r + 1u) {
        acc = acc + a[A_OFF + (i * M + r) * K + k] * b[(i * M + r) * N + n];
    }
    out[O_OFF + e] = acc;
}

// Gather along axis 0 (embeddings): the table's row k for index value f, as runtime.c's
// gather_rows reads it (float-held integers, negative from the end, out of range: none).
override ROW: u32 = 1u;      // values per table row
override ROWS: u32 = 1u;     // the table's rows

fn gather_row(f: f32) -> i32 {
    var k = -1 - i32(ROWS);
    if (f >= -2147483648.0 && f < 2147483648.0) { k = i32(f); }
    if (k < 0) { k = k + i32(ROWS); }
    return select(-1, k, k >= 0 && k < i32(ROWS));
}

// y[i][j] = table[k(i)][j] (a = indices at A_OFF, b = table at B_OFF, out = y).
@compute @workgroup_size(64)
fn gather_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER) * ROW) { return; }
    let k = gather_row(a[A_OFF + e / ROW]);
    out[e] = select(0.0, b[B_OFF + u32(max(k, 0)) * ROW + e % ROW], k >= 0);
}

// The table's gradient at one element: += dy of every index reading its row, in index order
// (a = indices at A_OFF, c = dy, out = grad at O_OFF).
@compute @workgroup_size(64)
fn gather_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= ROWS * ROW) { return; }
    let row = i32(e / ROW);
    let j = e % ROW;
    let n = count(PER);
    var acc = out[O_OFF + e];
    for (var i = 0u; i < n; i = i + 1u) {
        if (gather_row(a[A_OFF + i]) == row) { acc = acc + c[i * ROW + j]; }
    }
    out[O_OFF + e] = acc;
}

// Dropout in training: y = x mask, gx += dy mask; the mask (1 / keep or 0 per element) is drawn
// in the WASM from the runtime's stream, in its order, and uploaded with the batch (a = x or dy,
// c = mask, out = y or gx).
@compute @workgroup_size(64)
fn dropout_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    out[i] = a[A_OFF + i] * c[i];
}

@compute @workgroup_size(64)
fn dropout_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= count(PER)) { return; }
    out[O_OFF + i] = out[O_OFF + i] + a[i] * c[i];
}

@group(0) @binding(5) var<storage, read_write> aux: array<u32>;

// Concat: one input's block of each outer row, ROW values wide in the output and LEN in the
// input, at AT (a = x, out = y; backward a = dy, out = gx).
override AT: u32 = 0u;

@compute @workgroup_size(64)
fn concat_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER)) { return; }
    out[(e / LEN) * ROW + AT + e % LEN] = a[A_OFF + e];
}

@compute @workgroup_size(64)
fn concat_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= count(PER)) { return; }
    out[O_OFF + e] = out[O_OFF + e] + a[(e / LEN) * ROW + AT + e % LEN];
}

// The mse loss of runtime.c's loss_of over rows of LEN values: mse_diff writes d = z - label
// (read back: the WASM sums d^2 / LEN in float64 in the CPU's order; a = z, aux = the labels,
// out = stats), mse_grad the gradient 2 d / (LEN rows), the denominator's float32 bits in
// step[2] (a = stats, out = dz). step is lstep: step[0] counts rows.
@compute @workgroup_size(64)
fn mse_diff(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * LEN) { return; }
    out[e] = a[e] - f32(aux[e / LEN]);
}

@compute @workgroup_size(64)
fn mse_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * LEN) { return; }
    out[e] = 2.0 * a[e] / bitcast<f32>(step[2]);
}
