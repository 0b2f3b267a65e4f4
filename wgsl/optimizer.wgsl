// Optimizer steps over the whole weight vector, one invocation per weight,
// with the CPU's operations and order (c/sdk/weei_nn.c). Scalars come in
// the step buffer as float32 bits, computed by the model (the Adam step
// size, with its float64 bias corrections, is the WASM's work):
//   step[2] = learning rate (SGD) or bias-corrected step size (Adam),
//   step[3] = beta1, step[4] = beta2, step[5] = 1 - beta1, step[6] = 1 - beta2,
//   step[7] = epsilon.

override N: u32;

@group(0) @binding(0) var<storage, read_write> w: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> m: array<f32>;
@group(0) @binding(3) var<storage, read_write> v: array<f32>;
@group(0) @binding(4) var<storage, read> step: array<u32>;

// weei_adam_step: m = b1 m + c1 g; v = b2 v + c2 g^2; w -= s m / (sqrt(v) + eps).
@compute @workgroup_size(64)
fn adam(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= N) { return; }
    let s = bitcast<f32>(step[2]);
    let b1 = bitcast<f32>(step[3]);
    let b2 = bitcast<f32>(step[4]);
    let c1 = bitcast<f32>(step[5]);
    let c2 = bitcast<f32>(step[6]);
    let eps = bitcast<f32>(step[7]);
    let g = grad[i];
    let mi = b1 * m[i] + c1 * g;
    let vi = b2 * v[i] + c2 * (g * g);
    m[i] = mi;
    v[i] = vi;
    w[i] = w[i] - s * mi / (sqrt(vi) + eps);
}

// weei_sgd_step: w -= lr g.
@compute @workgroup_size(64)
fn sgd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= N) { return; }
    w[i] = w[i] - bitcast<f32>(step[2]) * grad[i];
}
