//! The workloads kedge scales in this member: what is kept of them, their pending pods and
//! the autoscalers that would fight kedge ([`facts`], [`listing`]), and the watches that keep
//! it current ([`watch`]), so that reports and restores need no read of the API server.

pub mod facts;
pub mod listing;
pub mod watch;
