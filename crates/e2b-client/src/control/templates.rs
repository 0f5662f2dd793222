//! Template builds and tags on the control plane: `POST /v3/templates`, the COPY uploads
//! (`GET /templates/{id}/files/{hash}`, then a `PUT` to the URL E2B hands out),
//! `POST /v2/templates/{id}/builds/{buildID}`, `GET …/status`, and `/templates/tags`.
//! What a template holds is [`TemplateSpec`]'s.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::utf8_percent_encode;
use reqwest::Method;
use reqwest::header::{CONTENT_LENGTH, HeaderName, HeaderValue};
use serde::Serialize;

use super::Client;
use crate::error::{BuildFailure, Error, Operation};
use crate::http::{Ctx, Pool, UNRESERVED};
use crate::retry::Idempotency;
use crate::secret::SecretValue;
use crate::template::{
    BuildCache, BuildInfo, BuildLogEntry, BuildOptions, BuildState, BuildStatus, CopyArchive,
    CopyPlan, FilesLink, RequestedBuild, TagAssignment, TemplateSpec, TemplateTag, UploadMode,
    copy_hash, write_archive,
};

/// What an upload gets at least, as the SDK gives it (large contexts take a while).
const UPLOAD_DEADLINE: Duration = Duration::from_secs(3600);

/// Log entries asked for per status call (the API's maximum, as the SDK asks).
const LOG_PAGE: u32 = 100;

/// `TemplateBuildRequestV3`; sizes only when given (2.63).
#[derive(Serialize)]
struct RequestBody<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tags: &'a [String],
    #[serde(rename = "cpuCount", skip_serializing_if = "Option::is_none")]
    cpu_count: Option<u32>,
    #[serde(rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    memory_mb: Option<u32>,
    #[serde(rename = "minFreeDiskMb", skip_serializing_if = "Option::is_none")]
    min_free_disk_mb: Option<u32>,
}

#[derive(Serialize)]
struct AssignBody<'a> {
    target: &'a str,
    tags: &'a [String],
}

#[derive(Serialize)]
struct RemoveBody<'a> {
    name: &'a str,
    tags: &'a [String],
}

/// The official SDK accepts only the status the spec lists; another 2xx is a failure.
fn expect_status(ctx: &Ctx, response: &reqwest::Response, expected: u16) -> Result<(), Error> {
    let status = response.status().as_u16();
    if status == expected {
        Ok(())
    } else {
        Err(ctx.protocol(format!("expected HTTP {expected}, got {status}")))
    }
}

fn segment(value: &str) -> String {
    utf8_percent_encode(value, UNRESERVED).to_string()
}

fn owned<I, S>(items: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    items.into_iter().map(Into::into).collect()
}

impl Client {
    /// Builds a template named `name` (`name`, `name:tag` or `namespace/name:tag`) from
    /// `spec` and waits for it: requests the build, uploads each COPY source E2B does not
    /// already hold, starts it, then asks its status every
    /// [`poll_interval`](BuildOptions::poll_interval), handing each of E2B's log entries to
    /// `on_log` in order (the rest of the log too once the build is over). A build that fails
    /// is [`Error::is_build_failed`], with E2B's reason and [`Error::build_step`]; a source
    /// that matches no file, or cannot be read, is refused before anything is sent
    /// ([`Error::is_invalid_request`]); the team's limit of concurrent builds is
    /// [`Error::is_rate_limited`].
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// use e2b_client::template::{BuildOptions, CopyOptions, ReadyCmd, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_base_image()
    ///     .with_file_context("./site")
    ///     .copy("public", "/srv/public", &CopyOptions::new())?
    ///     .set_start_cmd("python -m http.server 8000 -d /srv/public", ReadyCmd::wait_for_port(8000));
    /// let mut options = BuildOptions::new();
    /// options.tags = vec!["stable".to_owned()];
    /// let info = client
    ///     .build_template(&spec, "static-site:v1", options, |entry| {
    ///         eprintln!("{} {:?} {}", entry.timestamp, entry.level, entry.message);
    ///     })
    ///     .await?;
    /// println!("template {} build {}", info.template_id, info.build_id);
    /// # Ok(()) }
    /// ```
    pub async fn build_template<F>(
        &self,
        spec: &TemplateSpec,
        name: &str,
        options: BuildOptions,
        mut on_log: F,
    ) -> Result<BuildInfo, Error>
    where
        F: FnMut(BuildLogEntry) + Send,
    {
        let interval = options.poll_interval;
        let info = self
            .build_template_in_background(spec, name, options)
            .await?;
        tracing::info!(template = %info.name, "waiting for the template build's logs");
        self.wait_for_build(&info, interval, &mut on_log).await?;
        Ok(info)
    }

    /// [`Client::build_template`] without the wait: the build is requested, its files
    /// uploaded and it is started; follow it with [`Client::build_status`].
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// use e2b_client::template::{BuildOptions, BuildState, TemplateSpec};
    ///
    /// let spec = TemplateSpec::from_image("python:3.12").pip_install(
    ///     ["requests"],
    ///     e2b_client::template::PipScope::Global,
    /// );
    /// let info = client
    ///     .build_template_in_background(&spec, "py-requests", BuildOptions::new())
    ///     .await?;
    /// let status = client.build_status(&info, 0).await?;
    /// assert!(matches!(status.state, BuildState::Waiting | BuildState::Building | BuildState::Ready | BuildState::Error));
    /// # Ok(()) }
    /// ```
    pub async fn build_template_in_background(
        &self,
        spec: &TemplateSpec,
        name: &str,
        options: BuildOptions,
    ) -> Result<BuildInfo, Error> {
        let ctx = self.ctx(Operation::BuildTemplate, None);
        if name.trim().is_empty() {
            return Err(ctx.invalid_input("Name must be provided"));
        }
        let context = match spec.file_context() {
            Some(dir) => dir.to_path_buf(),
            None => std::env::current_dir().map_err(|error| {
                ctx.invalid_input(format!("the current directory is unknown: {error}"))
            })?,
        };
        let plans = spec.copies();
        let hashes = hash_copies(&ctx, context.clone(), plans.clone()).await?;

        let requested = self.request_build(name, &options).await?;
        tracing::info!(
            template_id = %requested.template_id,
            build_id = %requested.build_id,
            "template build requested"
        );
        let info = BuildInfo {
            template_id: requested.template_id,
            build_id: requested.build_id,
            name: name.to_owned(),
            tags: requested.tags,
        };

        for (index, plan) in &plans {
            let Some(hash) = hashes.get(*index).and_then(Option::as_deref) else {
                continue;
            };
            self.upload_copy(&info, &context, plan, hash).await?;
        }
        tracing::info!("all template file uploads completed");

        let ctx = self
            .ctx(Operation::StartBuild, None)
            .with_secrets(spec.registry_secrets());
        let path = format!(
            "/v2/templates/{}/builds/{}",
            segment(&info.template_id),
            segment(&info.build_id)
        );
        let body = spec.start_body(&hashes, options.cache == BuildCache::Skip);
        let (response, _) = self
            .send_json(
                &ctx,
                Method::POST,
                &path,
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        expect_status(&ctx, &response, 202)?;
        tracing::info!(build_id = %info.build_id, "template build started");
        Ok(info)
    }

    /// `POST /v3/templates`.
    async fn request_build(
        &self,
        name: &str,
        options: &BuildOptions,
    ) -> Result<RequestedBuild, Error> {
        let ctx = self.ctx(Operation::RequestBuild, None);
        let body = RequestBody {
            name,
            tags: &options.tags,
            cpu_count: options.cpu_count,
            memory_mb: options.memory_mb,
            min_free_disk_mb: options.min_free_disk_mb,
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                "/v3/templates",
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        expect_status(&ctx, &response, 202)?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// One COPY step's files: asks whether E2B holds them, and uploads them if not (or if
    /// the step forces it).
    async fn upload_copy(
        &self,
        info: &BuildInfo,
        context: &std::path::Path,
        plan: &CopyPlan,
        hash: &str,
    ) -> Result<(), Error> {
        let ctx = self.ctx(Operation::TemplateFiles, None);
        let path = format!(
            "/templates/{}/files/{}",
            segment(&info.template_id),
            segment(hash)
        );
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        expect_status(&ctx, &response, 201)?;
        let link: FilesLink = self.inner.http.read_json(&ctx, response, deadline).await?;
        let url = link.url.as_deref().filter(|url| !url.is_empty());
        let Some(url) = url.filter(|_| !link.present || plan.upload == UploadMode::Always) else {
            tracing::info!(src = %plan.src, "skipping the upload of a COPY source, already cached");
            return Ok(());
        };
        // The URL is signed: it is a credential, kept out of every error.
        let ctx = self
            .ctx(Operation::UploadTemplateFiles, None)
            .with_secrets(vec![SecretValue::new(url.to_owned())]);
        let (context, owned_plan) = (context.to_path_buf(), plan.clone());
        let archive = tokio::task::spawn_blocking(move || write_archive(&context, &owned_plan))
            .await
            .map_err(|error| ctx.invalid_input(format!("packing the files failed: {error}")))?
            .map_err(|reason| ctx.invalid_input(format!("COPY \"{}\": {reason}", plan.src)))?;
        self.put_archive(&ctx, url, &link.headers, archive).await?;
        tracing::info!(src = %plan.src, "uploaded a COPY source");
        Ok(())
    }

    /// The `PUT` of an archive to E2B's upload URL: no API key, the headers E2B named (its
    /// own exact `Content-Length` kept), redirects not followed, one attempt.
    async fn put_archive(
        &self,
        ctx: &Ctx,
        url: &str,
        headers: &BTreeMap<String, String>,
        archive: CopyArchive,
    ) -> Result<(), Error> {
        let url = reqwest::Url::parse(url)
            .map_err(|error| ctx.protocol(format!("the upload URL is not a URL: {error}")))?;
        let http = self
            .inner
            .http
            .with_deadline(self.inner.http.deadline.max(UPLOAD_DEADLINE));
        let mut builder = http.request(Pool::Default, Method::PUT, url)?;
        for (name, value) in headers {
            if name.eq_ignore_ascii_case("content-length") {
                continue;
            }
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| ctx.protocol(format!("E2B named an invalid upload header {name}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| ctx.protocol(format!("E2B's upload header {name} is invalid")))?;
            value.set_sensitive(true);
            builder = builder.header(header, value);
        }
        let file = tokio::fs::File::from_std(archive.file);
        let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
        let builder = builder.header(CONTENT_LENGTH, archive.len).body(body);
        let request = ctx.build(builder)?;
        let deadline = http.deadline_from_now();
        http.send(
            ctx,
            Pool::Default,
            request,
            Idempotency::NotIdempotent,
            deadline,
        )
        .await?;
        Ok(())
    }

    /// Follows a started build to its end, as the SDK's `wait_for_build_finish` does.
    async fn wait_for_build<F>(
        &self,
        info: &BuildInfo,
        interval: Duration,
        on_log: &mut F,
    ) -> Result<(), Error>
    where
        F: FnMut(BuildLogEntry) + Send,
    {
        let mut offset: u64 = 0;
        loop {
            let BuildStatus {
                state,
                log_entries,
                reason,
                ..
            } = self.build_status(info, offset).await?;
            let mut received = log_entries.len();
            offset += received as u64;
            log_entries.into_iter().for_each(&mut *on_log);
            if state.is_terminal() {
                // The rest of the log: asked until a page comes back empty.
                while received > 0 {
                    let tail = self.build_status(info, offset).await?;
                    received = tail.log_entries.len();
                    offset += received as u64;
                    tail.log_entries.into_iter().for_each(&mut *on_log);
                }
                if state == BuildState::Ready {
                    return Ok(());
                }
                let ctx = self.ctx(Operation::BuildTemplate, None);
                let (message, step) = match reason {
                    Some(reason) => (reason.message, reason.step),
                    None => ("Build failed".to_owned(), None),
                };
                return Err(Error::BuildFailed {
                    operation: Operation::BuildTemplate,
                    failure: Box::new(BuildFailure {
                        template_id: info.template_id.clone(),
                        build_id: info.build_id.clone(),
                        step,
                        message: ctx.clean(&message),
                    }),
                });
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// One status answer of a build (`GET /templates/{id}/builds/{buildID}/status`), with
    /// the log entries from `logs_offset` on (at most 100). A failed build is an answer here
    /// ([`BuildState::Error`] and its [`reason`](BuildStatus::reason)), not an error.
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// use e2b_client::template::BuildInfo;
    ///
    /// let info = BuildInfo::for_build("abcd1234efgh5678ijkl", "5b2f5a0e-1111-4222-8333-444455556666");
    /// let status = client.build_status(&info, 0).await?;
    /// for entry in &status.log_entries {
    ///     println!("{}", entry.message);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn build_status(
        &self,
        info: &BuildInfo,
        logs_offset: u64,
    ) -> Result<BuildStatus, Error> {
        let ctx = self.ctx(Operation::BuildStatus, None);
        let path = format!(
            "/templates/{}/builds/{}/status?logsOffset={logs_offset}&limit={LOG_PAGE}",
            segment(&info.template_id),
            segment(&info.build_id)
        );
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        expect_status(&ctx, &response, 200)?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Points `tags` at the build `target` names (`name[:tag]`, no tag: `default`)
    /// (`POST /templates/tags`). No tags is refused before sending; an unknown target is
    /// [`Error::is_not_found`], an invalid tag [`Error::is_invalid_request`].
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// let assigned = client.assign_template_tags("my-tpl:v1", ["production"]).await?;
    /// println!("{:?} -> build {}", assigned.tags, assigned.build_id);
    /// # Ok(()) }
    /// ```
    pub async fn assign_template_tags<I, S>(
        &self,
        target: &str,
        tags: I,
    ) -> Result<TagAssignment, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let ctx = self.ctx(Operation::AssignTemplateTags, None);
        let tags = owned(tags);
        if tags.is_empty() {
            return Err(ctx.invalid_input("At least one tag is required"));
        }
        let body = AssignBody {
            target,
            tags: &tags,
        };
        let (response, deadline) = self
            .send_json(
                &ctx,
                Method::POST,
                "/templates/tags",
                Some(&body),
                Idempotency::Idempotent,
            )
            .await?;
        expect_status(&ctx, &response, 201)?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }

    /// Removes `tags` from the template `name` (no `:tag` in it)
    /// (`DELETE /templates/tags` with a JSON body). No tags is refused before sending; E2B
    /// refuses to remove `default` ([`Error::is_invalid_request`]).
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// client.remove_template_tags("my-tpl", ["production"]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn remove_template_tags<I, S>(&self, name: &str, tags: I) -> Result<(), Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let ctx = self.ctx(Operation::RemoveTemplateTags, None);
        let tags = owned(tags);
        if tags.is_empty() {
            return Err(ctx.invalid_input("At least one tag is required"));
        }
        let body = RemoveBody { name, tags: &tags };
        let (response, _) = self
            .send_json(
                &ctx,
                Method::DELETE,
                "/templates/tags",
                Some(&body),
                Idempotency::NotIdempotent,
            )
            .await?;
        expect_status(&ctx, &response, 204)
    }

    /// The tags of a template, by id or name (`GET /templates/{id}/tags`; a `:tag` in the
    /// name is ignored). An unknown template is [`Error::is_not_found`].
    ///
    /// ```no_run
    /// # async fn demo(client: e2b_client::Client) -> Result<(), e2b_client::Error> {
    /// for tag in client.template_tags("my-tpl").await? {
    ///     println!("{} -> {} ({})", tag.tag, tag.build_id, tag.created_at);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn template_tags(&self, template: &str) -> Result<Vec<TemplateTag>, Error> {
        let ctx = self.ctx(Operation::TemplateTags, None);
        if template.is_empty() {
            return Err(ctx.invalid_input("the template name is empty"));
        }
        let path = format!("/templates/{}/tags", segment(template));
        let (response, deadline) = self
            .send_json::<()>(&ctx, Method::GET, &path, None, Idempotency::Idempotent)
            .await?;
        expect_status(&ctx, &response, 200)?;
        self.inner.http.read_json(&ctx, response, deadline).await
    }
}

/// The files hash of every COPY step, by step index, computed off the async threads.
async fn hash_copies(
    ctx: &Ctx,
    context: PathBuf,
    plans: Vec<(usize, CopyPlan)>,
) -> Result<Vec<Option<String>>, Error> {
    let Some(last) = plans.iter().map(|(index, _)| *index).max() else {
        return Ok(Vec::new());
    };
    let hashed = tokio::task::spawn_blocking(move || {
        let mut hashes = vec![None; last + 1];
        for (index, plan) in &plans {
            let hash = copy_hash(&context, plan)
                .map_err(|reason| format!("COPY \"{}\": {reason}", plan.src))?;
            hashes[*index] = Some(hash);
        }
        Ok::<_, String>(hashes)
    })
    .await
    .map_err(|error| ctx.invalid_input(format!("hashing the files failed: {error}")))?;
    hashed.map_err(|reason| ctx.invalid_input(reason))
}
