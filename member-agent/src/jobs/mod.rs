//! The Jobs kedge runs in this member for DistributedScaledJobs: which are kedge's
//! ([`owner`]).

pub mod owner;

pub use owner::JobOwner;
