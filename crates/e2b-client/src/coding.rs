//! How a file travels through envd's `/files` beyond plain bytes: gzip content coding
//! either way (streamed, so memory stays bounded whatever the file's size) and the
//! metadata stored with it (`X-Metadata-*` headers, kept by envd as `user.e2b.*`
//! extended attributes).

use std::collections::BTreeMap;
use std::io;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt, TryStreamExt};
use reqwest::header::{HeaderName, HeaderValue};
use tokio::io::AsyncReadExt;

use crate::error::{Error, TransportStage};
use crate::http::Ctx;

/// Chunk size of a coded stream (one read buffer; the coder's window is 32 KiB more).
const CHUNK: usize = 64 * 1024;

/// The content coding of a `/files` body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ContentCoding {
    /// The bytes as they are (what every call without options sends and asks for).
    Identity,
    /// gzip: an upload is compressed as it is sent (`Content-Encoding: gzip`); a download asks
    /// for it (`Accept-Encoding: gzip`) and is decompressed as it arrives, the size cap
    /// counting decompressed bytes. Needs envd 0.5.7 or later.
    Gzip,
}

/// How a file is written: its coding on the wire and the metadata stored with it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WriteOptions {
    /// The coding of the request body.
    pub coding: ContentCoding,
    /// Stored with every file of the request (envd 0.6.2 or later), replacing what the file
    /// had. Keys are HTTP token characters (envd lowercases them), values printable ASCII;
    /// envd allows 4 KiB in all.
    pub metadata: BTreeMap<String, String>,
}

impl WriteOptions {
    /// Options with this coding and no metadata.
    pub fn new(coding: ContentCoding) -> WriteOptions {
        WriteOptions {
            coding,
            metadata: BTreeMap::new(),
        }
    }
}

/// True for an RFC 9110 token character, what a header name may hold.
fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// The `X-Metadata-<key>` headers for `metadata`, refused as the SDK refuses them.
pub(crate) fn metadata_headers(
    ctx: &Ctx,
    metadata: &BTreeMap<String, String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, Error> {
    let mut out = Vec::with_capacity(metadata.len());
    for (key, value) in metadata {
        if key.is_empty() || !key.bytes().all(is_token_char) {
            return Err(ctx.invalid_input(format!(
                "invalid metadata key {key:?}: keys are non-empty HTTP token characters"
            )));
        }
        if !value.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(ctx.invalid_input(format!(
                "invalid metadata value for key {key:?}: values are printable US-ASCII"
            )));
        }
        let name = HeaderName::from_bytes(format!("x-metadata-{key}").as_bytes())
            .map_err(|_| ctx.invalid_input(format!("invalid metadata key {key:?}")))?;
        let value = HeaderValue::from_str(value)
            .map_err(|_| ctx.invalid_input(format!("invalid metadata value for key {key:?}")))?;
        out.push((name, value));
    }
    Ok(out)
}

/// gzip of bytes in memory (the request stays replayable, so it can be retried).
pub(crate) async fn gzip_bytes(ctx: &Ctx, data: &[u8]) -> Result<Bytes, Error> {
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    async_compression::tokio::bufread::GzipEncoder::new(data)
        .read_to_end(&mut out)
        .await
        .map_err(|e| ctx.invalid_input(format!("cannot gzip the upload: {e}")))?;
    Ok(Bytes::from(out))
}

/// gzip of a stream, produced as it is read.
pub(crate) fn gzip_stream(
    data: impl Stream<Item = io::Result<Bytes>> + Send + 'static,
) -> BoxStream<'static, io::Result<Bytes>> {
    let encoder = async_compression::tokio::bufread::GzipEncoder::new(
        tokio_util::io::StreamReader::new(data),
    );
    tokio_util::io::ReaderStream::with_capacity(encoder, CHUNK).boxed()
}

/// A gzip-coded response body decompressed as it arrives: transport failures stay
/// transport errors, a body that is not gzip is a protocol error.
pub(crate) fn gunzip_body(
    ctx: Ctx,
    body: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
) -> BoxStream<'static, Result<Bytes, Error>> {
    let raw = body.map_err(io::Error::other);
    let mut decoder =
        async_compression::tokio::bufread::GzipDecoder::new(tokio_util::io::StreamReader::new(raw));
    decoder.multiple_members(true);
    tokio_util::io::ReaderStream::with_capacity(decoder, CHUNK)
        .map_err(move |error| {
            let transport = error
                .get_ref()
                .is_some_and(|inner| inner.is::<reqwest::Error>());
            if transport {
                let inner = error
                    .into_inner()
                    .and_then(|inner| inner.downcast::<reqwest::Error>().ok());
                if let Some(inner) = inner {
                    return ctx.transport(TransportStage::Body, *inner);
                }
                return ctx.protocol("the download broke off");
            }
            ctx.protocol(format!("the gzip body does not decode: {error}"))
        })
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Operation;
    use crate::http::Target;
    use crate::ids::SandboxId;
    use crate::secret::ApiKey;

    fn ctx() -> Ctx {
        Ctx::new(
            Operation::Upload,
            Target::Envd(SandboxId::parse("isbx".to_owned()).expect("valid")),
            ApiKey::new("e2b_key_for_tests_000".to_owned()),
            None,
        )
    }

    #[test]
    fn metadata_headers_follow_the_sdks_rules() {
        let ok = BTreeMap::from([("Owner".to_owned(), "alice smith".to_owned())]);
        let headers = metadata_headers(&ctx(), &ok).expect("valid");
        assert_eq!(headers[0].0.as_str(), "x-metadata-owner");
        assert_eq!(headers[0].1, "alice smith");
        for (key, value) in [
            ("", "v"),
            ("bad key", "v"),
            ("k", "caf\u{e9}"),
            ("k", "a\nb"),
        ] {
            let bad = BTreeMap::from([(key.to_owned(), value.to_owned())]);
            let error = metadata_headers(&ctx(), &bad).expect_err("refused");
            assert!(error.to_string().contains("invalid metadata"), "{error}");
        }
    }

    #[tokio::test]
    async fn gzip_round_trips_in_memory_and_streamed() {
        let data: Vec<u8> = (0..300_000u32)
            .flat_map(|i| (i % 97).to_le_bytes())
            .collect();
        let coded = gzip_bytes(&ctx(), &data).await.expect("gzip");
        assert!(coded.len() < data.len() / 4);
        let chunks = data
            .chunks(10_000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>();
        let streamed: Vec<u8> = gzip_stream(futures::stream::iter(chunks))
            .map_ok(|chunk| chunk.to_vec())
            .try_concat()
            .await
            .expect("stream");
        for coded in [coded.to_vec(), streamed] {
            let body = futures::stream::iter([Ok::<_, reqwest::Error>(Bytes::from(coded))]);
            let plain: Vec<u8> = gunzip_body(ctx(), body)
                .map_ok(|chunk| chunk.to_vec())
                .try_concat()
                .await
                .expect("decodes");
            assert_eq!(plain, data);
        }
        let garbage =
            futures::stream::iter([Ok::<_, reqwest::Error>(Bytes::from_static(b"plain"))]);
        let error = gunzip_body(ctx(), garbage)
            .map_ok(|chunk| chunk.to_vec())
            .try_concat()
            .await
            .expect_err("not gzip");
        assert!(error.to_string().contains("gzip"), "{error}");
    }
}
