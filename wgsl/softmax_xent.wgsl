// Softmax cross-entropy of a step's logits, forward and backward in one
// pass per row, with the CPU's operations (weei_softmax_xent and the
// deterministic weei_expf / weei_logf of c/sdk/weei_math.h, ported
// operation by operation; constants are the bits of the C float literals).
//
// Per row r < step[0]: dlogits[r][k] = (softmax_k - [k == label]) * scale,
// scale = bitcast<f32>(step[1]); stats[2r] = the row's loss
// (log(sum) + max - logit[label], float32), stats[2r+1] = 1.0 when the
// first maximal logit is the label, else 0.0. The model sums the losses.
//
// weighted_backward (the policy gradient, weei_softmax then the model's
// product): dlogits[r][k] = (softmax_k - [k == label]) * row_scale[r], no
// stats; label = the action taken, row_scale = its return-based weight.

override CLASSES: u32;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<u32>;
@group(0) @binding(2) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;
@group(0) @binding(4) var<storage, read_write> stats: array<f32>;
@group(0) @binding(5) var<storage, read> row_scale: array<f32>;

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

// +0.0 the compiler cannot fold (matmul.wgsl's opaque_zero says why).
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

@compute @workgroup_size(64)
fn forward_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= step[0]) { return; }
    let base = r * CLASSES;
    let y = labels[r];
    var mx = logits[base];
    var best = 0u;
    for (var k = 1u; k < CLASSES; k = k + 1u) {
        let l = logits[base + k];
        if (l > mx) { mx = l; }
        if (l > logits[base + best]) { best = k; }
    }
    var s = opaque_zero();
    for (var k = 0u; k < CLASSES; k = k + 1u) {
        s = s + weei_expf(logits[base + k] - mx);
    }
    stats[2u * r] = weei_logf(s) + mx - logits[base + y];
    stats[2u * r + 1u] = select(0.0, 1.0, best == y);
    let inv = 1.0 / s;
    let scale = bitcast<f32>(step[1]);
    for (var k = 0u; k < CLASSES; k = k + 1u) {
        let p = weei_expf(logits[base + k] - mx);
        dlogits[base + k] = (p * inv - select(0.0, 1.0, k == y)) * scale;
    }
}

@compute @workgroup_size(64)
fn weighted_backward(@builtin(global_invocation_id) gid: vec3<u32>) {
    let r = gid.x;
    if (r >= step[0]) { return; }
    let base = r * CLASSES;
    let y = labels[r];
    var mx = logits[base];
    for (var k = 1u; k < CLASSES; k = k + 1u) {
        let l = logits[base + k];
        if (l > mx) { mx = l; }
    }
    var s = opaque_zero();
    for (var k = 0u; k < CLASSES; k = k + 1u) {
        s = s + weei_expf(logits[base + k] - mx);
    }
    let inv = 1.0 / s;
    let scale = row_scale[r];
    for (var k = 0u; k < CLASSES; k = k + 1u) {
        let p = weei_expf(logits[base + k] - mx);
        dlogits[base + k] = (p * inv - select(0.0, 1.0, k == y)) * scale;
    }
}
