//! The names the metrics and the CLI print (`name()`, written by hand: the
//! engine takes no strum) are the names serde writes on the wire, for
//! every variant of every enum that has one. serde's own list of variant
//! names is read from its derive, and a value of each variant is built by
//! serde too (every field zero, empty or the first variant), so a new
//! variant with a wrong or missing name fails here.

use gpux_engine::*;
use serde::de::{self, DeserializeSeed, Deserializer, EnumAccess, IntoDeserializer, MapAccess, SeqAccess, VariantAccess, Visitor};

type Error = de::value::Error;

/// Records the variant names serde's derive passes to `deserialize_enum`.
struct VariantsOf(Vec<&'static str>);

impl<'de> Deserializer<'de> for &mut VariantsOf {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("only enums"))
    }

    fn deserialize_enum<V: Visitor<'de>>(self, _: &'static str, variants: &'static [&'static str], _: V) -> Result<V::Value, Error> {
        self.0 = variants.to_vec();
        Err(de::Error::custom("recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit unit_struct
        newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// Builds the value of variant `variant` of the outer enum asked for; every
/// field inside it zero, false, empty, absent or its enum's first variant.
struct Zero {
    variant: u32,
}

impl<'de> Deserializer<'de> for Zero {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_u64(0)
    }
    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_bool(false)
    }
    fn deserialize_i64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_i64(0)
    }
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_f64(0.0)
    }
    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_str("")
    }
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_string(String::new())
    }
    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_none()
    }
    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _: &'static str, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(Zero { variant: 0 })
    }
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(0))
    }
    fn deserialize_tuple<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(len))
    }
    fn deserialize_tuple_struct<V: Visitor<'de>>(self, _: &'static str, len: usize, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(len))
    }
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_map(NoEntries)
    }
    fn deserialize_struct<V: Visitor<'de>>(self, _: &'static str, fields: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(fields.len()))
    }
    fn deserialize_enum<V: Visitor<'de>>(self, _: &'static str, _: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        visitor.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i128 u8 u16 u32 u64 u128 f32 char bytes byte_buf unit_struct identifier ignored_any
    }
}

struct Zeros(usize);

impl<'de> SeqAccess<'de> for Zeros {
    type Error = Error;
    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        if self.0 == 0 {
            return Ok(None);
        }
        self.0 -= 1;
        seed.deserialize(Zero { variant: 0 }).map(Some)
    }
}

struct NoEntries;

impl<'de> MapAccess<'de> for NoEntries {
    type Error = Error;
    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, _: K) -> Result<Option<K::Value>, Error> {
        Ok(None)
    }
    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, _: V) -> Result<V::Value, Error> {
        Err(de::Error::custom("no values"))
    }
}

impl<'de> EnumAccess<'de> for Zero {
    type Error = Error;
    type Variant = Zero;
    fn variant_seed<V: DeserializeSeed<'de>>(self, seed: V) -> Result<(V::Value, Zero), Error> {
        let index: de::value::U32Deserializer<Error> = self.variant.into_deserializer();
        Ok((seed.deserialize(index)?, Zero { variant: 0 }))
    }
}

impl<'de> VariantAccess<'de> for Zero {
    type Error = Error;
    fn unit_variant(self) -> Result<(), Error> {
        Ok(())
    }
    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, Error> {
        seed.deserialize(Zero { variant: 0 })
    }
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(len))
    }
    fn struct_variant<V: Visitor<'de>>(self, fields: &'static [&'static str], visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(Zeros(fields.len()))
    }
}

/// Every variant of `T`: its serde name against its `name()`.
fn same_names<T: serde::de::DeserializeOwned>(what: &str, name: impl Fn(&T) -> &'static str) {
    let mut recorder = VariantsOf(Vec::new());
    let _ = T::deserialize(&mut recorder);
    assert!(!recorder.0.is_empty(), "{what}: serde's names recorded");
    for (index, serde_name) in recorder.0.iter().enumerate() {
        let value = T::deserialize(Zero { variant: index as u32 }).unwrap_or_else(|e| panic!("{what}::{serde_name}: {e}"));
        assert_eq!(name(&value), *serde_name, "{what}: variant {index}");
    }
}

#[test]
fn every_printed_name_is_the_wire_name() {
    same_names::<LeaseKind>("LeaseKind", |v| v.name());
    same_names::<LeaseEndReason>("LeaseEndReason", |v| v.name());
    same_names::<OrderCloseReason>("OrderCloseReason", |v| v.name());
    same_names::<ChallengeOutcome>("ChallengeOutcome", |v| v.name());
    same_names::<EventKind>("EventKind", |v| v.name());
    same_names::<RejectCode>("RejectCode", |v| v.name());
    same_names::<Side>("Side", |v| v.name());
    same_names::<TimeInForce>("TimeInForce", |v| v.name());
    same_names::<InstrumentState>("InstrumentState", |v| v.name());
    same_names::<Vendor>("Vendor", |v| v.name());
    same_names::<Role>("Role", |v| v.name());
}

/// The test's own check: a value serde builds is the variant asked for.
#[test]
fn the_built_value_is_the_variant_asked_for() {
    let built: EventKind = EventKind::deserialize(Zero { variant: 0 }).expect("variant 0");
    let json = serde_json::to_value(built).expect("json");
    let mut recorder = VariantsOf(Vec::new());
    let _ = EventKind::deserialize(&mut recorder);
    assert!(json.get(recorder.0[0]).is_some() || json == serde_json::json!(recorder.0[0]), "{json}");
}

use serde::Deserialize;
