//! Starting a command: lease, gates and sync first, then the start request, retried once
//! after a reconnect when the sandbox was paused behind the backend.

use e2b_client::{Sandbox, StartOptions};

use super::{Attached, Inner};
use crate::command::{RunOptions, Shell};
use crate::error::Error;

impl Inner {
    /// The lease first (so a paused sandbox is resumed and a vanished one detected before any
    /// state work), then the gates and the sync, then the lease again from the clock after
    /// the sync, then the start.
    pub(super) fn prepare_and_start(
        &self,
        attached: &mut Attached,
        command: &str,
        options: &RunOptions,
    ) -> Result<(e2b_client::ProcessStream, u32), Error> {
        self.prepare(attached, options.deadline)?;
        let start = self.start_options(command, options);
        match self.start(&attached.sandbox, start.clone()) {
            Err(error) if error.is_sandbox_gone() => {
                // Paused behind our back while the known lease still covered it: connect
                // resumes it; a sandbox that is really gone fails the connect.
                attached.lease.forget();
                self.top_up_lease(attached, options.deadline)?;
                self.start(&attached.sandbox, start)
            }
            other => other,
        }
    }

    fn start_options(&self, command: &str, options: &RunOptions) -> StartOptions {
        let mut start = match options.shell {
            Shell::Login => StartOptions::shell(command.to_owned()),
            Shell::Plain => StartOptions::exec(
                "/bin/bash".to_owned(),
                vec!["-c".to_owned(), command.to_owned()],
            ),
        };
        start.cwd = Some(
            options
                .cwd
                .clone()
                .unwrap_or_else(|| self.config.cwd.clone()),
        );
        start.envs = options.env.clone();
        start
    }

    fn start(
        &self,
        sandbox: &Sandbox,
        options: StartOptions,
    ) -> Result<(e2b_client::ProcessStream, u32), Error> {
        self.block_on(async {
            let stream = sandbox.start(options).await?;
            let pid = stream.pid();
            Ok((stream, pid))
        })
        .map_err(|source| Error::e2b("start command", Some(sandbox.id().as_str()), source))
    }
}
