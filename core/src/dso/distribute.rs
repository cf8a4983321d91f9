//! Integer apportionment: largest-remainder rounding, bounded weighted distribution (KubeFed
//! RSP weights with per-member min/max) and KubeAdmiral's distribution of a change.

use std::cmp::Ordering;

/// Who gets the extra unit when two remainders are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tie {
    /// The member listed first gets it (handing out replicas).
    FirstListed,
    /// The member listed last gets it (taking replicas away, so that the first-listed
    /// member keeps more).
    LastListed,
}

/// Splits `total` in proportion to `weights` with the largest-remainder (Hamilton) method:
/// everyone gets the floor of their exact share, and the units left go to the largest
/// fractional parts, ties broken by `tie`. The result sums to `total` unless every weight
/// is zero, in which case everything is zero.
pub fn largest_remainder(total: u64, weights: &[u64], tie: Tie) -> Vec<u64> {
    let sum: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if sum == 0 {
        return vec![0; weights.len()];
    }
    let total = u128::from(total);
    let mut out = Vec::with_capacity(weights.len());
    let mut remainders = Vec::with_capacity(weights.len());
    let mut given: u128 = 0;
    for (i, &w) in weights.iter().enumerate() {
        let exact = total * u128::from(w);
        let floor = exact / sum;
        given += floor;
        out.push(u64::try_from(floor).unwrap_or(u64::MAX));
        remainders.push((exact % sum, i));
    }
    // Larger remainder first; on equal remainders the tie rule decides. Zero-weight members
    // have remainder 0 and never receive an extra unit before a positive-weight member.
    remainders.sort_by(|a, b| {
        b.0.cmp(&a.0).then_with(|| match tie {
            Tie::FirstListed => a.1.cmp(&b.1),
            Tie::LastListed => b.1.cmp(&a.1),
        })
    });
    let left = usize::try_from(total - given).unwrap_or(usize::MAX);
    for &(_, i) in remainders
        .iter()
        .filter(|(_, i)| weights[*i] > 0)
        .take(left)
    {
        out[i] += 1;
    }
    out
}

/// One member's share parameters for [`distribute`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Relative weight.
    pub weight: u64,
    /// Floor (kept while the total allows it).
    pub min: u64,
    /// Ceiling, `None` for unbounded.
    pub max: Option<u64>,
}

/// Result of [`distribute`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Distribution {
    /// Replicas per slot, in slot order.
    pub replicas: Vec<u64>,
    /// Replicas that fit nowhere because every ceiling is reached.
    pub shortfall: u64,
}

/// Exact positive rational `num / den` for breakpoint arithmetic without floating point.
#[derive(Clone, Copy, Debug)]
struct Ratio {
    num: u128,
    den: u128,
}

impl Ratio {
    fn cmp(self, other: Ratio) -> Ordering {
        (self.num * other.den).cmp(&(other.num * self.den))
    }
}

/// Distributes `total` over `slots` in proportion to the weights while keeping every slot
/// within `[min, max]`: the water level λ is found such that Σ clamp(λ·wᵢ, minᵢ, maxᵢ) =
/// total, and the unclamped slots are rounded by largest remainder. A total below the sum
/// of floors is split in proportion to the floors; a total above the sum of ceilings fills
/// every ceiling and reports the rest as shortfall. All weights zero counts as equal
/// weights, so replicas never vanish merely because the only weighted member is gone.
pub fn distribute(total: u64, slots: &[Slot]) -> Distribution {
    if slots.is_empty() {
        return Distribution {
            replicas: Vec::new(),
            shortfall: total,
        };
    }
    let slots: Vec<Slot> = slots
        .iter()
        .map(|s| Slot {
            min: s.max.map_or(s.min, |max| s.min.min(max)),
            ..*s
        })
        .collect();
    let all_zero = slots.iter().all(|s| s.weight == 0);
    let weight = |s: &Slot| if all_zero { 1 } else { s.weight };
    let sum_min: u64 = slots.iter().map(|s| s.min).sum();
    if total <= sum_min {
        let floors: Vec<u64> = slots.iter().map(|s| s.min).collect();
        return Distribution {
            replicas: largest_remainder(total, &floors, Tie::FirstListed),
            shortfall: 0,
        };
    }
    let sum_max: Option<u64> = slots.iter().map(|s| s.max).sum();
    if let Some(sum_max) = sum_max
        && total >= sum_max
    {
        return Distribution {
            replicas: slots.iter().map(|s| s.max.unwrap_or(0)).collect(),
            shortfall: total - sum_max,
        };
    }
    // Slots with zero weight sit at their floor (raising them would break proportionality);
    // the others move with λ. Breakpoints are where a slot leaves its floor or hits its
    // ceiling.
    let mut breakpoints: Vec<Ratio> = Vec::new();
    for s in &slots {
        let w = u128::from(weight(s));
        if w == 0 {
            continue;
        }
        breakpoints.push(Ratio {
            num: u128::from(s.min),
            den: w,
        });
        if let Some(max) = s.max {
            breakpoints.push(Ratio {
                num: u128::from(max),
                den: w,
            });
        }
    }
    breakpoints.sort_by(|a, b| a.cmp(*b));
    // f(b)·den compared with total·den, summing clamp(b·w, min, max).
    let reaches_total = |b: Ratio| -> bool {
        let mut acc: u128 = 0;
        for s in &slots {
            let level = b.num * u128::from(weight(s));
            let min = u128::from(s.min) * b.den;
            let value = match s.max.map(|m| u128::from(m) * b.den) {
                _ if level <= min => min,
                Some(max) if level >= max => max,
                _ => level,
            };
            acc += value;
        }
        acc >= u128::from(total) * b.den
    };
    // The sum grows with λ, so both ends are found by bisection: O(n log n) in all, which
    // matters for a DSO over thousands of members.
    let first_reaching = breakpoints.partition_point(|b| !reaches_total(*b));
    let upper = breakpoints.get(first_reaching).copied();
    let lower = match upper {
        Some(u) => {
            let below = breakpoints.partition_point(|b| b.cmp(u) == Ordering::Less);
            below.checked_sub(1).map(|i| breakpoints[i])
        }
        None => breakpoints.last().copied(),
    };
    // On (lower, upper) each weighted slot is either pinned at min, pinned at max, or free.
    let mut replicas = vec![0u64; slots.len()];
    let mut free = Vec::new();
    let mut pinned: u64 = 0;
    for (i, s) in slots.iter().enumerate() {
        let w = u128::from(weight(s));
        let leaves_floor_by_lower = w > 0
            && lower.is_some_and(|l| {
                Ratio {
                    num: u128::from(s.min),
                    den: w,
                }
                .cmp(l)
                    != Ordering::Greater
            });
        let at_floor_from_start = w > 0 && s.min == 0;
        let hits_max_by_lower = s.max.is_some_and(|max| {
            w > 0
                && lower.is_some_and(|l| {
                    Ratio {
                        num: u128::from(max),
                        den: w,
                    }
                    .cmp(l)
                        != Ordering::Greater
                })
        });
        if w == 0 || !(leaves_floor_by_lower || at_floor_from_start) {
            replicas[i] = s.min;
            pinned += s.min;
        } else if hits_max_by_lower {
            let max = s.max.unwrap_or(s.min);
            replicas[i] = max;
            pinned += max;
        } else {
            free.push(i);
        }
    }
    let rest = total.saturating_sub(pinned);
    let weights: Vec<u64> = free.iter().map(|&i| weight(&slots[i])).collect();
    for (k, share) in largest_remainder(rest, &weights, Tie::FirstListed)
        .into_iter()
        .enumerate()
    {
        replicas[free[k]] = share;
    }
    let placed: u64 = replicas.iter().sum();
    // Every weighted slot is full: zero-weight slots with room take the rest rather than
    // leaving it unplaced (weight 0 means "last resort", not "never").
    let spare: Vec<usize> = (0..slots.len())
        .filter(|&i| weight(&slots[i]) == 0 && slots[i].max.is_none_or(|m| m > replicas[i]))
        .collect();
    if placed < total && !spare.is_empty() {
        let extra_slots: Vec<Slot> = spare
            .iter()
            .map(|&i| Slot {
                weight: 1,
                min: 0,
                max: slots[i].max.map(|m| m - replicas[i]),
            })
            .collect();
        let extra = distribute(total - placed, &extra_slots);
        for (k, add) in extra.replicas.into_iter().enumerate() {
            replicas[spare[k]] += add;
        }
        return Distribution {
            replicas,
            shortfall: extra.shortfall,
        };
    }
    Distribution {
        replicas,
        shortfall: total.saturating_sub(placed),
    }
}

/// KubeAdmiral's rescaling that avoids disruption: instead of re-distributing the total, the
/// *change* is distributed, in proportion to how far each member is from its ideal share in
/// the direction of the change. On scale-out no member shrinks, on scale-in no member grows,
/// and no member overshoots its ideal. `current` and `ideal` must have equal length and
/// every `current` must lie within the bounds `ideal` was computed with.
pub fn distribute_change(current: &[u64], ideal: &[u64], total: u64) -> Vec<u64> {
    let now: u64 = current.iter().sum();
    match total.cmp(&now) {
        Ordering::Equal => current.to_vec(),
        Ordering::Greater => {
            let gaps: Vec<u64> = current
                .iter()
                .zip(ideal)
                .map(|(&c, &i)| i.saturating_sub(c))
                .collect();
            let adds = largest_remainder(total - now, &gaps, Tie::FirstListed);
            current.iter().zip(adds).map(|(c, a)| c + a).collect()
        }
        Ordering::Less => {
            let excess: Vec<u64> = current
                .iter()
                .zip(ideal)
                .map(|(&c, &i)| c.saturating_sub(i))
                .collect();
            let cuts = largest_remainder(now - total, &excess, Tie::LastListed);
            current
                .iter()
                .zip(cuts)
                .map(|(c, r)| c.saturating_sub(r))
                .collect()
        }
    }
}

/// One rebalancing step at a constant total: moves at most `budget` replicas from members
/// above their ideal share to members below it, each side in proportion to its distance,
/// never past the ideal. Returns the new counts and how many replicas moved.
pub fn rebalance_step(current: &[u64], ideal: &[u64], budget: u64) -> (Vec<u64>, u64) {
    let over: Vec<u64> = current
        .iter()
        .zip(ideal)
        .map(|(&c, &i)| c.saturating_sub(i))
        .collect();
    let under: Vec<u64> = current
        .iter()
        .zip(ideal)
        .map(|(&c, &i)| i.saturating_sub(c))
        .collect();
    let moving = over.iter().sum::<u64>().min(under.iter().sum()).min(budget);
    if moving == 0 {
        return (current.to_vec(), 0);
    }
    let cuts = largest_remainder(moving, &over, Tie::LastListed);
    let adds = largest_remainder(moving, &under, Tie::FirstListed);
    let next = current
        .iter()
        .zip(cuts.iter().zip(&adds))
        .map(|(&c, (&cut, &add))| c - cut + add)
        .collect();
    (next, moving)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(weight: u64, min: u64, max: Option<u64>) -> Slot {
        Slot { weight, min, max }
    }

    #[test]
    fn largest_remainder_examples() {
        // Reference DSO example: weights 4 and 6 over 5 replicas -> 2 and 3.
        assert_eq!(largest_remainder(5, &[4, 6], Tie::FirstListed), vec![2, 3]);
        assert_eq!(
            largest_remainder(10, &[1, 1, 1], Tie::FirstListed),
            vec![4, 3, 3]
        );
        assert_eq!(
            largest_remainder(10, &[1, 1, 1], Tie::LastListed),
            vec![3, 3, 4]
        );
        assert_eq!(largest_remainder(7, &[0, 0], Tie::FirstListed), vec![0, 0]);
        assert_eq!(
            largest_remainder(3, &[0, 1, 0], Tie::FirstListed),
            vec![0, 3, 0]
        );
        // 2:3 of 20 -> 8 and 12 exactly.
        assert_eq!(
            largest_remainder(20, &[2, 3], Tie::FirstListed),
            vec![8, 12]
        );
    }

    #[test]
    fn kubeadmiral_scale_in_example() {
        // current [15,15,0], equal weights, scale to 9: ideal [3,3,3], result [5,4,0].
        let ideal = distribute(9, &[slot(1, 0, None); 3]).replicas;
        assert_eq!(ideal, vec![3, 3, 3]);
        assert_eq!(distribute_change(&[15, 15, 0], &ideal, 9), vec![5, 4, 0]);
    }

    #[test]
    fn bounded_distribution_respects_min_and_max() {
        // Equal weights, one member capped at 2: the others absorb the rest.
        let d = distribute(
            12,
            &[slot(1, 0, Some(2)), slot(1, 0, None), slot(1, 0, None)],
        );
        assert_eq!(d.replicas, vec![2, 5, 5]);
        // A floor lifts a member above its proportional share.
        let d = distribute(10, &[slot(1, 6, None), slot(1, 0, None), slot(1, 0, None)]);
        assert_eq!(d.replicas, vec![6, 2, 2]);
        // Floor within share changes nothing.
        let d = distribute(10, &[slot(1, 5, None), slot(1, 0, None)]);
        assert_eq!(d.replicas, vec![5, 5]);
        // Total below the sum of floors: floors scaled down.
        let d = distribute(3, &[slot(1, 4, None), slot(1, 2, None)]);
        assert_eq!(d.replicas, vec![2, 1]);
        // Capacity runs out: shortfall reported.
        let d = distribute(10, &[slot(1, 0, Some(3)), slot(1, 0, Some(4))]);
        assert_eq!(
            d,
            Distribution {
                replicas: vec![3, 4],
                shortfall: 3
            }
        );
        // Zero weight stays at its floor while others share.
        let d = distribute(9, &[slot(0, 1, None), slot(1, 0, None), slot(2, 0, None)]);
        assert_eq!(d.replicas, vec![1, 3, 5]);
        // Weighted members full: the zero-weight member takes the rest.
        let d = distribute(5, &[slot(1, 0, Some(2)), slot(0, 0, None)]);
        assert_eq!(d.replicas, vec![2, 3]);
        // All weights zero: equal split.
        let d = distribute(4, &[slot(0, 0, None), slot(0, 0, None)]);
        assert_eq!(d.replicas, vec![2, 2]);
    }

    #[test]
    fn rebalance_step_is_capped() {
        // A member returns with 0 of its ideal 4: at most 3 replicas move this step.
        let (next, moved) = rebalance_step(&[6, 6, 0], &[4, 4, 4], 3);
        assert_eq!(moved, 3);
        assert_eq!(next, vec![5, 4, 3]);
        let (next, moved) = rebalance_step(&next, &[4, 4, 4], 3);
        assert_eq!((next, moved), (vec![4, 4, 4], 1));
    }
}
