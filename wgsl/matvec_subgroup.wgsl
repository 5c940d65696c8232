// Subgroup entry point of the matrix-vector product (appended to matvec.wgsl only in subgroup
// variants). TPR must not exceed the smallest subgroup size, so a group's threads lie in one
// subgroup and a butterfly of shuffles adds their partials without any barrier.

@compute @workgroup_size(WG)
fn matvec_subgroup(@builtin(workgroup_id) group: vec3<u32>, @builtin(local_invocation_index) lane: u32) {
    first_token = group.x * TPW;
    first_group = all(group == vec3<u32>(0u));
    let first = first_thread_row(group, lane);
    if (REGISTER_SHARES) {
        // One vec4 of dot products and one sum of squares: two shuffles a step, no array.
        var shares = one_token_shares(first, lane);
        for (var mask = TPR / 2u; mask > 0u; mask = mask / 2u) {
            shares.dots = shares.dots + subgroupShuffleXor(shares.dots, mask);
            shares.squares = shares.squares + subgroupShuffleXor(shares.squares, mask);
        }
        if (lane % TPR == 0u) {
            write_shares(first, shares);
        }
        return;
    }
    var sums = thread_partials(first, lane);
    for (var s = 0u; s < SUMS; s = s + 1u) {
        for (var mask = TPR / 2u; mask > 0u; mask = mask / 2u) {
            sums[s] = sums[s] + subgroupShuffleXor(sums[s], mask);
        }
    }
    if (lane % TPR == 0u) {
        write_rows(first, sums);
    }
}
