// The ONNX graph runtime's image operators (c/onnx/runtime.c's conv, pool and batchnorm),
// apart from onnx.wgsl because a module holds at most 32 entry points; the same conventions
// (docs/gpu.md, "Imported ONNX graphs"): every element with the runtime's operations in its
// order, a tensor named by a buffer and an element offset, gradients accumulated.

override OP: u32 = 0u;         // pools: 14 MaxPool, 15 AveragePool, 16 GlobalAveragePool
override ALPHA: f32 = 0.0;     // BatchNormalization's momentum
override A_OFF: u32 = 0u;
override B_OFF: u32 = 0u;
override O_OFF: u32 = 0u;
override HAS_BIAS: u32 = 0u;
override LEN: u32 = 1u;        // BatchNormalization: values per channel per example

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;
@group(0) @binding(4) var<storage, read> c: array<f32>;
@group(0) @binding(5) var<storage, read_write> aux: array<u32>;

// +0.0 the compiler cannot fold (matmul.wgsl's opaque_zero says why).
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

// 2-D Conv and pools over NCHW, as runtime.c's conv and pool loop (one example's CIN x HH x WW
// input, COUT x OH x OW output; kernel KH x KW, strides SH SW, pads PT PL (and PB PR, the bottom
// and right pads AveragePool's count_include_pad clips at)).
override CIN: u32 = 1u;
override HH: u32 = 1u;
override WW: u32 = 1u;
override COUT: u32 = 1u;
override OH: u32 = 1u;
override OW: u32 = 1u;
override KH: u32 = 1u;
override KW: u32 = 1u;
override SH: u32 = 1u;
override SW: u32 = 1u;
override PT: u32 = 0u;
override PL: u32 = 0u;
override PB: u32 = 0u;
override PR: u32 = 0u;
override INCL: u32 = 0u;
override BIAS_OFF: u32 = 0u;

// y[b][m][oh][ow] = bias[m] + w x over c, i, j ascending (a = x, b = weights: W at B_OFF, out = y).
@compute @workgroup_size(64)
fn conv_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * COUT * OH * OW) { return; }
    let ow = e % OW;
    let oh = (e / OW) % OH;
    let m = (e / (OW * OH)) % COUT;
    let bi = e / (OW * OH * COUT);
    var acc = opaque_zero();
    if (HAS_BIAS == 1u) { acc = b[BIAS_OFF + m]; }
    for (var c = 0u; c < CIN; c = c + 1u) {
        for (var i = 0u; i < KH; i = i + 1u) {
            let ih = i32(oh * SH + i) - i32(PT);
            if (ih < 0 || ih >= i32(HH)) { continue; }
            for (var j = 0u; j < KW; j = j + 1u) {
                let iw = i32(ow * SW + j) - i32(PL);
                if (iw < 0 || iw >= i32(WW)) { continue; }
                let w = b[B_OFF + ((m * CIN + c) * KH + i) * KW + j];
                acc = acc + w * a[A_OFF + ((bi * CIN + c) * HH + u32(ih)) * WW + u32(iw)];
            }
        }
    }
    out[e] = acc;
}

// dW[m][c][i][j] += per example, from +0.0, sum over oh, ow of dy x (the runtime's gw), the
// examples in order (a = x, c = dy, out = grad at O_OFF).
@compute @workgroup_size(64)
fn conv_weight_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= COUT * CIN * KH * KW) { return; }
    let j = e % KW;
    let i = (e / KW) % KH;
    let ch = (e / (KW * KH)) % CIN;
    let m = e / (KW * KH * CIN);
    var acc = out[O_OFF + e];
    for (var bi = 0u; bi < step[0]; bi = bi + 1u) {
        var gw = opaque_zero();
        for (var oh = 0u; oh < OH; oh = oh + 1u) {
            let ih = i32(oh * SH + i) - i32(PT);
            if (ih < 0 || ih >= i32(HH)) { continue; }
            for (var ow = 0u; ow < OW; ow = ow + 1u) {
                let iw = i32(ow * SW + j) - i32(PL);
                if (iw < 0 || iw >= i32(WW)) { continue; }
                gw = gw + c[((bi * COUT + m) * OH + oh) * OW + ow] * a[A_OFF + ((bi * CIN + ch) * HH + u32(ih)) * WW + u32(iw)];
            }
        }
        acc = acc + gw;
    }
    out[O_OFF + e] = acc;
}

// dbias[m] += dy over the examples, then the positions, in order (c = dy, out = grad at O_OFF).
@compute @workgroup_size(64)
fn conv_bias_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let m = gid.x;
    if (m >= COUT) { return; }
    var acc = out[O_OFF + m];
    for (var bi = 0u; bi < step[0]; bi = bi + 1u) {
        for (var p = 0u; p < OH * OW; p = p + 1u) { acc = acc + c[(bi * COUT + m) * OH * OW + p]; }
    }
    out[O_OFF + m] = acc;
}

// dx += dy w over the outputs that read x, in the runtime's order: m, then i, j (each (i, j)
// names at most one (oh, ow)) (b = weights: W at B_OFF, c = dy, out = gx at O_OFF).
@compute @workgroup_size(64)
fn conv_input_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * CIN * HH * WW) { return; }
    let iw = e % WW;
    let ih = (e / WW) % HH;
    let ch = (e / (WW * HH)) % CIN;
    let bi = e / (WW * HH * CIN);
    var acc = out[O_OFF + e];
    for (var m = 0u; m < COUT; m = m + 1u) {
        for (var i = 0u; i < KH; i = i + 1u) {
            let th = i32(ih + PT) - i32(i);
            if (th < 0 || u32(th) % SH != 0u || u32(th) / SH >= OH) { continue; }
            let oh = u32(th) / SH;
            for (var j = 0u; j < KW; j = j + 1u) {
                let tw = i32(iw + PL) - i32(j);
                if (tw < 0 || u32(tw) % SW != 0u || u32(tw) / SW >= OW) { continue; }
                let ow = u32(tw) / SW;
                acc = acc + c[((bi * COUT + m) * OH + oh) * OW + ow] * b[B_OFF + ((m * CIN + ch) * KH + i) * KW + j];
            }
        }
    }
    out[O_OFF + e] = acc;
}

// The window of pool output (oh, ow), clipped to the input: (ha, hb, wa, wb), and its count.
fn pool_window(oh: u32, ow: u32) -> vec4<i32> {
    let h0 = i32(oh * SH) - i32(PT);
    let w0 = i32(ow * SW) - i32(PL);
    return vec4<i32>(max(h0, 0), min(h0 + i32(KH), i32(HH)), max(w0, 0), min(w0 + i32(KW), i32(WW)));
}

fn pool_count(oh: u32, ow: u32) -> f32 {
    let h0 = i32(oh * SH) - i32(PT);
    let w0 = i32(ow * SW) - i32(PL);
    let win = pool_window(oh, ow);
    var cnt = (win.y - win.x) * (win.w - win.z);
    if (INCL == 1u) {
        cnt = (min(h0 + i32(KH), i32(HH + PB)) - h0) * (min(w0 + i32(KW), i32(WW + PR)) - w0);
    }
    return f32(max(cnt, 1));
}

// MaxPool (OP 14; aux keeps the first maximum's index, as runtime.c's aux) or AveragePool /
// GlobalAveragePool (a = x, out = y). Planes are examples x channels (CIN).
@compute @workgroup_size(64)
fn pool_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * CIN * OH * OW) { return; }
    let ow = e % OW;
    let oh = (e / OW) % OH;
    let p = e / (OW * OH);
    let win = pool_window(oh, ow);
    let xo = p * HH * WW;
    if (OP == 14u) {
        var best = bitcast<f32>(0xff7fc99eu);   // -3.4e38f
        var arg = xo + u32(win.x) * WW + u32(win.z);
        for (var h = win.x; h < win.y; h = h + 1) {
            for (var w = win.z; w < win.w; w = w + 1) {
                let k = xo + u32(h) * WW + u32(w);
                let v = a[A_OFF + k];
                if (v > best) { best = v; arg = k; }
            }
        }
        out[e] = best;
        aux[e] = arg;
        return;
    }
    var s = opaque_zero();
    for (var h = win.x; h < win.y; h = h + 1) {
        for (var w = win.z; w < win.w; w = w + 1) { s = s + a[A_OFF + xo + u32(h) * WW + u32(w)]; }
    }
    out[e] = s / pool_count(oh, ow);
}

// dx += dy (MaxPool: where x was the window's maximum; average: dy / count) over the windows
// that hold x, in output order (c = dy, out = gx at O_OFF, aux = MaxPool's maxima).
@compute @workgroup_size(64)
fn pool_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * CIN * HH * WW) { return; }
    let w = i32(e % WW);
    let h = i32((e / WW) % HH);
    let p = e / (WW * HH);
    let k = e % (HH * WW);
    var acc = out[O_OFF + e];
    for (var oh = 0u; oh < OH; oh = oh + 1u) {
        let h0 = i32(oh * SH) - i32(PT);
        if (h < h0 || h >= h0 + i32(KH)) { continue; }
        for (var ow = 0u; ow < OW; ow = ow + 1u) {
            let w0 = i32(ow * SW) - i32(PL);
            if (w < w0 || w >= w0 + i32(KW)) { continue; }
            let yi = (p * OH + oh) * OW + ow;
            if (OP == 14u) {
                if (aux[yi] == p * HH * WW + k) { acc = acc + c[yi]; }
            } else {
                acc = acc + c[yi] / pool_count(oh, ow);
            }
        }
    }
    out[O_OFF + e] = acc;
}

// BatchNormalization in training over dim 1 (COUT channels of LEN values per example), as
// runtime.c's batchnorm (its float64 sums float32 here). bn_stats, one invocation a channel:
// the batch's mean and 1 / std into aux[c], aux[COUT + c] (float bits), and the running mean
// and variance moved in the weights at B_OFF, BIAS_OFF (momentum ALPHA, epsilon EPS)
// (a = x, out = weights).
override EPS: f32 = 0.0;

@compute @workgroup_size(64)
fn bn_stats(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= COUT) { return; }
    let n = step[0];
    var s = opaque_zero();
    for (var bi = 0u; bi < n; bi = bi + 1u) {
        for (var i = 0u; i < LEN; i = i + 1u) { s = s + a[A_OFF + (bi * COUT + ch) * LEN + i]; }
    }
    let cnt = f32(n * LEN);
    let mu = s / cnt;
    var q = opaque_zero();
    for (var bi = 0u; bi < n; bi = bi + 1u) {
        for (var i = 0u; i < LEN; i = i + 1u) { let d = a[A_OFF + (bi * COUT + ch) * LEN + i] - mu; q = q + d * d; }
    }
    let v = q / cnt;
    aux[ch] = bitcast<u32>(mu);
    aux[COUT + ch] = bitcast<u32>(1.0 / sqrt(v + EPS));
    out[B_OFF + ch] = out[B_OFF + ch] * ALPHA + mu * (1.0 - ALPHA);
    out[BIAS_OFF + ch] = out[BIAS_OFF + ch] * ALPHA + v * (1.0 - ALPHA);
}

// y = x (scale istd) + (bias - mean scale istd) (a = x, b = weights: scale at S_OFF, bias at
// T_OFF; out = y).
override S_OFF: u32 = 0u;
override T_OFF: u32 = 0u;

@compute @workgroup_size(64)
fn bn_forward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * COUT * LEN) { return; }
    let ch = (e / LEN) % COUT;
    let mu = bitcast<f32>(aux[ch]);
    let istd = bitcast<f32>(aux[COUT + ch]);
    let sc = b[S_OFF + ch] * istd;
    let sh = b[T_OFF + ch] - mu * sc;
    out[e] = a[A_OFF + e] * sc + sh;
}

// The scale's and bias's gradients, one invocation a channel: sums of dy and dy xh, kept in
// aux[2 COUT + c], aux[3 COUT + c] with scale istd in aux[4 COUT + c] for bn_input_grad
// (a = x, b = weights, c = dy, out = grad).
@compute @workgroup_size(64)
fn bn_param_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let ch = gid.x;
    if (ch >= COUT) { return; }
    let mu = bitcast<f32>(aux[ch]);
    let istd = bitcast<f32>(aux[COUT + ch]);
    var sg = opaque_zero();
    var sgx = opaque_zero();
    for (var bi = 0u; bi < step[0]; bi = bi + 1u) {
        for (var i = 0u; i < LEN; i = i + 1u) {
            let k = (bi * COUT + ch) * LEN + i;
            let xh = (a[A_OFF + k] - mu) * istd;
            sg = sg + c[k];
            sgx = sgx + c[k] * xh;
        }
    }
    aux[2u * COUT + ch] = bitcast<u32>(sg);
    aux[3u * COUT + ch] = bitcast<u32>(sgx);
    aux[4u * COUT + ch] = bitcast<u32>(b[S_OFF + ch] * istd);
    out[T_OFF + ch] = out[T_OFF + ch] + sg;
    out[S_OFF + ch] = out[S_OFF + ch] + sgx;
}

// gx += scale istd (dy - mean(dy) - xh mean(dy xh)) (a = x, c = dy, out = gx).
@compute @workgroup_size(64)
fn bn_input_grad(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= step[0] * COUT * LEN) { return; }
    let ch = (e / LEN) % COUT;
    let mu = bitcast<f32>(aux[ch]);
    let istd = bitcast<f32>(aux[COUT + ch]);
    let cnt = f32(step[0] * LEN);
    let k1 = bitcast<f32>(aux[4u * COUT + ch]);
    let mg = bitcast<f32>(aux[2u * COUT + ch]) / cnt;
    let mgx = bitcast<f32>(aux[3u * COUT + ch]) / cnt;
    let xh = (a[A_OFF + e] - mu) * istd;
    out[O_OFF + e] = out[O_OFF + e] + k1 * (c[e] - mg - xh * mgx);
}

