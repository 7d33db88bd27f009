//! Gather/scatter lists: pairing the pieces of two of them.

/// Pairs pieces of a gather list with pieces of a scatter list: calls
/// `f(src_index, src_offset, dst_index, dst_offset, len)` for each run that lies
/// in one piece of both, in order, until either list ends. Returns the bytes
/// covered (min of the two totals).
pub fn zip_pieces(src: &[u64], dst: &[u64], mut f: impl FnMut(usize, u64, usize, u64, u64) -> bool) -> u64 {
    let (mut si, mut so, mut di, mut doff, mut done) = (0usize, 0u64, 0usize, 0u64, 0u64);
    while si < src.len() && di < dst.len() {
        let n = (src[si] - so).min(dst[di] - doff);
        if n > 0 {
            if !f(si, so, di, doff, n) {
                return done;
            }
            done += n;
        }
        so += n;
        doff += n;
        if so == src[si] {
            si += 1;
            so = 0;
        }
        if doff == dst[di] {
            di += 1;
            doff = 0;
        }
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn zip_pairs_pieces() {
        let mut runs = Vec::new();
        let n = zip_pieces(&[3, 5], &[4, 1, 10], |a, b, c, d, e| {
            runs.push((a, b, c, d, e));
            true
        });
        assert_eq!(n, 8);
        assert_eq!(runs, vec![(0, 0, 0, 0, 3), (1, 0, 0, 3, 1), (1, 1, 1, 0, 1), (1, 2, 2, 0, 3)]);
        assert_eq!(zip_pieces(&[10], &[4], |_, _, _, _, _| true), 4);
        assert_eq!(zip_pieces(&[0, 2], &[0, 0, 2], |_, _, _, _, _| true), 2);
        assert_eq!(zip_pieces(&[], &[4], |_, _, _, _, _| true), 0);
    }

    proptest! {
        #[test]
        fn zip_covers_min_total_in_order(src in proptest::collection::vec(0u64..50, 0..5), dst in proptest::collection::vec(0u64..50, 0..5)) {
            let mut s_pos = 0u64;
            let mut d_pos = 0u64;
            let starts = |v: &[u64], i: usize| v[..i].iter().sum::<u64>();
            let n = zip_pieces(&src, &dst, |si, so, di, doff, len| {
                // Runs are contiguous in both flattened lists and stay inside pieces.
                assert_eq!(starts(&src, si) + so, s_pos);
                assert_eq!(starts(&dst, di) + doff, d_pos);
                assert!(so + len <= src[si] && doff + len <= dst[di]);
                s_pos += len;
                d_pos += len;
                true
            });
            prop_assert_eq!(n, src.iter().sum::<u64>().min(dst.iter().sum::<u64>()));
        }

    }
}
