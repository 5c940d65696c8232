// Workgroup-wide reductions: subgroup operations first, then one shared-memory step across
// subgroups. Every invocation of the workgroup must call these in uniform control flow.
// Needs `WG` (a power of two). Works for any subgroup size from 1 to WG. naga has no
// `subgroupElect`, so the first active lane is found with an exclusive scan.

var<workgroup> reduce_scratch: array<f32, WG>;

fn reduce_sum(value: f32, lane: u32) -> f32 {
    let partial = subgroupAdd(value);
    reduce_scratch[lane] = 0.0;
    workgroupBarrier();
    if (subgroupExclusiveAdd(1u) == 0u) {
        reduce_scratch[lane] = partial;
    }
    workgroupBarrier();
    var total = 0.0;
    for (var i = 0u; i < WG; i = i + 1u) {
        total = total + reduce_scratch[i];
    }
    workgroupBarrier();
    return total;
}

fn reduce_max(value: f32, lane: u32) -> f32 {
    let partial = subgroupMax(value);
    reduce_scratch[lane] = -3.4028234e38;
    workgroupBarrier();
    if (subgroupExclusiveAdd(1u) == 0u) {
        reduce_scratch[lane] = partial;
    }
    workgroupBarrier();
    var total = -3.4028234e38;
    for (var i = 0u; i < WG; i = i + 1u) {
        total = max(total, reduce_scratch[i]);
    }
    workgroupBarrier();
    return total;
}
