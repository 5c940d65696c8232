// Workgroup-wide reductions through shared memory, for devices without subgroup operations.
// Every invocation of the workgroup must call these in uniform control flow. Needs `WG`.

var<workgroup> reduce_scratch: array<f32, WG>;

fn reduce_sum(value: f32, lane: u32) -> f32 {
    reduce_scratch[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            reduce_scratch[lane] = reduce_scratch[lane] + reduce_scratch[lane + stride];
        }
        workgroupBarrier();
    }
    let total = reduce_scratch[0];
    workgroupBarrier();
    return total;
}

fn reduce_max(value: f32, lane: u32) -> f32 {
    reduce_scratch[lane] = value;
    workgroupBarrier();
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        if (lane < stride) {
            reduce_scratch[lane] = max(reduce_scratch[lane], reduce_scratch[lane + stride]);
        }
        workgroupBarrier();
    }
    let total = reduce_scratch[0];
    workgroupBarrier();
    return total;
}
