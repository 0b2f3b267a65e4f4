// The byte transformer's own kernels (c/models/byte-transformer/net.c):
// embedding, layer norm, causal attention, dense layers through a
// transposed or bias-free weight, and the embedding gradient. Each output
// element is computed with net.c's operations in net.c's order (its 4-lane
// dot products and sums combine as (l0 + l1) + (l2 + l3)), so a device
// without fused multiply-adds gives the CPU's bits. The plain dense layers,
// weight and bias gradients, loss and Adam are matmul.wgsl, reduce.wgsl,
// softmax_xent.wgsl and optimizer.wgsl.
//
// Rows: step[0] is this step's row count (sequences x T); a partial last
// minibatch leaves the rows beyond it alone. A layer norm's buffer holds
// xhat (NROWS x D) then 1/std per row (NROWS), NROWS = the buffers' rows.
// Weight offsets (W_OFF, B_OFF, G_OFF) are relative to step[8], the base
// of the current layer, which the program copies into the step buffer
// before each layer's dispatches (0 outside the layers): one pipeline
// serves every layer.

override D: u32 = 128u;
override T: u32 = 64u;
override H: u32 = 4u;
override HD: u32 = 32u;
override NROWS: u32 = 512u;
// dense: out[r][c] = bias + sum_k a[r][k] * w(k, c), k ascending; w(k, c) =
// weights[W_OFF + k*C + c], or weights[W_OFF + c*K + k] when TRANS = 1.
override K: u32 = 1u;
override C: u32 = 1u;
override W_OFF: u32 = 0u;
override B_OFF: u32 = 0u;
override HAS_BIAS: u32 = 0u;
override TRANS: u32 = 0u;
override ACT: u32 = 0u; // dense: 1 = ReLU
// weight_bias_grad: dW [IN][OUT] at W_OFF, db [OUT] at B_OFF
override IN: u32 = 1u;
override OUT: u32 = 1u;
// offsets in the weight (and gradient) vector: a layer norm's gain (its bias follows), the position embedding
override G_OFF: u32 = 0u;
override P_OFF: u32 = 0u;
override V: u32 = 256u;
// attention's 1/sqrt(HD), the bits of net.c's float
override SCALE_BITS: u32 = 0u;

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> wts: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;
@group(0) @binding(4) var<storage, read> aux: array<f32>;
@group(0) @binding(5) var<storage, read> tok: array<u32>;
@group(0) @binding(6) var<storage, read_write> out2: array<f32>;
@group(0) @binding(7) var<storage, read> a2: array<f32>;

const LN_EPS_BITS = 0x3727c5acu; // 1e-5f

// weei_expf of c/sdk/weei_math.h (as in softmax_xent.wgsl)
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

// x0[r] = E[token r] + P[r mod T] (tok = tokens, out = x0).
@compute @workgroup_size(64)
fn embed(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * D) { return; }
    let r = k / D;
    let i = k % D;
    out[k] = wts[tok[r] * D + i] + wts[P_OFF + (r % T) * D + i];
}

// out += a, elementwise over the step's rows of D (the residual stream).
@compute @workgroup_size(64)
fn add(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * D) { return; }
    out[k] = out[k] + a[k];
}

// Layer norm of a row (a = x, out = y, out2 = xhat and 1/std, gain and bias at G_OFF).
@compute @workgroup_size(64)
fn ln_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= step[0]) { return; }
    let base = r * D;
    let invd = 1.0 / f32(D);
    var l = vec4<f32>(opaque_zero());
    for (var c = 0u; c < D; c = c + 4u) {
        l = l + vec4<f32>(a[base + c], a[base + c + 1u], a[base + c + 2u], a[base + c + 3u]);
    }
    let mean = ((l.x + l.y) + (l.z + l.w)) * invd;
    var q = vec4<f32>(opaque_zero());
    for (var c = 0u; c < D; c = c + 4u) {
        let v = vec4<f32>(a[base + c], a[base + c + 1u], a[base + c + 2u], a[base + c + 3u]) - vec4<f32>(mean);
        q = q + v * v;
    }
    let rs = 1.0 / sqrt(((q.x + q.y) + (q.z + q.w)) * invd + bitcast<f32>(LN_EPS_BITS));
    out2[NROWS * D + r] = rs;
    let g = step[8] + G_OFF;
    for (var i = 0u; i < D; i = i + 1u) {
        let xh = (a[base + i] - mean) * rs;
        out2[base + i] = xh;
        out[base + i] = wts[g + i] * xh + wts[g + D + i];
    }
}

// Layer norm backward of a row: out (dx) += rstd * (dxh - s1 - xhat * s2), dxh = dy * gain
// (a = dy, aux = xhat and 1/std).
@compute @workgroup_size(64)
fn ln_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= step[0]) { return; }
    let base = r * D;
    let invd = 1.0 / f32(D);
    let g = step[8] + G_OFF;
    var l1 = vec4<f32>(opaque_zero());
    var l2 = vec4<f32>(opaque_zero());
    for (var c = 0u; c < D; c = c + 4u) {
        let d = vec4<f32>(a[base + c], a[base + c + 1u], a[base + c + 2u], a[base + c + 3u])
            * vec4<f32>(wts[g + c], wts[g + c + 1u], wts[g + c + 2u], wts[g + c + 3u]);
        l1 = l1 + d;
        l2 = l2 + d * vec4<f32>(aux[base + c], aux[base + c + 1u], aux[base + c + 2u], aux[base + c + 3u]);
    }
    let s1 = ((l1.x + l1.y) + (l1.z + l1.w)) * invd;
    let s2 = ((l2.x + l2.y) + (l2.z + l2.w)) * invd;
    let rs = aux[NROWS * D + r];
    for (var i = 0u; i < D; i = i + 1u) {
        let dxh = a[base + i] * wts[g + i];
        out[base + i] = out[base + i] + rs * ((dxh - s1) - aux[base + i] * s2);
    }
}

// A layer norm's gain and bias gradients, rows ascending from +0.0
// (a = dy, aux = xhat, out = the gradient vector at G_OFF).
@compute @workgroup_size(64)
fn ln_param_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= D) { return; }
    var dg = opaque_zero();
    var db = opaque_zero();
    for (var r = 0u; r < step[0]; r = r + 1u) {
        let d = a[r * D + i];
        dg = dg + d * aux[r * D + i];
        db = db + d;
    }
    out[step[8] + G_OFF + i] = dg;
    out[step[8] + G_OFF + D + i] = db;
}

// +0.0 the compiler cannot fold (matmul.wgsl's opaque_zero says why).
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

// The dense layers and the weight gradients are tiled in registers: one invocation computes a block
// of 4 rows x 4 columns, so each value loaded serves 4 outputs instead of 1 (lavapipe spends most of
// a step on loads). Each output is still its own sum in the CPU's order, one lane of a vec4.

// w(k, c..c+3) of dense: 4 consecutive columns of row k, or of the transposed layout.
fn dense_w4(k: u32, c: u32) -> vec4<f32> {
    let base = step[8] + W_OFF;
    if (TRANS == 1u) {
        return vec4<f32>(wts[base + c * K + k], wts[base + (c + 1u) * K + k], wts[base + (c + 2u) * K + k],
                         wts[base + (c + 3u) * K + k]);
    }
    let p = base + k * C + c;
    return vec4<f32>(wts[p], wts[p + 1u], wts[p + 2u], wts[p + 3u]);
}

// Block blk of out = bias + a W (C a multiple of 4; rows in fours): y[i] = rows r0 + i, columns c0..c0+3,
// each from the bias (or +0.0), then k ascending. Rows at or beyond step[0] are never written.
fn dense_block(blk: u32) -> array<vec4<f32>, 4> {
    let r0 = (blk / (C / 4u)) * 4u;
    let c0 = (blk % (C / 4u)) * 4u;
    var bias = vec4<f32>(opaque_zero());
    if (HAS_BIAS == 1u) {
        let b = step[8] + B_OFF + c0;
        bias = vec4<f32>(wts[b], wts[b + 1u], wts[b + 2u], wts[b + 3u]);
    }
    var y = array<vec4<f32>, 4>(bias, bias, bias, bias);
    for (var k = 0u; k < K; k = k + 1u) {
        let w = dense_w4(k, c0);
        y[0] = y[0] + vec4<f32>(a[r0 * K + k]) * w;
        y[1] = y[1] + vec4<f32>(a[(r0 + 1u) * K + k]) * w;
        y[2] = y[2] + vec4<f32>(a[(r0 + 2u) * K + k]) * w;
        y[3] = y[3] + vec4<f32>(a[(r0 + 3u) * K + k]) * w;
    }
    return y;
}

fn dense_blocks() -> u32 { return (step[0] + 3u) / 4u * (C / 4u); }

// out[r][c] = bias + sum_k a[r][k] * w(k, c), then ReLU when ACT = 1 (the
// layers, weei_dense_forward and weei_relu; the logits through E; dx = dy W^T).
@compute @workgroup_size(64)
fn dense(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= dense_blocks()) { return; }
    let y = dense_block(gid.x);
    let r0 = (gid.x / (C / 4u)) * 4u;
    let c0 = (gid.x % (C / 4u)) * 4u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (r0 + i >= step[0]) { break; }
        let v = select(y[i], select(vec4<f32>(0.0), y[i], y[i] > vec4<f32>(0.0)), ACT == 1u);
        let o = (r0 + i) * C + c0;
        out[o] = v.x;
        out[o + 1u] = v.y;
        out[o + 2u] = v.z;
        out[o + 3u] = v.w;
    }
}

// A dense layer's weight and bias gradients (weei_dense_backward's dW and db, rows ascending
// from +0.0): a = the layer's input, a2 = dy, out = the gradient vector. Blocks of 4 x 4 of dW
// (IN and OUT multiples of 4), then, when HAS_BIAS = 1, OUT / 4 blocks of 4 of db.
@compute @workgroup_size(64)
fn weight_bias_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    let rows = step[0];
    let wblocks = (IN / 4u) * (OUT / 4u);
    if (k < wblocks) {
        let i0 = (k / (OUT / 4u)) * 4u;
        let o0 = (k % (OUT / 4u)) * 4u;
        let z = vec4<f32>(opaque_zero());
        var g = array<vec4<f32>, 4>(z, z, z, z);
        for (var r = 0u; r < rows; r = r + 1u) {
            let x = r * IN + i0;
            let d = r * OUT + o0;
            let dy = vec4<f32>(a2[d], a2[d + 1u], a2[d + 2u], a2[d + 3u]);
            g[0] = g[0] + vec4<f32>(a[x]) * dy;
            g[1] = g[1] + vec4<f32>(a[x + 1u]) * dy;
            g[2] = g[2] + vec4<f32>(a[x + 2u]) * dy;
            g[3] = g[3] + vec4<f32>(a[x + 3u]) * dy;
        }
        for (var i = 0u; i < 4u; i = i + 1u) {
            let o = step[8] + W_OFF + (i0 + i) * OUT + o0;
            out[o] = g[i].x;
            out[o + 1u] = g[i].y;
            out[o + 2u] = g[i].z;
            out[o + 3u] = g[i].w;
        }
    } else if (HAS_BIAS == 1u && k < wblocks + OUT / 4u) {
        let o0 = (k - wblocks) * 4u;
        var acc = vec4<f32>(opaque_zero());
        for (var r = 0u; r < rows; r = r + 1u) {
            let d = r * OUT + o0;
            acc = acc + vec4<f32>(a2[d], a2[d + 1u], a2[d + 2u], a2[d + 3u]);
        }
        let o = step[8] + B_OFF + o0;
        out[o] = acc.x;
        out[o + 1u] = acc.y;
        out[o + 2u] = acc.z;
        out[o + 3u] = acc.w;
    }
}

// dense, then kept only where aux (the layer's ReLU output) is > 0, else +0.0.
@compute @workgroup_size(64)
fn dense_relu_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x >= dense_blocks()) { return; }
    let y = dense_block(gid.x);
    let r0 = (gid.x / (C / 4u)) * 4u;
    let c0 = (gid.x % (C / 4u)) * 4u;
    for (var i = 0u; i < 4u; i = i + 1u) {
        if (r0 + i >= step[0]) { break; }
        let o = (r0 + i) * C + c0;
        out[o] = select(0.0, y[i].x, aux[o] > 0.0);
        out[o + 1u] = select(0.0, y[i].y, aux[o + 1u] > 0.0);
        out[o + 2u] = select(0.0, y[i].z, aux[o + 2u] > 0.0);
        out[o + 3u] = select(0.0, y[i].w, aux[o + 3u] > 0.0);
    }
}

// net.c's dot over a head's HD values: 4 lanes, combined as (l0 + l1) + (l2 + l3).
fn dot_qk(x: u32, y: u32) -> f32 {
    var l = vec4<f32>(opaque_zero());
    for (var c = 0u; c < HD; c = c + 4u) {
        l = l + vec4<f32>(a[x + c], a[x + c + 1u], a[x + c + 2u], a[x + c + 3u])
            * vec4<f32>(a[y + c], a[y + c + 1u], a[y + c + 2u], a[y + c + 3u]);
    }
    return (l.x + l.y) + (l.z + l.w);
}

fn dot_ov(x: u32, y: u32) -> f32 {
    var l = vec4<f32>(opaque_zero());
    for (var c = 0u; c < HD; c = c + 4u) {
        l = l + vec4<f32>(a2[x + c], a2[x + c + 1u], a2[x + c + 2u], a2[x + c + 3u])
            * vec4<f32>(a[y + c], a[y + c + 1u], a[y + c + 2u], a[y + c + 3u]);
    }
    return (l.x + l.y) + (l.z + l.w);
}

// Causal attention of one (sequence, head, position) (a = qkv, out = att,
// out2 = probabilities [seq][head][T][T]).
@compute @workgroup_size(64)
fn attn_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * H) { return; }
    let i = k % T;
    let hh = (k / T) % H;
    let b = k / (T * H);
    let scale = bitcast<f32>(SCALE_BITS);
    let pr = ((b * H + hh) * T + i) * T;
    let q = (b * T + i) * 3u * D + hh * HD;
    var m = -3.0e38;
    for (var j = 0u; j <= i; j = j + 1u) {
        let s = dot_qk(q, (b * T + j) * 3u * D + D + hh * HD) * scale;
        out2[pr + j] = s;
        if (s > m) { m = s; }
    }
    var sum = opaque_zero();
    for (var j = 0u; j <= i; j = j + 1u) {
        let e = weei_expf(out2[pr + j] - m);
        out2[pr + j] = e;
        sum = sum + e;
    }
    let inv = 1.0 / sum;
    for (var j = 0u; j <= i; j = j + 1u) { out2[pr + j] = out2[pr + j] * inv; }
    for (var j = i + 1u; j < T; j = j + 1u) { out2[pr + j] = 0.0; }
    let o = (b * T + i) * D + hh * HD;
    for (var c = 0u; c < HD; c = c + 1u) {
        var acc = opaque_zero();
        for (var j = 0u; j <= i; j = j + 1u) {
            acc = acc + out2[pr + j] * a[(b * T + j) * 3u * D + 2u * D + hh * HD + c];
        }
        out[o + c] = acc;
    }
}

// The score gradients of one (sequence, head, position i): g_ij = p_ij (dO_i . v_j - sum_j p_ij dO_i . v_j) scale
// (a = qkv, a2 = datt, aux = probabilities, out = g [seq][head][T][T]).
@compute @workgroup_size(64)
fn attn_score_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * H) { return; }
    let i = k % T;
    let hh = (k / T) % H;
    let b = k / (T * H);
    let scale = bitcast<f32>(SCALE_BITS);
    let pr = ((b * H + hh) * T + i) * T;
    let d_o = (b * T + i) * D + hh * HD;
    // Products go through memory before they are summed or scaled: in one expression the
    // compiler may fuse or reassociate them (lavapipe did), which net.c's order forbids.
    for (var j = 0u; j <= i; j = j + 1u) {
        out[pr + j] = aux[pr + j] * dot_ov(d_o, (b * T + j) * 3u * D + 2u * D + hh * HD);
    }
    var pdp = opaque_zero();
    for (var j = 0u; j <= i; j = j + 1u) { pdp = pdp + out[pr + j]; }
    for (var j = 0u; j <= i; j = j + 1u) {
        out[pr + j] = aux[pr + j] * (dot_ov(d_o, (b * T + j) * 3u * D + 2u * D + hh * HD) - pdp);
    }
    for (var j = 0u; j <= i; j = j + 1u) { out[pr + j] = out[pr + j] * scale; }
}

// dq and dk of one (sequence, head, position t) (a = qkv, aux = score gradients, out = dqkv):
// dq_t = sum_{j <= t} g_tj k_j, dk_t = sum_{i >= t} g_it q_i, ascending from +0.0.
@compute @workgroup_size(64)
fn attn_qk_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * H) { return; }
    let t = k % T;
    let hh = (k / T) % H;
    let b = k / (T * H);
    let g = (b * H + hh) * T * T;
    let row = (b * T + t) * 3u * D + hh * HD;
    for (var c = 0u; c < HD; c = c + 1u) {
        var dq = opaque_zero();
        for (var j = 0u; j <= t; j = j + 1u) { dq = dq + aux[g + t * T + j] * a[(b * T + j) * 3u * D + D + hh * HD + c]; }
        var dk = opaque_zero();
        for (var i = t; i < T; i = i + 1u) { dk = dk + aux[g + i * T + t] * a[(b * T + i) * 3u * D + hh * HD + c]; }
        out[row + c] = dq;
        out[row + D + c] = dk;
    }
}

// dv of one (sequence, head, position t): sum_{i >= t} p_it dO_i ascending from +0.0
// (aux = probabilities, a2 = datt, out = dqkv).
@compute @workgroup_size(64)
fn attn_v_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= step[0] * H) { return; }
    let t = k % T;
    let hh = (k / T) % H;
    let b = k / (T * H);
    let p = (b * H + hh) * T * T;
    let row = (b * T + t) * 3u * D + 2u * D + hh * HD;
    for (var c = 0u; c < HD; c = c + 1u) {
        var dv = opaque_zero();
        for (var i = t; i < T; i = i + 1u) { dv = dv + aux[p + i * T + t] * a2[(b * T + i) * D + hh * HD + c]; }
        out[row + c] = dv;
    }
}

// The token and position embedding gradients, 4 consecutive elements i0..i0+3 of one row v per
// invocation (a = dx of x0, aux = the output projection's gradient [D][V], tok = tokens, out = the
// gradient vector): gE[v][i] = (+0.0 + gEt[i][v]) plus dx[r][i] for each row r of token v, rows
// ascending; gP[t][i] = sum of dx[r][i] over rows r = t mod T.
@compute @workgroup_size(64)
fn embed_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= (V + T) * (D / 4u)) { return; }
    let v = k / (D / 4u);
    let i0 = (k % (D / 4u)) * 4u;
    let rows = step[0];
    var acc = vec4<f32>(opaque_zero());
    if (v < V) {
        acc = acc + vec4<f32>(aux[i0 * V + v], aux[(i0 + 1u) * V + v], aux[(i0 + 2u) * V + v], aux[(i0 + 3u) * V + v]);
        for (var r = 0u; r < rows; r = r + 1u) {
            if (tok[r] == v) {
                let x = r * D + i0;
                acc = acc + vec4<f32>(a[x], a[x + 1u], a[x + 2u], a[x + 3u]);
            }
        }
    } else {
        for (var r = v - V; r < rows; r = r + T) {
            let x = r * D + i0;
            acc = acc + vec4<f32>(a[x], a[x + 1u], a[x + 2u], a[x + 3u]);
        }
    }
    let o = v * D + i0;
    out[o] = acc.x;
    out[o + 1u] = acc.y;
    out[o + 2u] = acc.z;
    out[o + 3u] = acc.w;
}

// A minibatch above the micro-batch, summed from its micro-batches as model_train does
// (a = the micro-batch's gradient, out = the minibatch's, cleared first): step[10] = 2 adds
// share * a (share = step[9], the float bits of c / count), 1 takes a as it is (a minibatch of
// one micro-batch: model_train's single tfm_loss), 0 (an unused slot) leaves out alone.
override N_PARAMS: u32 = 0u;

@compute @workgroup_size(64)
fn micro_sum(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= N_PARAMS) { return; }
    let mode = step[10];
    if (mode == 1u) { out[i] = a[i]; }
    if (mode == 2u) { out[i] = out[i] + bitcast<f32>(step[9]) * a[i]; }
}
