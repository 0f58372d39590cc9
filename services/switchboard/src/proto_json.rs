//! Protobuf payloads as JSON, known only by their type name (an event's or a dead letter's
//! `Sb-Type`): decoded against the `proto/` schemas compiled into the binary, in protobuf's JSON
//! mapping with the `.proto` field names, every field shown, 64-bit integers as numbers.
use anyhow::Context as _;
use prost_reflect::{DescriptorPool, DynamicMessage, SerializeOptions};

pub struct ProtoJson {
    pool: DescriptorPool,
    options: SerializeOptions,
}

impl ProtoJson {
    pub fn new() -> anyhow::Result<Self> {
        let pool = DescriptorPool::decode(switchboard_kit::proto::FILE_DESCRIPTOR_SET)
            .context("the compiled-in protobuf schemas")?;
        let options = SerializeOptions::new()
            .use_proto_field_name(true)
            .stringify_64_bit_integers(false)
            .skip_default_fields(false);
        Ok(Self { pool, options })
    }

    /// The payload's fields, or `None` when the type is not one of ours (a newer producer's)
    /// or the payload is not one.
    pub fn decode(&self, type_name: &str, payload: &[u8]) -> Option<serde_json::Value> {
        let desc = self.pool.get_message_by_name(type_name)?;
        let message = DynamicMessage::decode(desc, payload).ok()?;
        let mut json = serde_json::Serializer::new(Vec::new());
        message
            .serialize_with_options(&mut json, &self.options)
            .ok()?;
        serde_json::from_slice(&json.into_inner()).ok()
    }
}

/// Bytes as standard base64 (what a JSON line carries of a payload it could not decode).
pub fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
