// Workgroup-wide reductions: subgroup operations first, then one shared-memory step across
// subgroups. Every invocation of the workgroup must call these in uniform control flow.
// Needs `WG` (a power of two). Works for any subgroup size from 1 to WG, and for any mapping
// of lanes to subgroups. naga has no `subgroupElect` and the subgroup builtins exist only on
// entry points, so a lane's index in its subgroup comes from an exclusive scan and the
// subgroup's size from a sum.
//
// Why the cross-subgroup step is strided: the first lane of each subgroup leaves its partial
// in reduce_scratch (zeros elsewhere); lane i of every subgroup then adds entries i, i + size,
// ... and one more subgroup sum finishes. That is WG / size shared-memory reads per lane
// rather than WG (a 128-iteration walk cost ~2 µs per reduction on an H200).

var<workgroup> reduce_scratch: array<f32, WG>;

// Leaves each subgroup's partial at its first lane's slot of reduce_scratch and `identity` in
// every other slot; returns (this lane's index in its subgroup, the subgroup's size).
fn publish_partial(partial: f32, lane: u32, identity: f32) -> vec2<u32> {
    let index = subgroupExclusiveAdd(1u);
    reduce_scratch[lane] = select(identity, partial, index == 0u);
    workgroupBarrier();
    return vec2<u32>(index, subgroupAdd(1u));
}

fn reduce_sum(value: f32, lane: u32) -> f32 {
    let at = publish_partial(subgroupAdd(value), lane, 0.0);
    var gathered = 0.0;
    for (var i = at.x; i < WG; i = i + at.y) {
        gathered = gathered + reduce_scratch[i];
    }
    workgroupBarrier();
    return subgroupAdd(gathered);
}

fn reduce_max(value: f32, lane: u32) -> f32 {
    let at = publish_partial(subgroupMax(value), lane, -3.4028234e38);
    var gathered = -3.4028234e38;
    for (var i = at.x; i < WG; i = i + at.y) {
        gathered = max(gathered, reduce_scratch[i]);
    }
    workgroupBarrier();
    return subgroupMax(gathered);
}
