//! The one codec: JSON text frames and bincode 2 binary frames for the same
//! messages, with a size limit on everything decoded. Decoding never panics
//! and every failure maps to an `ErrorCode` (property-tested). Binary frames
//! use the record encoding of `record.rs`.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::messages::{ClientMessage, ErrorCode, ServerMessage};

/// The largest frame the exchange accepts or sends.
pub const FRAME_BYTES_MAX: usize = 64 * 1024;

/// Bytes of JSON the items of one page (`orders`, `leases`, `statement`)
/// may take, leaving room under `FRAME_BYTES_MAX` for the message around
/// them and for the largest single item.
pub const PAGE_BYTES_MAX: usize = 48 * 1024;

/// Cuts `items` to the longest prefix whose JSON fits `PAGE_BYTES_MAX`
/// (always at least one item); returns whether it cut. A page asks for up
/// to `ORDERS_PAGE_MAX` items; big ones (a lease of 64 GPUs) fill the byte
/// budget first, and the page's continuation then starts after the last
/// item kept.
pub fn fit_page<T: Serialize>(items: &mut Vec<T>) -> bool {
    let mut bytes = 0;
    for (index, item) in items.iter().enumerate() {
        bytes += serde_json::to_vec(item).map_or(0, |json| json.len()) + 1;
        if bytes > PAGE_BYTES_MAX && index > 0 {
            items.truncate(index);
            return true;
        }
    }
    false
}

/// Levels per side in a `book_snapshot`: the best ones. A snapshot of this
/// many levels at the largest prices and quantities fits `FRAME_BYTES_MAX`
/// in either encoding.
pub const BOOK_SNAPSHOT_LEVELS_MAX: usize = 1_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    pub code: ErrorCode,
    pub message: String,
    /// The request's `id`, when a text frame that did not decode still
    /// carries one (`{"name": {"id": 7, ...}}`): the answer names it, so a
    /// client waiting on that id hears why (docs/protocol.md "Errors").
    pub id: Option<u64>,
}

fn decode_json<T: DeserializeOwned + strum::VariantNames>(text: &str) -> Result<T, DecodeError> {
    if text.len() > FRAME_BYTES_MAX {
        return Err(DecodeError { code: ErrorCode::FrameTooLarge, message: ErrorCode::FrameTooLarge.message().into(), id: None });
    }
    // Valid frames pay for one parse; only a failure is looked at again.
    serde_json::from_str(text).map_err(|error| classify::<T>(text, error))
}

/// Why a text frame did not decode, from its shape rather than from the
/// error's wording: not JSON (`malformed_json`); JSON that is not an object
/// with one key naming a message (`unknown_message`); a known message with
/// a missing field, a field of the wrong type, or a value outside a field's
/// documented set such as `"side": "up"` (`wrong_type`).
fn classify<T: strum::VariantNames>(text: &str, error: serde_json::Error) -> DecodeError {
    let message = error.to_string();
    let (code, id) = match serde_json::from_str::<serde_json::Value>(text) {
        Err(_) => (ErrorCode::MalformedJson, None),
        Ok(serde_json::Value::Object(fields)) if fields.len() == 1 => {
            let (name, body) = fields.iter().next().expect("one field");
            let id = body.get("id").and_then(serde_json::Value::as_u64);
            if T::VARIANTS.contains(&name.as_str()) {
                (ErrorCode::WrongType, id)
            } else {
                return DecodeError { code: ErrorCode::UnknownMessage, message: format!("no message is called {name:?}"), id };
            }
        }
        Ok(_) => {
            let message = "a frame is a JSON object with one key, the message's name".to_string();
            return DecodeError { code: ErrorCode::UnknownMessage, message, id: None };
        }
    };
    DecodeError { code, message, id }
}

fn decode_binary<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(DecodeError { code: ErrorCode::FrameTooLarge, message: ErrorCode::FrameTooLarge.message().into(), id: None });
    }
    crate::record::decode_limited::<T, FRAME_BYTES_MAX>(bytes, "message").map_err(|error| DecodeError {
        code: ErrorCode::MalformedBinary,
        message: error.message,
        id: None,
    })
}

fn encode_binary<T: Serialize>(message: &T) -> Vec<u8> {
    crate::record::encode_record(message)
}

fn encode_json<T: Serialize>(message: &T) -> String {
    serde_json::to_string(message).expect("every message model encodes to JSON")
}

pub fn decode_client_text(text: &str) -> Result<ClientMessage, DecodeError> {
    decode_json(text)
}

pub fn decode_client_binary(bytes: &[u8]) -> Result<ClientMessage, DecodeError> {
    decode_binary(bytes)
}

pub fn encode_client_text(message: &ClientMessage) -> String {
    encode_json(message)
}

pub fn encode_client_binary(message: &ClientMessage) -> Vec<u8> {
    encode_binary(message)
}

pub fn decode_server_text(text: &str) -> Result<ServerMessage, DecodeError> {
    decode_json(text)
}

pub fn decode_server_binary(bytes: &[u8]) -> Result<ServerMessage, DecodeError> {
    decode_binary(bytes)
}

pub fn encode_server_text(message: &ServerMessage) -> String {
    encode_json(message)
}

pub fn encode_server_binary(message: &ServerMessage) -> Vec<u8> {
    encode_binary(message)
}

/// One `market_data` frame (JSON) of messages each already encoded as JSON
/// (`encode_server_text`), without decoding them again: what the gateway
/// sends a version-2 subscriber, whose updates are encoded once for all.
/// The same text as `encode_server_text` of `ServerMessage::MarketData`.
pub fn market_data_text<'a>(encoded: impl IntoIterator<Item = &'a str>) -> String {
    let mut text = String::from(r#"{"market_data":{"messages":["#);
    for (index, message) in encoded.into_iter().enumerate() {
        if index > 0 {
            text.push(',');
        }
        text.push_str(message);
    }
    text.push_str("]}}");
    text
}

/// The bincode twin of `market_data_text`: the same bytes as
/// `encode_server_binary` of `ServerMessage::MarketData` of the messages.
pub fn market_data_binary(encoded: &[&[u8]]) -> Vec<u8> {
    // The variant's index, then the vector's length, then its elements.
    let empty = encode_server_binary(&ServerMessage::MarketData { messages: Vec::new() });
    let (variant, _zero_length) = empty.split_at(empty.len() - 1);
    let length = encode_binary(&(encoded.len() as u64));
    let mut bytes = Vec::with_capacity(variant.len() + length.len() + encoded.iter().map(|e| e.len()).sum::<usize>());
    bytes.extend_from_slice(variant);
    bytes.extend_from_slice(&length);
    for message in encoded {
        bytes.extend_from_slice(message);
    }
    bytes
}
