//! The team's volumes on the control plane: `POST`/`GET /volumes` and
//! `GET`/`DELETE /volumes/{volumeID}`. A volume's files are [`Volume`]'s.

use std::sync::Arc;

use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use serde::Serialize;

use super::{Client, DeleteOutcome};
use crate::error::{Error, Operation};
use crate::http::UNRESERVED;
use crate::retry::Idempotency;
use crate::volume::{Volume, VolumeAndToken, VolumeInfo};

/// E2B's pattern for volume names.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name: a volume name is not empty".to_owned());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        Some(bad) => Err(format!(
            "name: a volume name has only letters, digits, '_' and '-', not {bad:?}"
        )),
        None => Ok(()),
    }
}

#[derive(Serialize)]
struct NewVolume<'a> {
    name: &'a str,
}

impl Client {
    /// Creates a volume (`POST /volumes`) and returns it ready for file operations. A taken
    /// name is an error ([`Error::is_invalid_request`]: E2B answers 400); a name E2B's
    /// pattern refuses is refused here, before sending. Not retried once the request may
    /// have reached E2B.
    pub async fn create_volume(&self, name: &str) -> Result<Volume, Error> {
        let ctx = self.ctx(Operation::CreateVolume, None);
        check_name(name).map_err(|reason| ctx.invalid_input(reason))?;
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                "/volumes",
                Some(&NewVolume { name }),
                Idempotency::NotIdempotent,
            )
            .await?;
        let answer: VolumeAndToken = self.inner.http.read_json(&ctx, response, deadline).await?;
        self.volume_from(answer)
    }

    /// The volume with this id, with the token its files need (`GET /volumes/{id}`): the
    /// official SDK's `Volume.connect`. An unknown id is [`Error::is_not_found`].
    pub async fn connect_volume(&self, volume_id: &str) -> Result<Volume, Error> {
        let ctx = self.ctx(Operation::GetVolume, None);
        let path = format!("/volumes/{}", utf8_percent_encode(volume_id, UNRESERVED));
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        let answer: VolumeAndToken = self.inner.http.read_json(&ctx, response, deadline).await?;
        self.volume_from(answer)
    }

    /// Every volume of the team (`GET /volumes`).
    pub async fn list_volumes(&self) -> Result<Vec<VolumeInfo>, Error> {
        let ctx = self.ctx(Operation::ListVolumes, None);
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, "/volumes", None, Idempotency::Idempotent)
            .await?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Deletes a volume and its files (`DELETE /volumes/{id}`); a sandbox that mounts it
    /// loses them too. An unknown id is [`DeleteOutcome::NotFound`].
    pub async fn delete_volume(&self, volume_id: &str) -> Result<DeleteOutcome, Error> {
        let ctx = self.ctx(Operation::DeleteVolume, None);
        let path = format!("/volumes/{}", utf8_percent_encode(volume_id, UNRESERVED));
        match self
            .send_json::<()>(&ctx, Method::DELETE, &path, None, Idempotency::Idempotent)
            .await
        {
            Ok(_) => Ok(DeleteOutcome::Deleted),
            Err(error) if error.is_not_found() => Ok(DeleteOutcome::NotFound),
            Err(error) => Err(error),
        }
    }

    fn volume_from(&self, answer: VolumeAndToken) -> Result<Volume, Error> {
        let base = self
            .inner
            .config
            .volume_base_url(answer.domain.as_deref())
            .trim_end_matches('/')
            .to_owned();
        super::check_base_url("volume_api_url", &base)?;
        Volume::new(
            Arc::clone(&self.inner.http),
            base,
            answer,
            self.inner.http.api_key().clone(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_e2bs_pattern() {
        assert!(check_name("data_1-x").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a b").unwrap_err().contains("' '"));
        assert!(check_name("a/b").is_err());
    }
}
