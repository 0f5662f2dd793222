//! The code interpreter (port 49999 of a sandbox of E2B's `code-interpreter` template, or of
//! any sandbox on e2b-local): cells and contexts; and a port's host.

use std::time::Duration;

use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use serde_json::json;

use super::Sandbox;
use crate::code::{
    CodeContext, CodeLanguage, CodeRun, CodeTarget, Execution, RemoveContextOutcome, RunCodeOptions,
};
use crate::config::CODE_INTERPRETER_PORT;
use crate::error::{Error, Operation};
use crate::http::{Ctx, Pool};
use crate::retry::Idempotency;

/// The longest silence a running cell's stream may keep: the service writes a keepalive at
/// least every 5 seconds while a cell runs.
const CELL_SILENCE: Duration = Duration::from_secs(30);

impl Sandbox {
    /// The host a port of this sandbox is reached at from outside, as the official SDK's
    /// `get_host(port)`: `<port>-<sandbox id>.<domain>`; open `https://` on it to see what
    /// the sandbox serves there (a sandbox with public traffic off wants its traffic access
    /// token in the `e2b-traffic-access-token` header).
    pub fn host(&self, port: u16) -> String {
        format!("{port}-{}.{}", self.id, self.domain)
    }

    /// Runs `code` and waits for its end: everything it printed, displayed and returned,
    /// and the error it ended with (a cell that raises is still `Ok`: its
    /// [`Execution::error`] says what happened).
    ///
    /// ```no_run
    /// # async fn run(sandbox: &e2b_client::Sandbox) -> Result<(), e2b_client::Error> {
    /// use e2b_client::RunCodeOptions;
    /// sandbox.run_code("x = 41", RunCodeOptions::default_context()).await?;
    /// let execution = sandbox.run_code("x + 1", RunCodeOptions::default_context()).await?;
    /// assert_eq!(execution.text(), Some("42"));
    /// # Ok(()) }
    /// ```
    pub async fn run_code(&self, code: &str, options: RunCodeOptions) -> Result<Execution, Error> {
        self.stream_code(code, options).await?.finish().await
    }

    /// Starts `code` and returns its output as it comes ([`CodeRun::next`]): the streamed
    /// form of [`Sandbox::run_code`], for showing output while the cell runs.
    ///
    /// ```no_run
    /// # async fn run(sandbox: &e2b_client::Sandbox) -> Result<(), e2b_client::Error> {
    /// use e2b_client::{CodeOutput, RunCodeOptions};
    /// let mut run = sandbox
    ///     .stream_code("for i in range(3): print(i)", RunCodeOptions::default_context())
    ///     .await?;
    /// while let Some(output) = run.next().await? {
    ///     if let CodeOutput::Stdout(message) = output {
    ///         print!("{}", message.text);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn stream_code(&self, code: &str, options: RunCodeOptions) -> Result<CodeRun, Error> {
        let ctx = self.ctx(Operation::RunCode);
        let (context_id, language) = match &options.target {
            CodeTarget::DefaultContext => (None, None),
            CodeTarget::Language(language) => (None, Some(language.as_str())),
            CodeTarget::Context(id) => (Some(id.as_str()), None),
        };
        let body = json!({
            "code": code,
            "context_id": context_id,
            "language": language,
            "env_vars": options.envs,
        });
        // HTTP/1.1, as the official SDK does: one connection per cell, so that dropping the
        // run closes it and the service interrupts the cell.
        let request = self.code_request(&ctx, Pool::Http1, Method::POST, "/execute", Some(body))?;
        let http = &self.http;
        let response = http
            .send(
                &ctx,
                Pool::Http1,
                request,
                Idempotency::NotIdempotent,
                http.deadline_from_now(),
            )
            .await?;
        Ok(CodeRun::new(
            ctx,
            response.bytes_stream(),
            http.limits.max_json_bytes,
            options.timeout,
            http.deadline.max(CELL_SILENCE),
            self.gone_probe(),
        ))
    }

    /// Creates a context, with its own kernel and state, in `cwd` (the service's default,
    /// `/home/user`, for `None`).
    pub async fn create_code_context(
        &self,
        language: CodeLanguage,
        cwd: Option<&str>,
    ) -> Result<CodeContext, Error> {
        let ctx = self.ctx(Operation::CreateCodeContext);
        let mut body = json!({"language": language.as_str()});
        if let Some(cwd) = cwd {
            body["cwd"] = json!(cwd);
        }
        let request =
            self.code_request(&ctx, Pool::Default, Method::POST, "/contexts", Some(body))?;
        self.code_json(&ctx, request, Idempotency::NotIdempotent)
            .await
    }

    /// The contexts, in the order they were made (the default ones included).
    pub async fn list_code_contexts(&self) -> Result<Vec<CodeContext>, Error> {
        let ctx = self.ctx(Operation::ListCodeContexts);
        let request = self.code_request(&ctx, Pool::Default, Method::GET, "/contexts", None)?;
        self.code_json(&ctx, request, Idempotency::Idempotent).await
    }

    /// Restarts a context's kernel: its state is gone, its id and directory stay.
    pub async fn restart_code_context(&self, id: &str) -> Result<(), Error> {
        let ctx = self.ctx(Operation::RestartCodeContext);
        let path = format!("/contexts/{}/restart", context_segment(&ctx, id)?);
        let request = self.code_request(&ctx, Pool::Default, Method::POST, &path, None)?;
        let http = &self.http;
        http.send(
            &ctx,
            Pool::Default,
            request,
            Idempotency::NotIdempotent,
            http.deadline_from_now(),
        )
        .await?;
        Ok(())
    }

    /// Removes a context and ends its kernel.
    pub async fn remove_code_context(&self, id: &str) -> Result<RemoveContextOutcome, Error> {
        let ctx = self.ctx(Operation::RemoveCodeContext);
        let path = format!("/contexts/{}", context_segment(&ctx, id)?);
        let request = self.code_request(&ctx, Pool::Default, Method::DELETE, &path, None)?;
        let http = &self.http;
        match http
            .send(
                &ctx,
                Pool::Default,
                request,
                Idempotency::Idempotent,
                http.deadline_from_now(),
            )
            .await
        {
            Ok(_) => Ok(RemoveContextOutcome::Removed),
            Err(error) if error.is_not_found() => Ok(RemoveContextOutcome::NotFound),
            Err(error) => Err(error),
        }
    }

    /// A request to the code interpreter: the sandbox's headers with port 49999, the envd
    /// access token and, for a sandbox with public traffic off, its traffic access token.
    fn code_request(
        &self,
        ctx: &Ctx,
        pool: Pool,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<reqwest::Request, Error> {
        let mut builder = self.request_to_port(
            ctx,
            pool,
            method,
            (&self.code_base, CODE_INTERPRETER_PORT),
            path,
        )?;
        if let Some(token) = &self.traffic_header {
            builder = builder.header("E2B-Traffic-Access-Token", token.clone());
        }
        if let Some(body) = body {
            builder = builder
                .header(CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        ctx.build(builder)
    }

    async fn code_json<T: serde::de::DeserializeOwned>(
        &self,
        ctx: &Ctx,
        request: reqwest::Request,
        idempotency: Idempotency,
    ) -> Result<T, Error> {
        let http = &self.http;
        let deadline = http.deadline_from_now();
        let response = http
            .send(ctx, Pool::Default, request, idempotency, deadline)
            .await?;
        http.read_json(ctx, response, deadline).await
    }
}

/// A context id as one path segment: refused when it could leave it.
fn context_segment<'a>(ctx: &Ctx, id: &'a str) -> Result<&'a str, Error> {
    let fits = !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if fits {
        Ok(id)
    } else {
        Err(ctx.invalid_input(
            "a code context id is letters, digits, '-' and '_' (as the service hands them out)",
        ))
    }
}
