//! KEDA's external-scaler gRPC interface: the messages, the server trait the hub implements
//! ([`external_scaler_server::ExternalScaler`]) and the client kedge-sim's KEDA emulation
//! calls scalers with ([`external_scaler_client::ExternalScalerClient`]).

#![allow(
    missing_docs,
    unreachable_pub,
    missing_debug_implementations,
    clippy::all,
    clippy::pedantic
)]

tonic::include_proto!("externalscaler");
