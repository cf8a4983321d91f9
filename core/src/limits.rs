//! The bounds kedge relies on, in one place: the CRD schema (`crate::crd`) carries them so
//! that the API server refuses an object beyond them, and `crate::validate` checks them
//! again for `kubectl kedge simulate` and for objects stored before a CRD upgrade.
//!
//! Every number a user writes is bounded, so that no arithmetic on it can overflow and no
//! deadline computed from it runs past what a clock can hold.

use std::time::Duration;

/// Most triggers in one DSJ, as KEDA's ScaledJob CRD allows.
pub const MAX_TRIGGERS: usize = 64;
/// Highest `memberClusters[].scheduling.priority` of a DSJ (priorities are 0..=1000).
pub const MAX_PRIORITY: i32 = 1000;

/// Longest duration in a spec (168h, 7 days). Grace periods and taints are about outages
/// that someone is paged for; a week covers any of them, and `now + duration` stays far
/// from the end of what a clock can hold.
pub const MAX_DURATION: Duration = Duration::from_secs(7 * 24 * 3600);
/// Largest replica count (a total, a member's floor or ceiling, an idle, fallback or
/// paused count). Far above any real workload, and summed over [`MAX_MEMBERS`] members it
/// still fits the `i32` counts of the status.
pub const MAX_REPLICAS: u32 = 1_000_000;
/// Largest Job count of a DSJ (`minReplicaCount`, `maxReplicaCount`, history limits,
/// workload size). The hub lists and tracks every Job it creates; ten thousand concurrent
/// Jobs per DSJ is beyond any worker fleet and keeps those lists small.
pub const MAX_JOBS: u32 = 10_000;
/// Largest `memberClusters[].weight` (DSO and DSJ). Weights are ratios, so a bound costs
/// nothing; DSJ round robin runs one pick per unit of weight in the worst case.
pub const MAX_WEIGHT: u32 = 10_000;
/// Largest DSO `memberClusters[].tier`. Tiers are an order; a thousand is more levels of
/// spill-over than there can be members to fill them.
pub const MAX_TIER: u32 = 1_000;
/// Most entries in `spec.memberClusters` (DSO and DSJ). Planning is linear or n·log n in
/// the members; a thousand clusters is beyond any fleet kedge is built for.
pub const MAX_MEMBERS: usize = 1_000;
/// Largest `pollingInterval` in seconds (ScaledObject and ScaledJob; at least 1, as KEDA
/// needs). A trigger read less often than hourly does not autoscale anything.
pub const MAX_POLLING_INTERVAL: i32 = 3_600;
/// Largest `cooldownPeriod` and `initialCooldownPeriod` in seconds: 7 days, as
/// [`MAX_DURATION`].
pub const MAX_COOLDOWN_PERIOD: u32 = 604_800;
/// Largest `fallback.failureThreshold` (at least 1, as KEDA needs): a thousand failed reads
/// in a row is already hours of polling.
pub const MAX_FAILURE_THRESHOLD: i32 = 1_000;
/// Largest `customScalingRunningJobPercentage` (at least 0): the factor of running Jobs
/// subtracted (KEDA writes a fraction, `"0.5"`); beyond 100 it can only ever mean zero Jobs.
pub const MAX_RUNNING_JOB_PERCENTAGE: f64 = 100.0;
/// Largest `customScalingQueueLengthDeduction` either way: it is subtracted from the
/// desired Jobs, so it means something only within the range of replica counts.
pub const MAX_QUEUE_LENGTH_DEDUCTION: i32 = 1_000_000;

/// Longest member name: a member name is the identity in the agent's certificate and a
/// label value in member clusters, so it is an RFC 1123 label (as `kedge_net::identity`
/// and `kubectl kedge mc setup-member` require).
pub const MEMBER_NAME_MAX_LENGTH: u32 = 63;
/// What a member name (and a namespace name) may be: an RFC 1123 label, lowercase.
pub const RFC1123_LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// Longest namespace name (an RFC 1123 label).
pub const NAMESPACE_MAX_LENGTH: u32 = 63;
/// Longest object name (`scaleTargetRef.name`): an RFC 1123 subdomain.
pub const OBJECT_NAME_MAX_LENGTH: u32 = 253;
/// What an object name may be: a lowercase RFC 1123 subdomain.
pub const RFC1123_SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";

/// Whether `name` is a member name: an RFC 1123 label of at most
/// [`MEMBER_NAME_MAX_LENGTH`] characters (the check certificates' names get too).
pub fn is_member_name(name: &str) -> bool {
    kedge_protocol::is_dns1123_label(name)
}

/// Whether `s` is a lowercase RFC 1123 subdomain of at most [`OBJECT_NAME_MAX_LENGTH`].
pub fn is_rfc1123_subdomain(s: &str) -> bool {
    s.len() <= OBJECT_NAME_MAX_LENGTH as usize && s.split('.').all(kedge_protocol::is_dns1123_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_rfc1123() {
        for ok in ["a", "m1", "member-1", &"a".repeat(63)] {
            assert!(is_member_name(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a.b", "a_b", &"a".repeat(64), "é"] {
            assert!(!is_member_name(bad), "{bad}");
        }
        assert!(is_rfc1123_subdomain("web.v1-2"));
        assert!(!is_rfc1123_subdomain("web..v1"));
        assert!(!is_rfc1123_subdomain(&"a".repeat(254)));
    }
}
