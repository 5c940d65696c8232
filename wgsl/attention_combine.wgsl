// Merges the per-split partial results of attention_decode.wgsl into the attention output:
// out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s with M the largest split max.
// Workgroup (head, token); each lane owns vec4s of head_dim and re-reads the few split
// statistics itself, so the pass needs no barrier.

@group(0) @binding(1) var<storage, read> partial_acc: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> partial_stats: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const HD4: u32 = HD / 4u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let head = group.x;
    let token = group.y;
    let first_slot = (token * params.heads + head) * params.splits;
    var best = -3.4028234e38;
    for (var s = 0u; s < params.splits; s = s + 1u) {
        best = max(best, partial_stats[first_slot + s].x);
    }
    var total = 0.0;
    for (var s = 0u; s < params.splits; s = s + 1u) {
        let stats = partial_stats[first_slot + s];
        total = total + exp(stats.x - best) * stats.y;
    }
    let inverse = 1.0 / total;
    for (var d4 = lane; d4 < HD4; d4 = d4 + WG) {
        var weighted = vec4<f32>(0.0);
        for (var s = 0u; s < params.splits; s = s + 1u) {
            let weight = exp(partial_stats[first_slot + s].x - best);
            weighted = weighted + weight * partial_acc[(first_slot + s) * HD4 + d4];
        }
        out[(token * params.heads + head) * HD4 + d4] = weighted * inverse;
    }
}
