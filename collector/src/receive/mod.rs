//! The two OTLP receivers. Both check the token and the connection's rate, decode, and call the
//! collector core; they differ only in how they say no.

pub mod grpc;
pub mod http;
