// Subgroup entry point of the matrix-vector product (appended to matvec.wgsl only in subgroup
// variants). TPR must not exceed the smallest subgroup size, so a row's threads lie in one
// subgroup and a butterfly of shuffles adds their partials without any barrier.

@compute @workgroup_size(WG)
fn matvec_subgroup(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    let row = matvec_row(group, lane);
    var total = row_partial(row, lane % TPR);
    for (var mask = TPR / 2u; mask > 0u; mask = mask / 2u) {
        total = total + subgroupShuffleXor(total, mask);
    }
    if (lane % TPR == 0u && row < params.rows) {
        out[params.first_row + row] = total;
    }
}
