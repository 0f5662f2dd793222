//! Lenient JSON pieces shared by the wire types: integers as numbers or strings, base64 bytes.

use std::fmt;
use std::marker::PhantomData;

use base64::Engine as _;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::{DecodePaddingMode, general_purpose};
use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

/// Accepts an integer as a JSON number or as a string of digits (proto3 JSON writes 64-bit
/// integers as strings; other encoders write numbers). `null` gives the type's default.
pub(crate) fn int<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i128> + Default,
{
    deserializer.deserialize_any(IntVisitor(PhantomData))
}

struct IntVisitor<T>(PhantomData<T>);

impl<T: TryFrom<i128> + Default> IntVisitor<T> {
    fn fit<E: de::Error>(value: i128) -> Result<T, E> {
        T::try_from(value).map_err(|_| E::custom(format!("integer {value} out of range")))
    }
}

impl<'de, T: TryFrom<i128> + Default> Visitor<'de> for IntVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer as a number or a string")
    }

    fn visit_u64<E: de::Error>(self, value: u64) -> Result<T, E> {
        Self::fit(i128::from(value))
    }

    fn visit_i64<E: de::Error>(self, value: i64) -> Result<T, E> {
        Self::fit(i128::from(value))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<T, E> {
        // Proto JSON allows `1.0` or `1e3` for integers; a fraction is an error.
        if value.fract() == 0.0 && value.abs() < 1e30 {
            #[allow(clippy::cast_possible_truncation)]
            Self::fit(value as i128)
        } else {
            Err(E::custom("expected an integer"))
        }
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<T, E> {
        let parsed: i128 = value
            .trim()
            .parse()
            .map_err(|_| E::custom("expected an integer string"))?;
        Self::fit(parsed)
    }

    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        Ok(T::default())
    }
}

/// Standard alphabet, padding optional (proto3 JSON readers accept both).
const STANDARD_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// URL-safe alphabet, padding optional (also valid proto3 JSON for `bytes`).
const URL_SAFE_LENIENT: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Decodes proto3 JSON `bytes`: standard or URL-safe base64, padded or not.
pub(crate) fn decode_bytes(text: &str) -> Option<Vec<u8>> {
    STANDARD_LENIENT
        .decode(text)
        .or_else(|_| URL_SAFE_LENIENT.decode(text))
        .ok()
}

/// Encodes `bytes` the canonical way (standard, padded).
pub(crate) fn encode_bytes(data: &[u8]) -> String {
    general_purpose::STANDARD.encode(data)
}

/// An RFC 3339 timestamp (`2026-01-01T00:00:00Z`).
pub(crate) fn rfc3339<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<time::OffsetDateTime, D::Error> {
    let text = String::deserialize(deserializer)?;
    time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
        .map_err(|_| de::Error::custom("expected an RFC 3339 timestamp"))
}

/// Like [`rfc3339`], for an optional field: `null` gives `None`.
pub(crate) fn opt_rfc3339<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<time::OffsetDateTime>, D::Error> {
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) => {
            time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339)
                .map(Some)
                .map_err(|_| de::Error::custom("expected an RFC 3339 timestamp"))
        }
    }
}

/// A field that may be `null`: `null` gives the type's default.
pub(crate) fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// An optional secret token; `null` and `""` both mean "no token".
pub(crate) fn opt_token<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<crate::secret::AccessToken>, D::Error> {
    Ok(Option::<String>::deserialize(deserializer)?
        .filter(|token| !token.is_empty())
        .map(crate::secret::AccessToken::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Sample {
        #[serde(default, deserialize_with = "int")]
        size: u64,
        #[serde(default, deserialize_with = "int")]
        code: i32,
        #[serde(default, deserialize_with = "int")]
        pid: u32,
    }

    #[test]
    fn integers_as_numbers_or_strings() {
        let a: Sample =
            serde_json::from_str(r#"{"size":"123","code":-1,"pid":"7"}"#).expect("strings");
        assert_eq!((a.size, a.code, a.pid), (123, -1, 7));
        let b: Sample =
            serde_json::from_str(r#"{"size":123,"code":"-1","pid":7}"#).expect("numbers");
        assert_eq!((b.size, b.code, b.pid), (123, -1, 7));
        let c: Sample = serde_json::from_str(r#"{"size":1e3,"pid":null}"#).expect("exp");
        assert_eq!((c.size, c.code, c.pid), (1000, 0, 0));
        let d: Sample = serde_json::from_str("{}").expect("defaults");
        assert_eq!((d.size, d.code, d.pid), (0, 0, 0));
    }

    #[test]
    fn out_of_range_and_garbage_are_errors() {
        assert!(serde_json::from_str::<Sample>(r#"{"size":-5}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"pid":"4294967296"}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"size":"12abc"}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"size":1.5}"#).is_err());
        assert!(serde_json::from_str::<Sample>(r#"{"size":true}"#).is_err());
    }

    #[test]
    fn timestamps_tokens_and_nulls() {
        #[derive(Debug, Deserialize)]
        struct Times {
            #[serde(deserialize_with = "rfc3339")]
            at: time::OffsetDateTime,
            #[serde(default, deserialize_with = "opt_rfc3339")]
            maybe: Option<time::OffsetDateTime>,
            #[serde(default, deserialize_with = "opt_token")]
            token: Option<crate::secret::AccessToken>,
            #[serde(default, deserialize_with = "null_default")]
            list: Vec<u8>,
        }
        let t: Times = serde_json::from_str(
            r#"{"at":"2026-01-01T00:05:00.123456789Z","maybe":null,"token":"","list":null}"#,
        )
        .expect("valid");
        assert_eq!(t.at.unix_timestamp(), 1_767_225_900);
        assert!(t.maybe.is_none() && t.token.is_none() && t.list.is_empty());
        let t: Times = serde_json::from_str(r#"{"at":"2026-01-01T01:00:00+01:00","token":"abc"}"#)
            .expect("valid");
        assert_eq!(t.at.unix_timestamp(), 1_767_225_600);
        assert_eq!(
            t.token.map(|token| token.expose().to_owned()).as_deref(),
            Some("abc")
        );
        assert!(serde_json::from_str::<Times>(r#"{"at":"yesterday"}"#).is_err());
    }

    #[test]
    fn base64_variants() {
        assert_eq!(decode_bytes("aGVsbG8K").as_deref(), Some(&b"hello\n"[..]));
        assert_eq!(decode_bytes("aGk=").as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_bytes("aGk").as_deref(), Some(&b"hi"[..]));
        assert_eq!(decode_bytes("-_8=").as_deref(), Some(&[0xfb, 0xff][..]));
        assert_eq!(decode_bytes("+/8=").as_deref(), Some(&[0xfb, 0xff][..]));
        assert_eq!(decode_bytes("").as_deref(), Some(&b""[..]));
        assert!(decode_bytes("not base64!").is_none());
        assert_eq!(encode_bytes(b"hi"), "aGk=");
    }
}
