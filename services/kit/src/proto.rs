//! Protobuf payloads generated from `proto/switchboard/v1/*.proto`.
#![allow(clippy::all, missing_docs)]

include!(concat!(env!("OUT_DIR"), "/switchboard.v1.rs"));
