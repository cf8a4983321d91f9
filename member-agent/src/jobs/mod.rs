//! The Jobs kedge runs in this member for DistributedScaledJobs: which are kedge's
//! ([`owner`]), what is kept of them and their pods ([`facts`], [`index`]) and the watches
//! that keep it current ([`watch`]).

pub mod facts;
pub mod index;
pub mod owner;
pub mod watch;

pub use index::JobIndex;
pub use owner::JobOwner;
