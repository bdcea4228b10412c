//! What to do with a region the replicas hold differently: the rules of reconciliation and
//! scrub, with no I/O.
//!
//! Both compare one region's checksum on every in-sync replica (computed on the nodes). A copy
//! whose blocks fail their checksums (sealed stores) is known bad: it is never a source and
//! gets no vote, and it is rewritten from a good copy.
//!
//! * After a writer died with writes in flight ([`settle`]), any copy that passes its checksums
//!   is a valid outcome of those writes, so the first good one in the set's order wins and the
//!   others are made equal to it.
//! * A scrub ([`majority`]) runs while the writer is alive: two good copies that differ mean
//!   one of them went wrong silently, so only a copy a majority holds is spread; with no
//!   majority nothing is guessed.

/// One replica's answer for a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sum {
    /// The region passes its block checksums; its crc32c over the region.
    Good(u64),
    /// Some block fails its checksum.
    Bad,
}

/// What to do with the region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every copy is good and equal.
    Agree,
    /// Read the region from `source` and write it over each of `rewrite`.
    Repair { source: usize, rewrite: Vec<usize> },
    /// No copy may be spread: none is good (reconcile), or no majority (scrub).
    Unresolved,
}

/// The reconciliation rule over `sums` (replica, answer), in the set's order.
pub fn settle(sums: &[(usize, Sum)]) -> Verdict {
    let Some(want) = sums.iter().find_map(|(_, s)| match s {
        Sum::Good(c) => Some(*c),
        Sum::Bad => None,
    }) else {
        return if sums.is_empty() {
            Verdict::Agree
        } else {
            Verdict::Unresolved
        };
    };
    repair_towards(sums, want)
}

/// The scrub rule over `sums`: the value more than half of the good copies hold is spread.
pub fn majority(sums: &[(usize, Sum)]) -> Verdict {
    let good: Vec<u64> = sums
        .iter()
        .filter_map(|(_, s)| match s {
            Sum::Good(c) => Some(*c),
            Sum::Bad => None,
        })
        .collect();
    let voters = good.len();
    let all_equal = good.windows(2).all(|w| w[0] == w[1]);
    if voters == sums.len() && all_equal {
        return Verdict::Agree;
    }
    match good
        .iter()
        .copied()
        .find(|c| good.iter().filter(|g| *g == c).count() * 2 > voters)
    {
        Some(want) => repair_towards(sums, want),
        None => Verdict::Unresolved,
    }
}

/// Every copy that is bad or differs from `want` is rewritten from the first that holds it.
fn repair_towards(sums: &[(usize, Sum)], want: u64) -> Verdict {
    let source = sums
        .iter()
        .find(|(_, s)| *s == Sum::Good(want))
        .expect("some copy holds the wanted value")
        .0;
    let rewrite: Vec<usize> = sums
        .iter()
        .filter(|(_, s)| *s != Sum::Good(want))
        .map(|(i, _)| *i)
        .collect();
    if rewrite.is_empty() {
        Verdict::Agree
    } else {
        Verdict::Repair { source, rewrite }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sums() -> impl Strategy<Value = Vec<(usize, Sum)>> {
        proptest::collection::vec(
            prop_oneof![3 => (0u64..3).prop_map(Sum::Good), 1 => Just(Sum::Bad)],
            0..5,
        )
        .prop_map(|v| v.into_iter().enumerate().collect())
    }

    /// After a repair, every replica of the region holds the source's value.
    fn after(sums: &[(usize, Sum)], v: &Verdict) -> Vec<Sum> {
        match v {
            Verdict::Repair { source, rewrite } => {
                let want = sums[*source].1;
                sums.iter()
                    .map(|(i, s)| if rewrite.contains(i) { want } else { *s })
                    .collect()
            }
            _ => sums.iter().map(|s| s.1).collect(),
        }
    }

    fn check(sums: &[(usize, Sum)], v: &Verdict) -> Result<(), TestCaseError> {
        match v {
            Verdict::Agree => {
                let first = sums.first().map(|s| s.1);
                prop_assert!(sums.iter().all(|s| Some(s.1) == first && s.1 != Sum::Bad));
            }
            Verdict::Repair { source, rewrite } => {
                prop_assert!(
                    matches!(sums[*source].1, Sum::Good(_)),
                    "a bad copy was the source"
                );
                prop_assert!(!rewrite.contains(source));
                prop_assert!(!rewrite.is_empty());
                let all = after(sums, v);
                prop_assert!(
                    all.iter().all(|s| *s == sums[*source].1),
                    "copies still differ"
                );
                for (i, s) in sums {
                    if *s == Sum::Bad {
                        prop_assert!(rewrite.contains(i), "a bad copy was left bad");
                    }
                }
            }
            Verdict::Unresolved => {}
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn reconcile_spreads_a_good_copy_and_only_gives_up_when_none_is_good(s in sums()) {
            let v = settle(&s);
            check(&s, &v)?;
            let any_good = s.iter().any(|x| matches!(x.1, Sum::Good(_)));
            prop_assert_eq!(v == Verdict::Unresolved, !any_good && !s.is_empty());
        }

        #[test]
        fn scrub_spreads_only_what_a_majority_of_good_copies_holds(s in sums()) {
            let v = majority(&s);
            check(&s, &v)?;
            if let Verdict::Repair { source, .. } = &v {
                let want = s[*source].1;
                let good = s.iter().filter(|x| matches!(x.1, Sum::Good(_))).count();
                let holding = s.iter().filter(|x| x.1 == want).count();
                prop_assert!(holding * 2 > good, "spread a value without a majority");
            }
        }
    }

    #[test]
    fn two_good_copies_that_differ_are_left_alone_by_scrub_but_settled_after_a_crash() {
        let s = [(0, Sum::Good(1)), (1, Sum::Good(2))];
        assert_eq!(majority(&s), Verdict::Unresolved);
        assert_eq!(
            settle(&s),
            Verdict::Repair {
                source: 0,
                rewrite: vec![1]
            }
        );
        let s = [(0, Sum::Bad), (1, Sum::Good(2))];
        let fix = Verdict::Repair {
            source: 1,
            rewrite: vec![0],
        };
        assert_eq!(majority(&s), fix);
        assert_eq!(settle(&s), fix);
    }
}
