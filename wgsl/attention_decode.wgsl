// Attention for a few query positions against a long KV cache, split over the keys
// (flash-decoding). Workgroup (split, kv_group, token) scores the keys of its share of tiles
// for the GQ query heads that share kv head `kv_group`, and leaves a partial result: the
// running max, the sum of exponentials and the unnormalised weighted sum of values.
// attention_combine.wgsl merges the splits.
//
// Per tile of WG keys: lane i scores key i against every query head (phase 1); lane h < GQ
// finds head h's new running max and turns its scores into probabilities (phase 2); then each
// lane accumulates (head, vec4 of head_dim) items over the tile's values (phase 3). Scores are
// double-buffered by tile parity, so two barriers per tile suffice: phase 1 of tile n + 2
// rewrites a buffer only after both barriers of tile n + 1, which every lane passes after
// finishing phase 3 of tile n. On CPU adapters every loop iteration is costly, which is why
// the max is one lane's loop rather than every lane's.
//
// Constants: WG (lanes = keys per tile), GQ (query heads per kv head), HD (head_dim),
// ITEMS (output vec4s per lane: ceil(GQ * HD / 4 / WG)).

@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> k_cache: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> v_cache: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> partial_acc: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> partial_stats: array<vec2<f32>>;

const HD4: u32 = HD / 4u;

var<workgroup> q_tile: array<vec4<f32>, GQ * HD4>;
var<workgroup> scores: array<f32, 2u * GQ * WG>;
var<workgroup> tile_max: array<f32, GQ>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let split = group.x;
    let kv_group = group.y;
    let token = group.z;
    let pos = params.start_pos + token;
    let lo = first_visible(pos, params.window);
    let tiles = (pos - lo) / WG + 1u;
    let first_tile = split * tiles / params.splits;
    let end_tile = (split + 1u) * tiles / params.splits;

    let q_base = (token * params.heads + kv_group * GQ) * HD4;
    for (var i = lane; i < GQ * HD4; i = i + WG) {
        q_tile[i] = q[q_base + i] * params.scale;
    }
    workgroupBarrier();

    let row_stride = params.kv_heads * HD4;
    let kv_offset = kv_group * HD4;
    // Lane h < GQ tracks head h's running max; each item tracks the max its sums are scaled by.
    var head_max = NEG;
    var item_max: array<f32, ITEMS>;
    for (var k = 0u; k < ITEMS; k = k + 1u) {
        item_max[k] = NEG;
    }
    var acc: array<vec4<f32>, ITEMS>;
    var sums: array<f32, ITEMS>;

    for (var tile = first_tile; tile < end_tile; tile = tile + 1u) {
        let tile_start = lo + tile * WG;
        let buffer = (tile % 2u) * GQ * WG;
        let key = tile_start + lane;
        let valid = key <= pos;
        var dots: array<f32, GQ>;
        if (valid) {
            let base = key * row_stride + kv_offset;
            for (var d4 = 0u; d4 < HD4; d4 = d4 + 1u) {
                let k4 = k_cache[base + d4];
                for (var h = 0u; h < GQ; h = h + 1u) {
                    dots[h] = dots[h] + dot(q_tile[h * HD4 + d4], k4);
                }
            }
        }
        for (var h = 0u; h < GQ; h = h + 1u) {
            scores[buffer + h * WG + lane] = select(NEG, capped(dots[h], params.softcap), valid);
        }
        workgroupBarrier();

        if (lane < GQ) {
            let first = buffer + lane * WG;
            for (var u = 0u; u < WG; u = u + 1u) {
                head_max = max(head_max, scores[first + u]);
            }
            for (var u = 0u; u < WG; u = u + 1u) {
                scores[first + u] = exp(scores[first + u] - head_max);
            }
            tile_max[lane] = head_max;
        }
        workgroupBarrier();

        let keys_in_tile = min(WG, pos + 1u - tile_start);
        for (var k = 0u; k < ITEMS; k = k + 1u) {
            let item = lane + k * WG;
            if (item < GQ * HD4) {
                let h = item / HD4;
                let d4 = item % HD4;
                let new_max = tile_max[h];
                let correction = exp(item_max[k] - new_max);
                item_max[k] = new_max;
                var weighted = acc[k] * correction;
                var total = sums[k] * correction;
                var row = tile_start * row_stride + kv_offset + d4;
                let probs = buffer + h * WG;
                for (var u = 0u; u < keys_in_tile; u = u + 1u) {
                    let p = scores[probs + u];
                    total = total + p;
                    weighted = weighted + p * v_cache[row];
                    row = row + row_stride;
                }
                acc[k] = weighted;
                sums[k] = total;
            }
        }
    }

    for (var k = 0u; k < ITEMS; k = k + 1u) {
        let item = lane + k * WG;
        if (item < GQ * HD4) {
            let h = item / HD4;
            let d4 = item % HD4;
            let slot = (token * params.heads + kv_group * GQ + h) * params.splits + split;
            partial_acc[slot * HD4 + d4] = acc[k];
            if (d4 == 0u) {
                partial_stats[slot] = vec2<f32>(item_max[k], sums[k]);
            }
        }
    }
}
