// Reductions over the rows of a step's batch, in row order from +0.0 (the
// order of the CPU's bias gradient, weei_dense_backward's db).

override COLS: u32;
override OUT_OFF: u32 = 0u;

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read> step: array<u32>;

// +0.0 the compiler cannot fold (matmul.wgsl's opaque_zero says why).
fn opaque_zero() -> f32 { return bitcast<f32>(step[0] & 0x80000000u); }

// out[OUT_OFF + c] = sum over rows r < step[0] of a[r][c].
@compute @workgroup_size(64)
fn column_sum(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= COLS) { return; }
    let rows = step[0];
    var acc = opaque_zero();
    for (var r = 0u; r < rows; r = r + 1u) {
        acc = acc + a[r * COLS + c];
    }
    out[OUT_OFF + c] = acc;
}
